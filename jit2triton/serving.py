"""Serve a package with Ray Serve (`pip install "jit2triton[serve]"`): replicas, dynamic batching, the KServe v2 /
Triton Inference Server HTTP protocol, a simple JSON form, Prometheus metrics and a Python handle.

    from ray import serve
    from jit2triton.serving import app

    serve.run(app("model.j2t", num_replicas=2, max_batch_size=32), route_prefix="/")

`jit2triton serve DIR` serves a model repository (deploy/serving/repository.py): each package at /v2/models/NAME.

The deployment itself lives in the deployment stage (deploy/serving/server.py); this is the name users import.
"""
from jit2triton.deploy.serving.server import (  # noqa: F401
    DEFAULT_MAX_BODY_BYTES,
    Batching,
    ModelServer,
    app,
    default_model_name,
    plan_batching,
)
from jit2triton.deploy.serving.local_ray import start_local, stop_local, stop_signals  # noqa: F401
from jit2triton.deploy.serving.repository import (  # noqa: F401
    Model,
    RepositoryServer,
    deploy_repository,
    repository_models,
)

__all__ = ["app", "start_local", "stop_local", "ModelServer", "plan_batching", "Batching", "DEFAULT_MAX_BODY_BYTES",
           "default_model_name", "Model", "RepositoryServer", "repository_models", "deploy_repository",
           "stop_signals"]
