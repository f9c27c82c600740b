"""Serving that fits its ecosystem: the KServe v2 / Triton Inference Server protocol (read and written without Ray,
then a `tritonclient.http` round trip), Prometheus metrics scraped from /metrics, health and 404s, the simple JSON
form's one-input and missing-input cases, and a local Ray whose processes listen on loopback only. One local Ray
Serve app serves the module's tests; every answer is checked against the TorchScript model on fresh random inputs."""
import json
import os
import socket
import time
import urllib.error
import urllib.request
import warnings

import pytest
import torch

import jit2triton
from jit2triton.deploy.serving import v2
from jit2triton.errors import InputError
from helpers import LinearGeluNorm
from serving_packages import reader_for
from listening_sockets import LOOPBACK, listening, process_tree

try:
    with warnings.catch_warnings():  # Ray's own pydantic deprecations, not ours to fix
        warnings.simplefilter("ignore", DeprecationWarning)
        import ray  # imported before the server starts, as the CLI does: start_local must still keep Ray on loopback
        from ray import serve
except ImportError:
    ray = serve = None
needs_ray = pytest.mark.skipif(ray is None, reason="ray[serve] is not installed (pip install -e '.[serve]')")

FEATURES, ROUTE, MODEL = 8, "/v2app", "mlp"


def _tensor(dtype, *shape):
    return {"type": "Tensor", "dtype": dtype, "shape": list(shape)}


def _output(dtype, *dims):
    return {"type": "Tensor", "dtype": dtype, "shape": [2] * len(dims), "dims": list(dims)}


# x: float32[batch, seq, 4], ids: int64[batch, seq] -> (float32[batch, seq, 4], Dict{mask: bool[batch, seq]})
SIGNATURE = {
    "inputs": [{"name": "x", **_tensor("float32", "batch", "seq", 4)}, {"name": "ids", **_tensor("int64", "batch", "seq")}],
    "outputs": {"type": "Tuple", "items": [_output("float32", "batch", "seq", 4),
                                           {"type": "Dict", "items": {"mask": _output("bool", "batch", "seq")}}]},
    "dims": {"batch": {"min": 1, "max": 16}, "seq": {"min": 1, "max": 8}},
}
OUTPUTS = ["output__0", "output__1.mask"]
ONE_INPUT = {"inputs": [{"name": "x", **_tensor("float32", "batch", 4)}], "outputs": _output("float32", "batch", 4),
             "dims": {"batch": {"min": 1, "max": 16}}}


def _reader(name):
    return reader_for(name)


def _infer_body(doc: dict, binary: bytes = b"") -> tuple[bytes, str]:
    head = json.dumps(doc).encode()
    return head + binary, str(len(head))


# ---- without Ray ----

def test_the_only_input_may_be_sent_as_its_tensor_and_a_missing_input_is_named():
    x = torch.randn(4, 4)  # 4 rows: read as 4 inputs by position before the fix
    for sent in (x.tolist(), [x.tolist()], {"x": x.tolist()}):
        assert torch.equal(_reader("one_input").from_json(json.dumps({"inputs": sent}).encode()).inputs[0], x)
    three = torch.randn(2, 3, 4).tolist()
    for sent in ({"x": three}, three, [three]):  # ids is required: named, whichever way x came
        with pytest.raises(InputError, match=r"input 'ids' missing, without a default; the model takes \(x, ids\)"):
            _reader("tagger").from_json(json.dumps({"inputs": sent}).encode())


def test_v2_metadata_names_each_output_of_the_structure():
    meta = v2.model_metadata("m", SIGNATURE)
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, -1, 4]},
                              {"name": "ids", "datatype": "INT64", "shape": [-1, -1]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        ("output__0", "FP32", [-1, -1, 4]), ("output__1.mask", "BOOL", [-1, -1])]  # a fixed dim keeps its size
    assert [n for n, _ in v2.flatten_outputs((torch.zeros(1), {"mask": torch.zeros(1)}))] == OUTPUTS


