"""A model repository served with Ray Serve: each package an application of its own at /v2/models/NAME (its
replicas, batching and statistics its own), and one more at / that answers for the repository, as the KServe v2 /
Triton Inference Server protocol does:

- GET /v2, /v2/health/live, /v2/health/ready; GET /v2/models/stats (every loaded model's statistics);
- POST /v2/repository/index (each model, READY, LOADING or UNAVAILABLE with the reason), POST
  /v2/repository/models/NAME/load and /unload (the model repository extension: a load reads the package again);
- GET /metrics (Prometheus, every model's); GET / (the models, or the only model's signature) and POST / (the
  simple JSON form, when one model is loaded).
A request for /v2/models/NAME of a model that is not loaded reaches this server: 404 with the models it has.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from typing import Any, Optional

from .server import (ENDPOINTS, MODEL_PATH, _ray_serve, _replica_grpc_on_loopback, app, default_model_name,
                      jit2triton_version)
from .stats import as_triton, board

log = logging.getLogger("jit2triton.serving")
EXTENSIONS = ["binary_tensor_data", "model_repository", "model_configuration", "statistics"]
REPOSITORY_APP = "jit2triton-repository"  # the repository's own application, beside one per model
RESERVED_NAMES = ("stats", REPOSITORY_APP)  # /v2/models/stats is the statistics of every model


@dataclasses.dataclass(frozen=True)
class Model:
    """A package of the repository and how its application is deployed (app()'s keyword arguments)."""
    name: str
    package: str
    options: dict

    def application(self) -> Any:
        return app(self.package, model_name=self.name, mount=model_route(self.name), **self.options)


def model_route(name: str) -> str:
    return f"/v2/models/{name}"


def repository_models(paths: list[str], options: dict) -> list[Model]:
    """The models of packages and folders of packages (each folder's *.j2t files), named by file name; a clash of
    names or a reserved name is a ValueError that says which files."""
    packages = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".j2t"))
            if not found:
                raise ValueError(f"{path} holds no .j2t package")
            packages += found
        else:
            packages.append(path)
    models: dict[str, Model] = {}
    for package in packages:
        name = default_model_name(package)
        if name in RESERVED_NAMES:
            raise ValueError(f"{package}: a model may not be named {name!r} (the server's own name for "
                             f"{'the statistics of every model' if name == 'stats' else 'the repository'}); rename "
                             "the file")
        if name in models and models[name].package == os.path.abspath(package):
            continue  # named twice (alone and in its folder): served once
        if name in models:
            raise ValueError(f"two packages would be served as model {name!r}: {models[name].package} and "
                             f"{package}; rename one")
        models[name] = Model(name, os.path.abspath(package), options)
    return list(models.values())


