"""The user's TorchScript model run on inputs conversion invents, where a native crash cannot take conversion with it.

Conversion runs the model on draws it makes up (verification's fresh draw, the ends of each Dim's range, other
values to see data-dependent sizes vary). TorchScript can die on such a draw: a segfault in an op fed a length past
its tensor, an abort in a custom op, a device-side assert that poisons the CUDA context. So each such run is first
made in a child process (this file, run as a script: it imports torch and nothing of ours), which holds the model
saved with `torch.jit.save` and its own CUDA context; only a draw the child ran, or refused with an ordinary error,
is then run here. A crash, a device error or a run past its time is a `ReferenceCrashed` the caller names (a skipped
draw, a refused Dim end, or a ConversionError for the example).

Probing first and running here after, rather than shipping outputs back, keeps the outputs what the reference
always gave (TorchScript's own NamedTuples, module state written in place) and costs one more run of each draw; one
child serves every conversion of the process (starting one costs an import of torch), and a crash loses only the
draw it died on: the next draw starts a new child.
"""
from __future__ import annotations

import atexit
import io
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional

_HEADER = struct.Struct("<Q")
DEFAULT_LIMIT_S = 600.0  # a run's limit where the conversion has no time budget
DRAW_FLOOR_S, DRAW_FACTOR = 60.0, 20.0  # a draw may take this many times the slowest draw run so far, or the floor


class ReferenceCrashed(Exception):
    """TorchScript itself died on a draw (a signal, an abort, a device error) or ran past its time limit; `raised`
    is the error a CPU copy of the model raised on the same draw, where a device error sent it there."""

    def __init__(self, why: str, where: str = "", raised: Optional[str] = None, timed_out: bool = False) -> None:
        super().__init__(why + (f" (last Python frame: {where})" if where else ""))
        self.why, self.where, self.raised, self.timed_out = why, where, raised, timed_out


class IsolatedReference:
    """`function` (TorchScript's method as loaded, or a wrapper with the same call) whose runs probe each draw in the
    child first. `remaining()` gives the seconds left in the conversion's time budget (None: no budget), and
    `over_budget()` raises once it is spent. `notes` (for the report) say which draws `crash` found crashing, and
    why runs are not isolated where the child cannot load the model (a custom op registered in `__main__`): those
    runs happen here only, as before."""

    def __init__(self, function: Callable, remaining: Callable[[], Optional[float]] = lambda: None,
                 over_budget: Callable[[], None] = lambda: None) -> None:
        self.function, self.remaining, self.over_budget = function, remaining, over_budget
        self.note: Optional[str] = None
        self.crash_notes: list[str] = []
        self.slowest = 0.0  # the longest a draw has run in the child so far
        self._verdicts: dict[int, tuple[list, Optional[str]]] = {}
        try:
            self._model = _saved(function)
        except Exception as err:  # noqa: BLE001 - a model torch.jit.save refuses: run unisolated, and say so
            self._model, self.note = None, f"reference runs not isolated: the model could not be saved ({err})"

    def __call__(self, *inputs: Any) -> Any:
        self.probe([list(inputs)])
        return self.function(*inputs)

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self.function, name)  # (`sequence`, for a model with module state)
        if name != "sequence":
            return inner

        def sequence(calls: list[list]) -> Any:
            self.probe(calls)
            return inner(calls)
        return sequence

    @property
    def notes(self) -> list[str]:
        return self.crash_notes + ([self.note] if self.note else [])

    def crash(self, inputs: list, name: str) -> Optional[str]:
        """How draw `name` crashes TorchScript, or None where TorchScript runs it (or refuses it as a model does);
        each draw is probed once, however often it is asked about, and a crash is noted once."""
        held = self._verdicts.get(id(inputs))
        if held is None or held[0] is not inputs:
            try:
                self.probe([list(inputs)])
                verdict = None
            except ReferenceCrashed as crashed:
                verdict = str(crashed)
                self.crash_notes.append(f"{name} crashed TorchScript itself: {crashed}; skipped")
            held = self._verdicts[id(inputs)] = (inputs, verdict)
        return held[1]

    def probe(self, calls: list[list]) -> None:
        """Run `calls` (one after another) in the child; raise ReferenceCrashed where TorchScript died there."""
        if self._model is None or self.note is not None:
            return
        left = self.remaining()
        limit = min(left, DEFAULT_LIMIT_S) if left is not None else DEFAULT_LIMIT_S
        if self.slowest:
            limit = min(limit, max(DRAW_FLOOR_S, DRAW_FACTOR * self.slowest))
        reply = _CHILD.run(self._model, calls, limit)
        kind = reply[0]
        if kind == "ran":
            self.slowest = max(self.slowest, reply[1])
        elif kind == "load_failed":
            self.note = f"reference runs not isolated: a child process could not load the model ({reply[1]})"
        elif kind == "device_error":
            raise ReferenceCrashed(f"a device error ({reply[1]})", raised=reply[2])
        elif kind == "timed_out":
            self.over_budget()
            raise ReferenceCrashed(f"it ran past {limit:.0f} s", timed_out=True)
        elif kind == "died":
            raise ReferenceCrashed(reply[1], reply[2])


