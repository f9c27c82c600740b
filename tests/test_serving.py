"""Serving with Ray Serve (jit2triton.serving): reading requests, batching and splitting without Ray; then a local
Ray Serve app on loopback under load from 16 clients, with a replica killed mid-load, bad bodies, the Python handle,
a request sent before the app is up (`jit2triton serve` itself: test_serving_repository.py). Every answer is checked against the TorchScript model
on the same fresh random inputs."""
import base64
import http.client
import json
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import torch

import jit2triton
from jit2triton.deploy.serving.batching import concat_inputs, plan_batching, plan_chunks, split_rows
from jit2triton.deploy.serving.json_form import Request, encode
from jit2triton.errors import InputError, StepError
from helpers import LONG_TESTS, LinearGeluNorm, long_test
from serving_models import TwoInputs
from serving_packages import reader_for

try:
    with warnings.catch_warnings():  # Ray's own pydantic deprecations, not ours to fix
        warnings.simplefilter("ignore", DeprecationWarning)
        import ray
        from ray import serve
except ImportError:
    ray = serve = None
needs_ray = pytest.mark.skipif(ray is None, reason="ray[serve] is not installed (pip install -e '.[serve]')")

FEATURES, MAX_BATCH, MAX_SEQ = 16, 32, 8
APP, DEPLOYMENT, ROUTE = "j2t", "jit2triton", "/mlp"  # a route of its own: a request for another app is never its


def _tensor(dtype, *shape):
    return {"type": "Tensor", "dtype": dtype, "shape": list(shape)}


def _output(dtype, *dims):
    return {"type": "Tensor", "dtype": dtype, "shape": [2] * len(dims), "dims": [str(d) for d in dims]}


# x: float32[batch, seq, 4], ids: int64[batch, seq] -> (float32[batch, seq, 4], Dict{mask: bool[batch, seq]})
SIGNATURE = {
    "inputs": [{"name": "x", **_tensor("float32", "batch", "seq", 4)}, {"name": "ids", **_tensor("int64", "batch", "seq")}],
    "outputs": {"type": "Tuple", "items": [_output("float32", "batch", "seq", 4),
                                           {"type": "Dict", "items": {"mask": _output("bool", "batch", "seq")}}]},
    "dims": {"batch": {"min": 1, "max": 16}, "seq": {"min": 1, "max": 8}},
}


def _reader(name="tagger", max_batch_size=32):
    """The reader a replica of a package with SIGNATURE (or another of serving_packages.py) builds."""
    return reader_for(name, max_batch_size)


def _b64(t: torch.Tensor, dtype: str = None) -> dict:
    return {"dtype": dtype or str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "data": base64.b64encode(t.contiguous().numpy().tobytes()).decode()}


def _body(**doc) -> bytes:
    return json.dumps(doc).encode()


# ---- without Ray: the pure parts ----

def test_the_batch_dim_is_on_axis_0_of_every_input_and_output():
    assert plan_batching(SIGNATURE, 32).dim == "batch"
    assert plan_batching(SIGNATURE, 32).max_rows == 16  # the dim's range caps max_batch_size
    assert plan_batching(SIGNATURE, 8).max_rows == 8
    static = {**SIGNATURE, "inputs": [{"name": "x", **_tensor("float32", 2, 4)}], "dims": {}}
    assert plan_batching(static, 32).dim is None and "no dynamic dim on axis 0" in plan_batching(static, 32).why_not
    by_seq = {**SIGNATURE, "inputs": [SIGNATURE["inputs"][0], {"name": "ids", **_tensor("int64", "seq", "batch")}]}
    assert plan_batching(by_seq, 32).dim is None
    summed = {**SIGNATURE, "outputs": _output("float32", "seq", "4")}  # a reduction over the batch
    assert "cannot be handed back per request" in plan_batching(summed, 32).why_not
    scalar = {**SIGNATURE, "inputs": SIGNATURE["inputs"] + [{"name": "k", "type": "int"}]}
    assert plan_batching(scalar, 32).dim is None
    assert plan_batching(SIGNATURE, 1).dim is None  # max_batch_size=1 turns batching off