class RepositoryServer:
    """The repository's own HTTP endpoints (one replica): the models' states from Serve's controller, loads and
    unloads through it, and their statistics and descriptions through their applications' handles."""

    def __init__(self, models: list[Model], route: str = "/") -> None:
        from starlette.responses import Response  # a dependency of Ray Serve

        _replica_grpc_on_loopback()
        self.models = {m.name: m for m in models}
        self._response, self.route = Response, route
        self._changing: dict[str, str] = {}  # model -> "LOADING" or "UNLOADING" while its change runs
        from .metrics import NodeExport
        self._export = NodeExport()

    async def __call__(self, http) -> Any:
        path, method = http.url.path.rstrip("/"), http.method
        try:
            if method in ("GET", "HEAD"):
                return await self._get(path)
            if method == "POST":
                return await self._post(path, http)
        except _Refused as refusal:
            return self._json(refusal.status, {"error": refusal.message})
        return self._json(405, {"error": f"{method} is not served here; this server answers {ENDPOINTS}"})

    async def _get(self, path: str) -> Any:
        if path in ("/v2/health/live", "/v2/health/ready"):
            return self._response(status_code=200)
        if path == "/v2":
            return self._json(200, {"name": "jit2triton", "version": jit2triton_version(), "extensions": EXTENSIONS})
        if path == "/v2/models/stats":
            return self._json(200, {"model_stats": await self.statistics()})
        if path == "/metrics":
            try:
                text = await asyncio.get_running_loop().run_in_executor(None, self._export.text)
            except OSError as err:
                return self._json(503, {"error": f"Ray's metrics export of this node did not answer ({err})"})
            return self._response(text, status_code=200, media_type="text/plain; version=0.0.4; charset=utf-8")
        if path == "":
            ready = await self._ready()
            if len(ready) == 1:
                return self._json(200, await self._handle(ready[0]).describe.remote())
            states = await self._states()
            return self._json(200, {"models": {n: s[0] for n, s in states.items()}, "endpoints": ENDPOINTS})
        await self._not_served(path)
        return self._json(404, {"error": f"nothing is served at GET {path}; this server answers {ENDPOINTS}"})

    async def _post(self, path: str, http) -> Any:
        if path == "/v2/repository/index":
            return self._json(200, await self.index())
        parts = path.split("/")
        if len(parts) == 6 and parts[:4] == ["", "v2", "repository", "models"] and parts[5] in ("load", "unload"):
            await self._change(parts[4], parts[5])
            return self._json(200, {})
        if path == "":
            ready = await self._ready()
            if len(ready) != 1:
                raise _Refused(400, f"this server serves {len(ready)} models ({', '.join(ready) or 'none loaded'}): "
                                    "POST the simple JSON form to /v2/models/NAME")
            status, body = await self._handle(ready[0]).json_request.remote(await http.body())
            return self._response(body, status_code=status, media_type="application/json")
        await self._not_served(path)
        return self._json(404, {"error": f"nothing is served at POST {path}; this server answers {ENDPOINTS}"})

    async def _not_served(self, path: str) -> None:
        """A model path that reached this server: the model is unknown, or known but not loaded."""
        model = MODEL_PATH.fullmatch(path)
        if not model:
            return
        state, message = await self.refusal(model["name"], f"POST /v2/repository/models/{model['name']}/load")
        raise _Refused(404 if state in ("UNKNOWN", "UNAVAILABLE") else 503, message)

    # ---- also called through the app's handle, by the gRPC endpoint (grpc_endpoint.py) ----

    async def index(self) -> list[dict]:
        """The repository index: each model, its state (READY, LOADING or UNAVAILABLE) and the reason."""
        return [{"name": n, "version": "1", "state": s[0], "reason": s[1]} for n, s in (await self._states()).items()]

    async def statistics(self) -> list[dict]:
        """The statistics of every loaded model, in Triton's schema."""
        return await self._statistics(await self._ready())

    async def refusal(self, name: str, load: str) -> tuple[str, str]:
        """Why model `name` is not served: ("UNKNOWN", ...) or its state and reason, in one line that says how to
        load it (`load`: the request that does, in the client's protocol)."""
        if name not in self.models:
            return "UNKNOWN", f"unknown model {name!r}; this server serves {', '.join(map(repr, self.models))}"
        state, reason = (await self._states())[name]
        return state, f"model {name!r} is {state.lower()}{f' ({reason})' if reason else ''}; {load} loads it"

    async def change(self, name: str, action: str) -> tuple[int, str]:
        """Loads or unloads model `name`: (200, "") or the HTTP status and message of the refusal."""
        try:
            await self._change(name, action)
        except _Refused as refusal:
            return refusal.status, refusal.message
        return 200, ""

    async def _change(self, name: str, action: str) -> None:
        if name not in self.models:
            raise _Refused(404, f"unknown model {name!r}; the repository has {', '.join(map(repr, self.models))}")
        if name in self._changing:
            raise _Refused(409, f"model {name!r} is {self._changing[name].lower()} already; wait for it")
        self._changing[name] = "LOADING" if action == "load" else "UNLOADING"
        serve = _ray_serve()
        try:
            if action == "load":
                await self._run(serve.run, self.models[name].application(), name=name, route_prefix=model_route(name))
            else:
                await self._run(serve.delete, name)
                await board().forget.remote(name)
        except Exception as err:  # noqa: BLE001 — a replica that could not load the package: said in one line
            reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise _Refused(400, f"model {name!r} did not {action}: {reason}") from None
        finally:
            del self._changing[name]

    async def _states(self) -> dict[str, tuple[str, str]]:
        """Each model's (state, reason), from Serve's controller."""
        serve = _ray_serve()
        applications = (await self._run(serve.status)).applications
        states = {}
        for name in self.models:
            status = applications.get(name)
            text = str(getattr(status, "status", "")).rsplit(".", 1)[-1]
            if name in self._changing:
                states[name] = (self._changing[name].replace("UNLOADING", "UNAVAILABLE"), "")
            elif status is None:
                states[name] = ("UNAVAILABLE", "unloaded")
            elif text == "RUNNING":
                states[name] = ("READY", "")
            elif text in ("DEPLOYING", "NOT_STARTED"):
                states[name] = ("LOADING", "")
            else:
                states[name] = ("UNAVAILABLE", (status.message or text).strip().splitlines()[0] if (
                    status.message or text) else "")
        return states

    async def _ready(self) -> list[str]:
        return [name for name, state in (await self._states()).items() if state[0] == "READY"]

    async def _statistics(self, names: list[str]) -> list[dict]:
        answers = await asyncio.gather(*(self._handle(n).model_statistics.remote() for n in names),
                                       return_exceptions=True)
        return [a if isinstance(a, dict) else as_triton(n, "1", _no_statistics()) for n, a in zip(names, answers)]

    def _handle(self, name: str) -> Any:
        return _ray_serve().get_app_handle(name)

    @staticmethod
    async def _run(fn, *args: Any, **kwargs: Any) -> Any:
        """Serve's blocking client calls, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))

    def _json(self, status: int, doc: Any) -> Any:
        return self._response(json.dumps(doc), status_code=status, media_type="application/json")


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _no_statistics() -> dict:
    from .stats import ModelStatistics
    return ModelStatistics().snapshot()


def repository_app(models: list[Model], logging_config: Optional[dict] = None) -> Any:
    """The repository's own application, deployed at route "/" beside the models' ones."""
    serve = _ray_serve()
    deployment = serve.deployment(RepositoryServer, name="repository").options(
        num_replicas=1, ray_actor_options={"num_cpus": 0}, **({"logging_config": logging_config} if logging_config
                                                              else {}))
    return deployment.bind(models)


def deploy_repository(models: list[Model], logging_config: Optional[dict] = None) -> None:
    """Every model's application and the repository's, started together (one after the other on a Ray without
    serve.run_many)."""
    serve = _ray_serve()
    targets = [(m.application(), m.name, model_route(m.name)) for m in models]
    targets.append((repository_app(models, logging_config), REPOSITORY_APP, "/"))
    run_many = getattr(serve, "run_many", None)
    if run_many is None:
        for target, name, route in targets:
            serve.run(target, name=name, route_prefix=route, logging_config=logging_config)
        return
    from ray.serve.api import RunTarget
    run_many([RunTarget(target=target, name=name, route_prefix=route, logging_config=logging_config)
              for target, name, route in targets], wait_for_applications_running=True)