def warm() -> None:
    """Start the child now, so that it has imported torch by the time conversion first needs it."""
    with _CHILD.lock:
        _CHILD.start()


def _saved(function: Callable) -> tuple[bytes, str, list[str]]:
    """(the model as torch.jit.save writes it, the method to call, modules that register its custom ops)."""
    method, owner = "forward", None
    inner = getattr(function, "method", None)  # a model with module state (loaders/torchscript.py)
    if inner is not None:
        function, owner = inner, function.module._c
    if hasattr(function, "owner"):  # a ScriptMethod
        method, owner = function.name, function.owner if owner is None else owner
    data = (function if owner is None else owner).save_to_buffer()
    graph = getattr(function, "inlined_graph", function.graph)  # (as loaded, a submodule's ops sit in its calls)
    return data, method, _op_modules(graph)


def _op_modules(graph) -> list[str]:
    """The Python modules that define the graph's custom ops (torch.library.custom_op), for the child to import."""
    from torch._library.custom_ops import OPDEFS

    from jit2triton.loaders.graph_nodes import all_nodes  # (here: the child runs this file without the package)
    modules = {OPDEFS[node.kind()]._init_fn.__module__ for node in all_nodes(graph.block()) if node.kind() in OPDEFS}
    return sorted(m for m in modules if m != "__main__")


