"""Serve time: a package behind Ray Serve (server.py), a model repository (repository.py), the KServe v2 HTTP and
gRPC protocols (v2.py, grpc_endpoint.py) and the simple JSON form (json_form.py). It loads packages through the
runtime; the runtime never imports it. Users import `jit2triton.serving`."""