def test_requests_read_as_nested_lists_base64_by_name_and_position():
    x, ids = torch.randn(3, 5, 4), torch.randint(0, 100, (3, 5))
    reader = _reader()
    for doc in ({"inputs": {"x": x.tolist(), "ids": ids.tolist()}}, {"inputs": [_b64(x), _b64(ids)]},
                {"inputs": {"ids": _b64(ids), "x": x.tolist()}}):
        request = reader.from_json(json.dumps(doc).encode())
        assert torch.equal(request.inputs[0], x) and torch.equal(request.inputs[1], ids)  # bit-exact both ways
        assert request.rows == 3 and request.group == (torch.Size([5, 4]), torch.Size([5]))
    assert reader.from_json(_body(inputs=[x.tolist(), ids.tolist()])).reply == "list"
    assert reader.from_json(_body(inputs=[_b64(x), ids.tolist()])).reply == "base64"
    assert reader.from_json(_body(inputs=[_b64(x), _b64(ids)], outputs="list")).reply == "list"
    handle = reader.from_values((x,), {"ids": ids})
    assert torch.equal(handle.inputs[1], ids) and handle.rows == 3


def test_inputs_with_defaults_may_be_left_out():
    request = _reader("scaled").from_json(_body(inputs={"x": [1.0, 2.0]}))
    assert request.inputs[1] == 0.5 and request.rows == 1 and request.group == ()
    assert _reader("scaled").from_json(_body(inputs={"x": [1.0, 2.0], "alpha": 2})).inputs[1] == 2