def test_v2_infer_reads_json_and_binary_tensors_and_writes_the_wanted_outputs():
    x, ids = torch.randn(3, 5, 4), torch.randint(0, 100, (3, 5))
    doc = {"id": "7", "inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [3, 5], "data": ids.flatten().tolist()},
        {"name": "x", "datatype": "FP32", "shape": [3, 5, 4], "parameters": {"binary_data_size": x.numel() * 4}}],
        "outputs": [{"name": "output__1.mask", "parameters": {"binary_data": True}}, {"name": "output__0"}]}
    wanted = v2.read_infer(*_infer_body(doc, x.numpy().tobytes()), SIGNATURE["inputs"], OUTPUTS)
    assert torch.equal(wanted.named["x"], x) and torch.equal(wanted.named["ids"], ids)  # bit-exact both ways
    body, headers = v2.write_infer("m", wanted, (x * 2, {"mask": ids > 50}))
    json_size = int(headers["inference-header-content-length"])
    answer = json.loads(body[:json_size])
    assert answer["id"] == "7" and answer["model_name"] == "m"
    first, mask = answer["outputs"]
    assert (first["name"], first["datatype"], first["shape"]) == ("output__0", "FP32", [3, 5, 4])
    assert torch.equal(torch.tensor(first["data"]).reshape(3, 5, 4), x * 2)
    assert (mask["name"], mask["datatype"], mask["parameters"]) == ("output__1.mask", "BOOL", {"binary_data_size": 15})
    assert torch.equal(torch.frombuffer(bytearray(body[json_size:]), dtype=torch.bool).reshape(3, 5), ids > 50)
    only = v2.read_infer(*_infer_body({**doc, "outputs": [{"name": "output__0"}]}, x.numpy().tobytes()),
                         SIGNATURE["inputs"], OUTPUTS)
    body, headers = v2.write_infer("m", only, (x, {"mask": ids > 0}))
    assert "inference-header-content-length" not in headers and len(json.loads(body)["outputs"]) == 1
    body, _ = v2.write_infer("m", v2.InferRequest({}), (x, None, 3))  # None has no tensor; a number is one
    assert [(o["name"], o["datatype"], o["shape"]) for o in json.loads(body)["outputs"]] == [
        ("output__0", "FP32", [3, 5, 4]), ("output__2", "INT64", [])]


X_JSON = {"name": "x", "datatype": "FP32", "shape": [1, 1, 4], "data": [0.5] * 4}
IDS_JSON = {"name": "ids", "datatype": "INT64", "shape": [1, 1], "data": [3]}


@pytest.mark.parametrize("doc, binary, message", [
    ({"inputs": []}, b"", "a JSON object with \"inputs\": a list of named tensors"),
    ({"inputs": [{**X_JSON, "name": "y"}]}, b"", "unknown input 'y'; the model takes (x, ids)"),
    ({"inputs": [{**X_JSON, "datatype": "FP64"}, IDS_JSON]}, b"", "input 'x' is FP32, got datatype \"FP64\""),
    ({"inputs": [{**X_JSON, "shape": [1, 2, 4]}, IDS_JSON]}, b"", "\"shape\" [1, 2, 4] holds 8 values, \"data\" 4"),
    ({"inputs": [X_JSON, {**IDS_JSON, "data": [1.5]}]}, b"", "input 'ids': expected INT64 values, got FP32 ones"),
    ({"inputs": [X_JSON, {**IDS_JSON, "shape": [1, -1]}]}, b"", "\"shape\" must be a list of sizes"),
    ({"inputs": [X_JSON, {**IDS_JSON, "data": None, "parameters": {"binary_data_size": 8}}]}, b"\0" * 4,
     "INT64[1, 1] is 8 bytes, binary_data_size says 8 and 4 remain"),
    ({"inputs": [X_JSON, IDS_JSON]}, b"\0" * 4, "4 bytes of binary data no input claims"),
    ({"inputs": [X_JSON, IDS_JSON], "outputs": [{"name": "logits"}]}, b"", "unknown output 'logits'"),
])
def test_a_bad_v2_request_is_an_input_error_that_says_what_to_send(doc, binary, message):
    with pytest.raises(InputError) as caught:
        v2.read_infer(*_infer_body(doc, binary), SIGNATURE["inputs"], OUTPUTS)
    assert message in str(caught.value)