class _Child:
    """The child process, started when first needed and again after a crash; one request at a time."""

    def __init__(self) -> None:
        self.process: Optional[subprocess.Popen] = None
        # the model bytes the child holds, kept (not their id: once freed, another model's bytes can take that id,
        # and the child would probe a draw on the wrong model)
        self.loaded: Optional[bytes] = None
        self.lock = threading.Lock()

    def run(self, model: tuple, calls: list[list], limit: float) -> tuple:
        import torch
        with self.lock:
            if self.loaded is not model[0] or self.process is None or self.process.poll() is not None:
                self.start()
                libraries = sorted(getattr(torch.ops, "loaded_libraries", ()))
                reply = self._request(("load", model[0], model[1], model[2], list(sys.path), libraries), limit)
                if reply[0] != "loaded":
                    return reply
                self.loaded = model[0]
            return self._request(("run", [_to_cpu(call) for call in calls]), limit)

    def start(self) -> None:
        """A child, ready or starting (it imports torch meanwhile)."""
        if self.process is not None and self.process.poll() is None:
            return
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        if getattr(self, "stderr", None) is not None:  # (the last child's, read when it died)
            self.stderr.close()
        self.stderr = tempfile.TemporaryFile()
        # (run_path: this file's folder, which holds modules named like the standard library's, stays off sys.path)
        starter = f"import runpy; runpy.run_path({__file__!r}, run_name='__main__')"
        self.process = subprocess.Popen([sys.executable, "-c", starter, str(to_child_r), str(from_child_w)],
                                        pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=self.stderr)
        os.close(to_child_r)
        os.close(from_child_w)
        self.to_child, self.from_child = to_child_w, from_child_r

    def _request(self, message: tuple, limit: float) -> tuple:
        """The child's reply, or ("died", why, where) / ("timed_out",) with the child gone."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        deadline = time.monotonic() + limit
        try:
            _write_all(self.to_child, _HEADER.pack(len(data)) + data)
            size = _HEADER.unpack(self._read(_HEADER.size, deadline))[0]
            reply = pickle.loads(self._read(size, deadline))
        except TimeoutError:
            self._stop()
            reply = ("timed_out",)
        except (EOFError, OSError):
            reply = self._died()
        if reply[0] == "device_error":  # its CUDA context is lost
            self._stop()
        if self.process is None:  # the next draw's child imports torch while this process goes on
            self.start()
        return reply

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, have = [], 0
        while have < size:
            wait = deadline - time.monotonic()
            poller = select.poll()  # (not select(): in a process with over 1024 descriptors it refuses to wait)
            poller.register(self.from_child, select.POLLIN)
            if wait <= 0 or not poller.poll(wait * 1000):
                raise TimeoutError
            chunk = os.read(self.from_child, min(size - have, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            have += len(chunk)
        return b"".join(chunks)

    def _died(self) -> tuple:
        code = self.process.wait(timeout=30)
        why = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit code {code}"
        self.stderr.seek(0)
        where = _last_frame(self.stderr.read().decode(errors="replace"))
        self._stop()
        return ("died", why, where)

    def close(self) -> None:
        self._stop()
        if getattr(self, "stderr", None) is not None:
            self.stderr.close()
            self.stderr = None

    def _stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for fd in (getattr(self, "to_child", None), getattr(self, "from_child", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.to_child = self.from_child = None
        self.process, self.loaded = None, None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _last_frame(stderr: str) -> str:
    """The innermost Python frame faulthandler printed for the crash (`file, line N in function`) that is not in
    Python's or torch's own files (the user's op, not ctypes'), or ""."""
    import sysconfig
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(("Current thread", "Thread 0x"))), None)
    if start is None:
        return ""
    frames = []
    for line in lines[start + 1:]:
        if not line.strip().startswith("File "):
            break
        frames.append(line.strip().removeprefix("File ").replace('"', ""))
    paths = sysconfig.get_paths()
    torch_files, stdlib, installed = os.path.join(paths["purelib"], "torch"), paths["stdlib"] + os.sep, paths["purelib"]
    ours = [f for f in frames
            if not f.startswith(torch_files) and (f.startswith(installed) or not f.startswith(stdlib))]
    return ours[0] if ours else frames[0] if frames else ""


def _to_cpu(value: Any) -> Any:
    """Inputs as the child receives them: tensors on the CPU, each with the device to move it back to."""
    import torch
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().cpu(), str(value.device))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


# ---- the child ----

def _from_cpu(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "tensor":
        return value[1].to(value[2])
    if isinstance(value, (list, tuple)):
        return type(value)(_from_cpu(v) for v in value)
    return value


def _device_error(err: BaseException) -> bool:
    text = str(err)
    return type(err).__name__ == "AcceleratorError" or "CUDA error" in text or "illegal memory access" in text


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if _device_error(err):  # CUDA's own line, not its advice on how to debug it ("Compile with ...")
        lines = [line for line in lines if "CUDA error" in line or "illegal memory access" in line] or lines
        return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:300]


def _serve(read_fd: int, write_fd: int) -> None:
    import faulthandler
    import importlib

    import torch
    faulthandler.enable()
    model, method, data = None, "forward", b""

    def reply(message: tuple) -> None:
        out = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        _write_all(write_fd, _HEADER.pack(len(out)) + out)

    while True:
        header = os.read(read_fd, _HEADER.size)
        if not header:
            return
        while len(header) < _HEADER.size:
            header += os.read(read_fd, _HEADER.size - len(header))
        size, chunks = _HEADER.unpack(header)[0], []
        while size:
            chunk = os.read(read_fd, min(size, 1 << 20))
            if not chunk:
                return
            chunks.append(chunk)
            size -= len(chunk)
        message = pickle.loads(b"".join(chunks))
        if message[0] == "load":
            _, data, method, modules, path, libraries = message
            try:
                sys.path[:] = path
                for library in libraries:
                    torch.ops.load_library(library)
                for name in modules:
                    importlib.import_module(name)
                model = getattr(torch.jit.load(io.BytesIO(data)), method)
            except Exception as err:  # noqa: BLE001 - whatever stops loading, the parent runs unisolated
                reply(("load_failed", _one_line(err)))
                continue
            reply(("loaded",))
            continue
        started = time.perf_counter()
        try:
            with torch.no_grad(), torch.jit.optimized_execution(False):  # (as the parent runs it: conversion.py)
                for call in message[1]:
                    _run_where_the_weights_are(model, _from_cpu(call))
                if torch.cuda.is_initialized():  # a device-side assert surfaces at the next synchronisation: here,
                    torch.cuda.synchronize()     # not in the parent's run of the same draw
        except Exception as err:  # noqa: BLE001 - a refusal is the parent's to see again; a device error is not
            if not _device_error(err):
                reply(("raised", _one_line(err)))
                continue
            reply(("device_error", _one_line(err), _on_a_cpu_copy(data, method, message[1])))
            return
        reply(("ran", time.perf_counter() - started))


def _run_where_the_weights_are(model: Callable, inputs: list) -> Any:
    """As verify.run_where_the_weights_are: a model whose weights stay on the CPU takes CPU copies of GPU inputs."""
    import torch
    try:
        return model(*inputs)
    except Exception as err:
        if _device_error(err):
            raise
        on_cpu = [x.cpu() if isinstance(x, torch.Tensor) else x for x in inputs]
        if all(x is y for x, y in zip(on_cpu, inputs)):
            raise
        return model(*on_cpu)


def _on_a_cpu_copy(data: bytes, method: str, calls: list) -> Optional[str]:
    """What a CPU copy of the model raises on the calls a device error stopped (an index out of range raises there
    with the model's own text instead of asserting), or None where it runs them."""
    import torch
    try:
        model = getattr(torch.jit.load(io.BytesIO(data), map_location="cpu"), method)
        for call in calls:
            model(*[x.cpu() if isinstance(x, torch.Tensor) else x for x in _from_cpu(call)])
    except Exception as err:  # noqa: BLE001
        # a frozen model's constants can stay on the GPU after map_location: then the copy's complaint is about
        # devices, not the model's own error, and the device error is the better answer
        return None if "Expected all tensors to be on the same device" in str(err) else _one_line(err)
    return None


_CHILD = _Child()
atexit.register(_CHILD.close)  # (a child left running past its parent would hold a model and a torch for nothing)

if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