def _fixed(*shape: int) -> torch.Tensor:
    """Values from a fixed seed: they name the tests below, which must be the same in every pytest-xdist worker."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("body, message", [
    (b"{not json", "the body is not JSON"),
    (b"\xff\xfe", "the body is not JSON"),
    (b"[1, 2]", "a JSON object with \"inputs\""),
    (_body(input={"x": []}), "a JSON object with \"inputs\""),
    (_body(inputs={}), "\"inputs\" is empty"),
    (_body(inputs={"y": [1.0]}), "unknown input 'y'; the model takes (x, ids)"),
    (_body(inputs={"ids": [[1]]}), "input 'x' is missing and has no default"),
    (_body(inputs=[[[[1.0] * 4]], [[1]], [[1]]]), "expected at most 2 inputs (x, ids), got 3"),
    (_body(inputs=[[[[1.0] * 4], [[1.0] * 3]], [[1, 2]]]), "input 0 ('x'): expected a nested list of numbers"),
    (_body(inputs=[[[["a"] * 4]], [[1]]]), "input 0 ('x'): expected a nested list of numbers"),
    (_body(inputs=[[[[1.0] * 4]], [[1.5]]]), "input 1 ('ids'): expected int64 values, got float32 ones"),
    (_body(inputs=[[[[1.0] * 4]], [[2 ** 70]]]), "input 1 ('ids'): expected a nested list of numbers"),
    (_body(inputs=[[[[1.0] * 3]], [[1]]]), "input 0 ('x'): expected float32[batch, seq, 4]"),
    (_body(inputs=[[[[1.0] * 4]] * 17, [[1]] * 17]), "axis 0 is dim batch, whose range is 1..16; got 17"),
    (_body(inputs=[[[[1.0] * 4]] * 2, [[1]] * 3]), "which is 2 in input 0 ('x') axis 0; got 3"),
    (_body(inputs=[_b64(_fixed(1, 1, 4).double()), [[1]]]), "input 0 ('x'): expected float32 data, got "
                                                                  "\"dtype\": \"float64\"; send the tensor as float32"),
    (_body(inputs=[{**_b64(_fixed(1, 1, 4)), "dtype": "float99"}, [[1]]]), "expected float32 data"),
    (_body(inputs=[[[[1.0] * 4]], _b64(torch.zeros(1, 1, dtype=torch.int8), "qint8")]), "expected int64 data"),
    (_body(inputs=[{**_b64(_fixed(1, 1, 4)), "dtype": None}, [[1]]]), "got \"dtype\": null"),
    (_body(inputs=[{**_b64(_fixed(1, 1, 4)), "shape": [1, -1, 4]}, [[1]]]), "\"shape\" must be a list of sizes"),
    (_body(inputs=[{"dtype": "float32", "shape": [0, 2 ** 63, 4], "data": ""}, [[1]]]), "\"shape\" must be a list"),
    (_body(inputs=[json.loads("[" * 500 + "1.0" + "]" * 500), [[1]]]), "input 0 ('x'): expected a nested list"),
    (_body(inputs=[{**_b64(_fixed(1, 1, 4)), "data": "!!"}, [[1]]]), "\"data\" is not base64"),
    (_body(inputs=[{**_b64(_fixed(1, 1, 4)), "shape": [1, 2, 4]}, [[1]]]), "is 32 bytes, \"data\" holds 16"),
    (_body(inputs=[{"dtype": "float32", "shape": [1, 1, 4]}, [[1]]]), "\"data\" must be the tensor's bytes"),
    (_body(inputs=[{"dtype": "float32", "shape": [1, 1, 4], "data": 5}, [[1]]]), "\"data\" must be the tensor's"),
    (_body(inputs=[[[[1.0] * 4]], [[1]]], outputs="xml"), "\"outputs\" must be \"list\" or \"base64\""),
    (b"[" * 100_000, "the body is not JSON"),
])
def test_a_bad_body_is_an_input_error_that_says_what_to_send(body, message):
    with pytest.raises(InputError) as caught:
        _reader().from_json(body)
    assert message in str(caught.value)


def _request(rows: int, seq: int) -> Request:
    return Request([torch.randn(rows, seq, 4), torch.randint(0, 9, (rows, seq))], rows,
                   (torch.Size([seq, 4]), torch.Size([seq])))


def test_chunks_keep_one_shape_and_at_most_max_rows_in_arrival_order():
    requests = [_request(3, 2), _request(2, 5), _request(4, 2), _request(6, 2), _request(9, 5), _request(20, 2)]
    assert plan_chunks(requests, 8) == [[0, 2], [1], [3], [4], [5]]
    assert plan_chunks(requests, 16) == [[0, 2, 3], [1, 4], [5]]  # 20 rows > 16: alone, never refused
    assert plan_chunks(requests[:1], 16) == [[0]]


def test_a_batch_hands_each_request_its_own_rows():
    requests = [_request(3, 2), _request(1, 2), _request(4, 2)]

    def model(x, ids):  # row-independent, with a tuple and dict output like SIGNATURE's
        return x * 2 + ids.unsqueeze(-1), {"mask": ids > 4}

    parts = split_rows(model(*concat_inputs(requests)), [r.rows for r in requests])
    assert len(parts) == 3
    for request, (y, extra) in zip(requests, parts):
        alone_y, alone_extra = model(*request.inputs)
        assert torch.equal(y, alone_y) and torch.equal(extra["mask"], alone_extra["mask"])
    with pytest.raises(StepError, match="returned 7 rows for a batch of 8"):
        split_rows(torch.zeros(7, 2), [4, 4])
    with pytest.raises(StepError, match="cannot be split per request"):
        split_rows(3, [1, 1])


def test_answers_encode_as_lists_or_exact_base64():
    y = torch.randn(2, 3)
    assert encode((y, {"k": y}), "list") == [y.tolist(), {"k": y.tolist()}]
    record = encode(y, "base64")
    assert record["dtype"] == "float32" and record["shape"] == [2, 3]
    assert torch.equal(torch.frombuffer(bytearray(base64.b64decode(record["data"])), dtype=torch.float32).view(2, 3), y)


def test_without_ray_serving_says_how_to_install_it():
    code = ("import sys; sys.modules['ray'] = None; from jit2triton.serving import app\n"
            "try:\n    app('model.j2t')\nexcept ImportError as err:\n    print(err)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "jit2triton.serving needs Ray Serve" in out and "pip install 'jit2triton[serve]'" in out, out


# ---- a Ray Serve app on loopback ----

@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """A dynamic-batch C++ package (batch 1..32, seq 1..8) and its TorchScript model."""
    torch.manual_seed(0)
    example = torch.randn(2, 3, FEATURES)
    traced = torch.jit.trace(LinearGeluNorm(FEATURES).eval(), (example,))
    batch, seq = jit2triton.Dim("batch", min=1, max=MAX_BATCH), jit2triton.Dim("seq", min=1, max=MAX_SEQ)
    path = tmp_path_factory.mktemp("serving") / "mlp.j2t"
    jit2triton.convert(traced, example_inputs=(example,), dynamic_shapes={"x": {0: batch, 1: seq}},
                       backend="cpp").save(path)
    return str(path), traced


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(package, cpp_runtime):
    """2 replicas of the package on a local Ray (2 CPUs, no dashboard); yields the HTTP port. The C++ runtime is
    built first (cpp_runtime), so replicas only load it. A long test (test_serving_repository.py and
    test_serving_v2.py serve through Ray in CI)."""
    if not LONG_TESTS:
        pytest.skip("a long test (a local Ray with two replicas): set JIT2TRITON_LONG_TESTS=1 to run it")
    from jit2triton.serving import app, start_local, stop_local

    port = _free_port()
    start_local(port=port, num_cpus=2, log_to_driver=False)
    try:
        serve.run(app(package[0], runtime="cpp", num_replicas=2, num_cpus=0.5, num_threads=1,
                      max_batch_size=MAX_BATCH, batch_wait_timeout_s=0.005,
                      logging_config={"enable_access_log": False}), name=APP, route_prefix=ROUTE)
        yield port
    finally:
        stop_local()  # Serve, Ray and any process Ray left


class Client:
    """One keep-alive HTTP connection, as a load test's client thread holds."""

    def __init__(self, port: int) -> None:
        self.port, self.connection = port, None

    def send(self, method: str, path: str = "/", body: bytes = None) -> tuple[int, bytes]:
        if self.connection is None:
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            self.connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
            response = self.connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            self.connection.close()
            self.connection = None
            raise