# ---- a Ray Serve app on loopback ----

@pytest.fixture(scope="module")
def package(tmp_path_factory):
    torch.manual_seed(0)
    example = torch.randn(2, 3, FEATURES)
    traced = torch.jit.trace(LinearGeluNorm(FEATURES).eval(), (example,))
    batch, seq = jit2triton.Dim("batch", min=1, max=16), jit2triton.Dim("seq", min=1, max=8)
    path = tmp_path_factory.mktemp("serving_v2") / f"{MODEL}.j2t"
    jit2triton.convert(traced, example_inputs=(example,), dynamic_shapes={"x": {0: batch, 1: seq}},
                       backend="cpp").save(path)
    return str(path), traced


@pytest.fixture(scope="module")
def server(package, cpp_runtime):
    """One replica of the package on a local Ray started by start_local on loopback; yields the HTTP port. Serve
    and Ray are shut down after the module's tests, so no Ray process outlives them."""
    if ray is None:
        pytest.skip("ray[serve] is not installed")
    from jit2triton.serving import app, start_local, stop_local

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start_local(port=port, num_cpus=2, log_to_driver=False)
    try:
        serve.run(app(package[0], runtime="cpp", num_cpus=0.5, num_threads=1, max_batch_size=16,
                      logging_config={"enable_access_log": False}), name="v2", route_prefix=ROUTE)
        yield port
    finally:
        stop_local()


def _get(port: int, path: str) -> tuple:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{ROUTE}{path}", timeout=60) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers


def _post(port: int, path: str, doc: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{ROUTE}{path}", data=json.dumps(doc).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@needs_ray
def test_rays_processes_listen_on_loopback_only(server):
    sockets = listening(process_tree(os.getpid()))
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # the listing sees Ray's own processes
    assert any(port == server for _, _, port in sockets), sockets  # and Serve's HTTP proxy
    assert all(address in LOOPBACK for _, address, _ in sockets), [s for s in sockets if s[1] not in LOOPBACK]


@needs_ray
def test_health_and_metadata_answer_and_unknown_paths_are_404(server):
    for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready",
                 f"/v2/models/{MODEL}/versions/1/ready"):
        assert _get(server, path)[0] == 200, path
    status, data, _ = _get(server, f"/v2/models/{MODEL}")
    assert status == 200 and json.loads(data)["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, -1, 8]}]
    assert json.loads(_get(server, "/v2")[1])["extensions"] == ["binary_tensor_data", "model_configuration",
                                                                "statistics"]
    assert "signature" in json.loads(_get(server, "")[1])  # the simple form's GET stays
    for path in ("/health", "/nope", "/v2/models/other", "/v2/models/other/ready"):
        status, data, _ = _get(server, path)
        assert status == 404 and "signature" not in json.loads(data) and json.loads(data)["error"], (path, data)
    status, doc = _post(server, "/v2/models/other/infer", {"inputs": []})
    assert status == 404 and "unknown model 'other'; this server serves 'mlp'" in doc["error"]


@needs_ray
def test_tritonclient_round_trip_as_json_and_binary(server, package):
    httpclient = pytest.importorskip("tritonclient.http", reason="pip install 'tritonclient[http]'")
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server}{ROUTE}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    assert client.get_model_metadata(MODEL)["outputs"][0]["name"] == "output__0"
    for rows, binary, wanted in ((3, True, None), (1, False, False), (5, True, False), (2, False, True)):
        x = torch.randn(rows, 4, FEATURES) * 2 + 0.5
        given = httpclient.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x.numpy(), binary_data=binary)
        outputs = None if wanted is None else [httpclient.InferRequestedOutput("output__0", binary_data=wanted)]
        got = torch.from_numpy(client.infer(MODEL, [given], outputs=outputs).as_numpy("output__0").copy())
        assert torch.allclose(got, package[1](x), rtol=1e-4, atol=1e-5), (rows, binary, wanted)
    wrong = httpclient.InferInput("x", [1, 2, FEATURES], "FP64")
    wrong.set_data_from_numpy(torch.randn(1, 2, FEATURES, dtype=torch.float64).numpy())
    with pytest.raises(InferenceServerException, match="input 'x' is FP32, got datatype \"FP64\""):
        client.infer(MODEL, [wrong])


