"""A local Ray instance for `jit2triton serve`: started with its own processes on loopback whatever address the
HTTP proxy listens on, and stopped so that none of its processes outlives it.

Ray's own processes (GCS, raylet, its agents, workers) open ports that run code for whoever reaches them; on one
machine nothing outside it needs them. Only Serve's HTTP proxy listens on the address asked for.
"""
from __future__ import annotations

import ipaddress
import os
import signal
import sys
import time
from typing import Any, Optional


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") reaches this machine only: 127.0.0.0/8 and ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ray_serve() -> Any:
    """Ray Serve, or an ImportError that says how to install it (it is an optional extra)."""
    try:
        from ray import serve
    except ImportError as err:
        raise ImportError(f"jit2triton.serving needs Ray Serve ({err}): pip install 'jit2triton[serve]'") from None
    return serve


def start_local(host: str = "127.0.0.1", port: int = 8000, num_cpus: Optional[int] = None,
                log_to_driver: bool = True) -> None:
    """A new local Ray instance with Serve's HTTP proxy on `host:port`, for a quick start; to serve on an existing
    cluster, serve.run(app(...)) there instead. Ray's own processes listen on loopback only, whatever `host` is:
    other machines reach the proxy and nothing else."""
    _ray_on_loopback()
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # a log file or a pipe gets no colour codes
    serve = ray_serve()
    import ray
    # metrics reach Ray's export every second, not every ten: GET /metrics shows a request soon after its answer
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver,
             _system_config={"metrics_report_interval_ms": 1000})
    serve.start(http_options={"host": host, "port": port})


def stop_local(grace_s: float = 10.0) -> None:
    """Serve drained (each replica finishes the requests it holds), then Ray shut down, then any process Ray
    started that is still running (its runtime-env agent outlives `ray.shutdown()` at times) ended: SIGTERM, and
    SIGKILL after `grace_s`."""
    import ray
    from ray import serve

    started = _descendants(os.getpid())
    try:
        if ray.is_initialized():
            serve.shutdown()
    finally:
        ray.shutdown()
        _end(started, grace_s)


class StopSignals:
    """SIGTERM (a service manager's stop, `docker stop`) ends a server as Ctrl-C does, with KeyboardInterrupt, so
    it drains and says "stopped". Installed again when waiting: Ray's core installs its own SIGTERM handler when it
    starts, which dumps stack frames and exits."""

    def __init__(self) -> None:
        signal.signal(signal.SIGTERM, self._interrupt)

    @staticmethod
    def _interrupt(signum, frame) -> None:
        raise KeyboardInterrupt

    def wait(self) -> None:
        """Until SIGTERM or SIGINT."""
        signal.signal(signal.SIGTERM, self._interrupt)
        while True:
            time.sleep(3600)

    @staticmethod
    def ignore() -> None:
        """While stopping: a second signal does not cut the drain short."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_signals() -> StopSignals:
    return StopSignals()


def _descendants(root: int) -> dict[int, str]:
    """The processes started under `root`, by pid, with their start time (so a pid reused later is not ours)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # ended while we looked
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        starts[int(entry)] = fields[19]
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = starts.get(pid, "")
        todo.extend(children.get(pid, []))
    return found


def _still_running(pid: int, start: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[19] == start and fields[0] != "Z"


def _end(processes: dict[int, str], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    signalled = False
    while True:
        left = [pid for pid, start in processes.items() if _still_running(pid, start)]
        if not left:
            return
        if not signalled or time.monotonic() > deadline:
            kind = signal.SIGKILL if signalled else signal.SIGTERM
            for pid in left:
                try:
                    os.kill(pid, kind)
                except OSError:
                    pass
            if signalled:
                return
            signalled = True
        _reap(left)
        time.sleep(0.1)


def _reap(pids: list[int]) -> None:
    """Collects those of `pids` that are this process's children and ended, so none is left a zombie (only
    these: another child's exit status belongs to whoever started it)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child: its parent collects it
            pass


def _ray_on_loopback() -> None:
    """Ray's single-machine mode, where its processes bind to loopback instead of 0.0.0.0. Ray reads the switch
    from the environment when first imported (and its processes, started from here, read it again): where ray was
    imported already (by the CLI's check that it is installed, or by the caller), its copy is set too."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False