def _fresh_input(i: int) -> tuple[torch.Tensor, bytes]:
    """Request i: 1..8 rows of seq 2 or 5 (two shapes the batcher must keep apart), fresh random values, as a
    nested list or base64 in turn."""
    rows = int(torch.randint(1, 9, (1,)))
    x = torch.randn(rows, (2, 5)[i % 2], FEATURES) * 2 + 0.5
    return x, _body(inputs={"x": x.tolist() if i % 4 < 2 else _b64(x)})


def _decode_answer(data: bytes) -> torch.Tensor:
    out = json.loads(data)["outputs"]
    if isinstance(out, dict):
        return torch.frombuffer(bytearray(base64.b64decode(out["data"])), dtype=torch.float32).reshape(out["shape"])
    return torch.tensor(out)


@dataclass
class Outcome:
    x: torch.Tensor
    status: object = None  # the final answer's HTTP status, or None: no answer
    data: bytes = b""
    seconds: float = 0.0
    refusals: list = field(default_factory=list)  # (status, body) of each 5xx before the answer, retried


def _load(port: int, count: int, clients: int, retry: bool = False, progress=None) -> tuple[list, float]:
    """`count` requests from `clients` threads; with `retry`, a 5xx or a dropped connection is retried (counted)."""
    outcomes: list = [None] * count
    taken = iter(range(count))
    lock = threading.Lock()

    def client_thread():
        client = Client(port)
        while True:
            with lock:
                i = next(taken, None)
            if i is None:
                return
            x, body = _fresh_input(i)
            outcome, started = Outcome(x), time.perf_counter()
            for attempt in range(30):
                try:
                    outcome.status, outcome.data = client.send("POST", ROUTE, body)
                except (OSError, http.client.HTTPException) as err:
                    outcome.status, outcome.data = None, repr(err).encode()
                if not retry or outcome.status == 200 or (outcome.status is not None and outcome.status < 500):
                    break
                outcome.refusals.append((outcome.status, outcome.data))
                time.sleep(0.05 * (attempt + 1))
            outcome.seconds = time.perf_counter() - started
            outcomes[i] = outcome
            if progress:
                progress()

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client_thread) for _ in range(clients)]:
            future.result()
    return outcomes, time.perf_counter() - started