@needs_ray
def test_prometheus_metrics_count_requests_latency_queue_and_batch_size(server, package):
    from prometheus_client.parser import text_string_to_metric_families

    x = torch.randn(2, 3, FEATURES)
    before = _settled_totals(server)
    for _ in range(3):
        status, doc = _post(server, "", {"inputs": x.tolist()})  # the only input, sent as its tensor
        assert status == 200 and torch.allclose(torch.tensor(doc["outputs"]), package[1](x), rtol=1e-4, atol=1e-5)
    assert _post(server, "", {"inputs": {"y": [1.0]}})[0] == 400
    deadline, families = time.monotonic() + 30, {}
    while time.monotonic() < deadline:  # Ray exports what replicas record every second (start_local)
        status, data, headers = _get(server, "/metrics")
        assert status == 200 and headers.get("content-type", "").startswith("text/plain"), (status, headers)
        families = {f.name: f for f in text_string_to_metric_families(data.decode())}
        answered = {(s.labels.get("protocol"), s.labels.get("code")): s.value
                    for s in getattr(families.get("ray_jit2triton_requests"), "samples", ())
                    if s.name.endswith("_total")}
        if answered.get(("json", "200"), 0) >= 3 and answered.get(("json", "400"), 0) >= 1 and (
                _exact_totals(server, families)["ray_jit2triton_batch_rows_count"] >=
                before.get("ray_jit2triton_batch_rows_count", 0) + 3):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the requests were never counted: {sorted(families)}")
    for name in ("ray_jit2triton_request_seconds", "ray_jit2triton_queue_seconds", "ray_jit2triton_model_seconds",
                 "ray_jit2triton_batch_rows", "ray_jit2triton_batch_requests"):
        assert families[name].type == "histogram", name
        counts = [s.value for s in families[name].samples if s.name.endswith("_count")]
        assert counts and sum(counts) >= 3, (name, counts)
    assert all(s.labels["model"] == MODEL for s in families["ray_jit2triton_batch_rows"].samples)
    # exact, not Ray's bucket midpoints: 3 calls of 2 rows each (one request at a time) sum to 6 rows, not 3 x 1.5
    totals = _exact_totals(server, families)
    assert totals["ray_jit2triton_batch_rows_sum"] - before.get("ray_jit2triton_batch_rows_sum", 0) == 6, totals
    assert totals["ray_jit2triton_batch_rows_count"] - before.get("ray_jit2triton_batch_rows_count", 0) == 3, totals


def _settled_totals(port: int) -> dict:
    """_exact_totals once the earlier tests' requests are all exported: two reads an export period apart agree."""
    totals, deadline = _exact_totals(port), time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(1.2)  # start_local has Ray export every second
        again = _exact_totals(port)
        if again == totals:
            return totals
        totals = again
    raise AssertionError(f"the metrics kept changing: {totals}")


def _exact_totals(port: int, families: dict = None) -> dict:
    """The batch_rows histogram's _sum and _count, summed over replicas."""
    from prometheus_client.parser import text_string_to_metric_families

    if families is None:
        families = {f.name: f for f in text_string_to_metric_families(_get(port, "/metrics")[1].decode())}
    totals: dict = {}
    for sample in getattr(families.get("ray_jit2triton_batch_rows"), "samples", ()):
        if sample.name.endswith(("_sum", "_count")):
            totals[sample.name] = totals.get(sample.name, 0) + sample.value
    return totals