def _wrong_answers(outcomes: list, model) -> list:
    wrong = []
    with torch.no_grad():
        for i, o in enumerate(outcomes):
            if o.status != 200:
                wrong.append(f"request {i}: HTTP {o.status} {o.data[:200]!r}")
                continue
            got, expected = _decode_answer(o.data), model(o.x)
            if got.shape != expected.shape:
                wrong.append(f"request {i}: shape {list(got.shape)}, expected {list(expected.shape)}")
            elif not torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
                wrong.append(f"request {i}: rows {o.x.shape[0]}, max error {(got - expected).abs().max():.3e}")
    return wrong


def _replica_stats(port: int, replicas: int) -> dict:
    """Each replica's counters, by replica id: GET /stats reaches one replica at a time."""
    seen, deadline = {}, time.monotonic() + 60  # a new replica is routed to once the proxy has heard of it
    while time.monotonic() < deadline:
        status, data = Client(port).send("GET", f"{ROUTE}/stats")  # a new connection each: the proxy may keep one's route
        assert status == 200, data
        doc = json.loads(data)
        seen[doc["replica"]] = doc
        if len(seen) >= replicas:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"GET /stats reached {len(seen)} replicas of {replicas}")


def _model_statistics(port: int) -> dict:
    status, data = Client(port).send("GET", f"{ROUTE}/v2/models/mlp/stats")
    assert status == 200, data
    stats = json.loads(data)["model_stats"][0]
    return {"inference_count": stats["inference_count"], "execution_count": stats["execution_count"],
            "success": stats["inference_stats"]["success"]["count"]}


def _totals(before: dict, after: dict) -> dict:
    keys = ("answered", "model_calls", "rows", "batched_requests")
    totals = {k: sum(s[k] for s in after.values()) - sum(before.get(r, {}).get(k, 0) for r in after) for k in keys}
    return {**totals, "largest_call_rows": max(s["largest_call_rows"] for s in after.values())}


@needs_ray
@long_test
def test_2000_requests_from_16_clients_are_all_answered_correctly_in_batches(server, package):
    before, model_before = _replica_stats(server, 2), _model_statistics(server)
    outcomes, seconds = _load(server, 2000, 16)
    after = _replica_stats(server, 2)
    wrong = _wrong_answers(outcomes, package[1])
    assert not wrong, f"{len(wrong)} wrong answers: {wrong[:5]}"
    totals = _totals(before, after)
    latencies = sorted(o.seconds * 1e3 for o in outcomes)
    rows = sum(o.x.shape[0] for o in outcomes)
    print(f"\nload: 2000 requests ({rows} rows) from 16 clients over HTTP to 2 replicas in {seconds:.1f} s: "
          f"{2000 / seconds:.0f} requests/s, p50 {statistics.median(latencies):.1f} ms, "
          f"p99 {latencies[int(0.99 * len(latencies))]:.1f} ms; the batcher formed {totals['model_calls']} model "
          f"calls, {totals['batched_requests'] / totals['model_calls']:.2f} requests and "
          f"{totals['rows'] / totals['model_calls']:.2f} rows per call (at most {totals['largest_call_rows']})")
    assert totals["answered"] == 2000 and totals["rows"] == rows
    assert totals["largest_call_rows"] <= MAX_BATCH
    assert totals["model_calls"] < 2000  # concurrent requests shared model calls
    # the v2 statistics extension counts both replicas (each publishes its counts every 0.5 s)
    deadline = time.monotonic() + 30
    while True:
        model = _model_statistics(server)
        counted = {k: model[k] - model_before[k] for k in ("inference_count", "execution_count", "success")}
        if counted == {"inference_count": rows, "execution_count": totals["model_calls"], "success": 2000}:
            break
        assert time.monotonic() < deadline, counted
        time.sleep(0.2)


@needs_ray
@long_test
def test_a_replica_killed_mid_load_loses_no_request_and_is_replaced(server, package):
    done, killed_at = [0], threading.Event()
    lock = threading.Lock()

    def progress():
        with lock:
            done[0] += 1
            if done[0] == 150:
                killed_at.set()

    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(_load, server, 600, 8, True, progress)
        assert killed_at.wait(120), "the load did not start"
        replicas = [a for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith(f"SERVE_REPLICA::{APP}#")]
        assert len(replicas) == 2, replicas
        victim = replicas[0]
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
        outcomes, seconds = load.result()
    wrong = _wrong_answers(outcomes, package[1])
    refusals = [r for o in outcomes for r in o.refusals]
    print(f"\nfault: killed replica {victim['name']} after 150 of 600 requests: {600 - len(wrong)} answered "
          f"correctly in {seconds:.1f} s, {len(refusals)} refusals retried "
          f"({sorted({r[0] for r in refusals}, key=str)}{', first: ' + repr(refusals[0][1][:100]) if refusals else ''}), "
          f"{len(wrong)} wrong or unanswered")
    assert not wrong, wrong[:5]
    # Refusals are 5xx answers with a body, or, for a request the killed replica held, the client's own timeout:
    # on a loaded machine Ray's proxy learnt of the death only after the client's 60 s (seen once in a full test
    # run on 2 cores; the request was retried and answered). What must hold is that none is lost or wrong.
    assert all((status is not None and status >= 500 and body) or (status is None and b"timed out" in body)
               for status, body in refusals), refusals[:5]

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = serve.status().applications[APP].deployments[DEPLOYMENT].replica_states
        if states.get("RUNNING") == 2 and len(states) == 1:
            break
        time.sleep(1)
    assert states == {"RUNNING": 2}, states
    assert victim["name"].rsplit("#", 1)[1] not in _replica_stats(server, 2)


def _post_streamed(port: int, size: int, chunked: bool) -> tuple[int, bytes]:
    """POST `size` bytes as a careful client does (curl): stop sending once the server has answered, then read the
    answer, so a server that refuses a body early is heard."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    sock.sendall(f"POST {ROUTE} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{framing}\r\n\r\n".encode())
    piece = b"[" * 65536
    frame = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
    sock.setblocking(False)
    pending, sent = b"", 0
    watch = selectors.DefaultSelector()  # (poll, not select(): a long suite's descriptors pass select's 1024)
    watch.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    while sent < size or pending:
        events = watch.select(30)
        readable = any(mask & selectors.EVENT_READ for _, mask in events)
        writable = any(mask & selectors.EVENT_WRITE for _, mask in events)
        if readable:
            break  # answered early
        assert writable, "the server neither reads the body nor answers"
        if not pending:
            pending, sent = frame, sent + len(piece)
        try:
            pending = pending[sock.send(pending):]
        except BlockingIOError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    else:
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    watch.close()
    sock.setblocking(True)
    response = http.client.HTTPResponse(sock)
    response.begin()
    try:
        return response.status, response.read()
    finally:
        sock.close()


@needs_ray
def test_bad_bodies_get_4xx_with_a_message_and_the_server_keeps_serving(server, package):
    client = Client(server)
    x = torch.randn(2, 3, FEATURES)
    cases = [
        (b"{\"inputs\": [", 400, "the body is not JSON"),
        (_body(inputs={"x": _b64(x.double())}), 400, "expected float32 data, got \"dtype\": \"float64\""),
        (_body(inputs={"x": x.double().tolist()[0]}), 400, "expected float32[batch, seq, 16] on cpu, got float32[3, 16]"),
        (_body(inputs={"x": torch.randn(33, 1, FEATURES).tolist()}), 400, "dim batch, whose range is 1..32; got 33"),
        (_body(inputs={"x": torch.randn(1, 9, FEATURES).tolist()}), 400, "dim seq, whose range is 1..8; got 9"),
        (_body(inputs={"y": x.tolist()}), 400, "unknown input 'y'"),
    ]
    for body, status, message in cases:
        got, data = client.send("POST", ROUTE, body)
        assert got == status and message in json.loads(data)["error"], (got, data)
    assert client.send("PUT", ROUTE, b"{}")[0] == 405
    for chunked in (False, True):
        status, data = _post_streamed(server, 100 << 20, chunked)
        assert status == 413 and "over this server's limit" in json.loads(data)["error"], (status, data)
    client = Client(server)
    status, data = client.send("POST", ROUTE, _body(inputs={"x": x.tolist()}))
    assert status == 200 and torch.allclose(_decode_answer(data), package[1](x), rtol=1e-4, atol=1e-5)
    info = json.loads(client.send("GET", ROUTE)[1])
    assert info["signature"] == "(x: float32[batch, seq, 16]) -> float32[batch, seq, 16]"
    assert info["batch_dim"] == "batch" and info["runtime"] == "cpp"


@needs_ray
def test_the_python_handle_batches_and_refuses_like_http(server, package):
    handle = serve.get_app_handle(APP)
    xs = [torch.randn(n, 4, FEATURES) for n in (1, 3, 5, 2)]
    responses = [handle.predict.remote(x) for x in xs[:2]] + [handle.predict.remote(x=x) for x in xs[2:]]
    for x, response in zip(xs, responses):
        assert torch.allclose(response.result(timeout_s=60), package[1](x), rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match="expected float32\\[batch, seq, 16\\]"):
        handle.predict.remote(torch.randn(2, 3)).result(timeout_s=60)


@needs_ray
def test_a_request_sent_before_the_app_is_up_waits_or_is_refused_cleanly(server, tmp_path):
    """A static package (no batch dim: one request per call), deployed while requests
    already arrive: each gets 404/503 with a message until the app is up, then the right answer."""
    from jit2triton.serving import app

    torch.manual_seed(1)
    example = (torch.randn(2, 4), torch.randn(2, 3))
    traced = torch.jit.trace(TwoInputs().eval(), example)
    path = tmp_path / "static.j2t"
    jit2triton.convert(traced, example_inputs=example).save(path)
    deploying = threading.Thread(target=serve.run, args=(app(str(path), num_cpus=0.25),),
                                 kwargs={"name": "static", "route_prefix": "/static"})
    deploying.start()
    try:
        client, early, deadline = Client(server), [], time.monotonic() + 120
        while time.monotonic() < deadline:
            x, y = torch.randn(2, 4), torch.randn(2, 3)
            status, data = client.send("POST", "/static", _body(inputs=[x.tolist(), _b64(y)]))
            if status == 200:
                break
            assert status in (404, 503) and data, (status, data)
            early.append(status)
            time.sleep(0.2)
    finally:
        deploying.join(120)
    assert status == 200 and torch.allclose(_decode_answer(data), traced(x, y), atol=1e-6), data
    print(f"\nreadiness: {len(early)} requests before the app was up, answered {sorted(set(early))}")
    info = json.loads(client.send("GET", "/static")[1])
    assert info["batch_dim"] is None and "no dynamic dim on axis 0" in info["not_batched_because"]
    assert info["runtime"] == "cpp"
    serve.delete("static")


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        return torch.tanh(self.embedding(ids))


@needs_ray
def test_a_request_whose_values_make_the_model_raise_fails_alone(server, tmp_path):
    """Ids out of the embedding's range pass the signature check (it knows dtypes and shapes, not values), so
    the model raises inside a batch: that request gets 500 with the op's message, the others of its batch their
    answers (batching)."""
    from jit2triton.serving import app

    torch.manual_seed(2)
    example = torch.randint(0, 10, (2, 3))
    traced = torch.jit.trace(Embed().eval(), (example,))
    path = tmp_path / "embed.j2t"
    batch = jit2triton.Dim("batch", min=1, max=16)
    jit2triton.convert(traced, example_inputs=(example,), dynamic_shapes={"ids": {0: batch}}).save(path)
    serve.run(app(str(path), num_cpus=0.25, batch_wait_timeout_s=0.2,
                  logging_config={"enable_access_log": False}), name="embed", route_prefix="/embed")
    try:
        requests = [torch.randint(0, 10, (n, 3)) for n in (2, 1, 3, 2, 1, 4)]
        requests[2][1, 1] = 12  # out of the embedding's range
        with ThreadPoolExecutor(len(requests)) as pool:  # together, within the 0.2 s a batch waits for
            answers = list(pool.map(lambda ids: Client(server).send("POST", "/embed", _body(inputs=[ids.tolist()])),
                                    requests))
        for i, (ids, (status, data)) in enumerate(zip(requests, answers)):
            if i == 2:
                assert status == 500 and "the model failed on this request" in json.loads(data)["error"], data
            else:
                assert status == 200 and torch.allclose(_decode_answer(data), traced(ids), atol=1e-6), (i, data)
        stats = json.loads(Client(server).send("GET", "/embed/stats")[1])
        assert stats["failed"] == 1 and stats["answered"] == 5, stats
    finally:
        serve.delete("embed")
