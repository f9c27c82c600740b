"""`jit2triton serve DIR`: a model repository of two packages served at once, through tritonclient (metadata with
real dims, inference checked against TorchScript on fresh random inputs, config, the repository index, load and
unload, statistics), errors in the client's words, Ray's processes on loopback while the HTTP server listens on the
address asked for, and SIGTERM: drained, "stopped", no process left. One server for the module (Ray starts once);
the pure parts (metadata, config, statistics, metric families, messages, naming) are tested without Ray."""
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings

import pytest
import torch

from serving_models import VOCAB, write_repository
from jit2triton.deploy.serving import messages, v2
from jit2triton.deploy.serving.local_ray import is_loopback
from jit2triton.deploy.serving.metrics import serving_families
from jit2triton.deploy.serving.repository import repository_models
from jit2triton.deploy.serving.stats import ModelStatistics, as_triton, merged
from listening_sockets import LOOPBACK, listening, process_tree, still_running

try:
    with warnings.catch_warnings():  # Ray's own pydantic deprecations, not ours to fix
        warnings.simplefilter("ignore", DeprecationWarning)
        import ray  # noqa: F401
except ImportError:
    ray = None
HOST = "127.0.0.2"  # a loopback address other than 127.0.0.1: Ray's must not follow it


# ---- without Ray ----

def test_v2_metadata_gives_fixed_dims_their_size_and_dynamic_ones_minus_1():
    signature = {"inputs": [{"name": "ids", "type": "Tensor", "dtype": "int64", "shape": ["batch", 3]}],
                 "outputs": {"type": "Tuple", "items": [
                     {"type": "Tensor", "dtype": "float32", "shape": [2, 8], "dims": ["batch", "8"]},
                     {"type": "Tensor", "dtype": "float32", "shape": [2, 6], "dims": ["batch", "batch*3"]}]}}
    meta = v2.model_metadata("m", signature)
    assert [t["shape"] for t in meta["inputs"] + meta["outputs"]] == [[-1, 3], [-1, 8], [-1, -1]]
    config = v2.model_config(meta, 16, 0.005, 2, "cpu")
    assert config["max_batch_size"] == 16 and config["input"] == [{"name": "ids", "data_type": "TYPE_INT64",
                                                                   "dims": [3]}]
    assert config["output"][0]["dims"] == [8] and config["dynamic_batching"] == {"max_queue_delay_microseconds": 5000}
    assert config["instance_group"] == [{"name": "m", "kind": "KIND_CPU", "count": 2}]
    assert v2.model_config(meta, 0, 0.005, None, "cuda")["input"][0]["dims"] == [-1, 3]  # no batching: every dim


def test_statistics_are_exact_and_summed_over_replicas():
    one, two = ModelStatistics(), ModelStatistics()
    one.request(True, 5_000, 1_000, 200)
    one.call([300], 3, 10, 2_000, 20)
    two.request(False, 700, 600)
    two.call([100, 50], 4, 30, 4_000, 40)
    stats = as_triton("m", "1", merged([one.snapshot(), two.snapshot()]))
    assert (stats["inference_count"], stats["execution_count"]) == (7, 2)
    requests = stats["inference_stats"]
    assert requests["success"] == {"count": 1, "ns": 5_000} and requests["fail"] == {"count": 1, "ns": 700}
    assert requests["queue"] == {"count": 3, "ns": 450} and requests["compute_infer"] == {"count": 3, "ns": 10_000}
    assert [b["batch_size"] for b in stats["batch_stats"]] == [3, 4]
    assert stats["batch_stats"][1]["compute_infer"] == {"count": 1, "ns": 4_000}


def test_metrics_show_the_exact_counters_as_a_histograms_sum_and_count():
    labels = '{WorkerId="w",model="m"}'
    export = "\n".join([
        "# HELP ray_jit2triton_batch_rows Rows", "# TYPE ray_jit2triton_batch_rows histogram",
        f'ray_jit2triton_batch_rows_bucket{labels[:-1]},le="1.0"}} 7.0', f"ray_jit2triton_batch_rows_count{labels} 7.0",
        f"ray_jit2triton_batch_rows_sum{labels} 3.5",  # Ray's midpoint estimate
        "# HELP ray_other_total x", "# TYPE ray_other_total counter", "ray_other_total 1.0",
        "# HELP ray_jit2triton_batch_rows_exact_sum_total s", "# TYPE ray_jit2triton_batch_rows_exact_sum_total counter",
        f"ray_jit2triton_batch_rows_exact_sum_total{labels} 7.0",
        "# TYPE ray_jit2triton_batch_rows_exact_count_total counter",
        f"ray_jit2triton_batch_rows_exact_count_total{labels} 7.0"])
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(serving_families(export))}
    assert list(families) == ["ray_jit2triton_batch_rows"]  # Ray's other metrics and the paired counters left out
    samples = {s.name: s.value for s in families["ray_jit2triton_batch_rows"].samples}
    assert samples["ray_jit2triton_batch_rows_sum"] == 7.0 and samples["ray_jit2triton_batch_rows_count"] == 7.0


def test_errors_speak_to_an_http_client():
    refused = ("input 0 ('ids'): expected int64[batch, 3] on cpu, got int64[1, 4] on cpu. The package was converted "
               "for that signature; convert again with example inputs of the shape and dtype you need")
    assert messages.refused(refused) == "input 0 ('ids'): expected int64[batch, 3] on cpu, got int64[1, 4] on cpu"
    assert messages.refused("axis 0 is dim batch, whose range is 1..16; got 17. Convert again with a wider Dim to "
                            "serve that size") == "axis 0 is dim batch, whose range is 1..16; got 17"
    failed = ("aten::_assert_async.msg failed (model source m.py:6  return self.e(ids)): RuntimeError: index out of "
              "range in self: %ids holds an index outside [0, 10) for aten::embedding; %x_3 too")
    assert messages.failed(failed, ["ids"]) == (
        "the model failed on this request: index out of range: input 'ids' holds an index outside [0, 10) for "
        "aten::embedding; a value the model computed from the inputs too")


def test_a_repository_names_each_model_by_its_file_and_refuses_clashes(tmp_path):
    for name in ("a.j2t", "b.j2t", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [m.name for m in repository_models([str(tmp_path)], {})] == ["a", "b"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.j2t").write_bytes(b"")
    with pytest.raises(ValueError, match="two packages would be served as model 'a'"):
        repository_models([str(tmp_path), str(tmp_path / "other" / "a.j2t")], {})
    (tmp_path / "stats.j2t").write_bytes(b"")
    with pytest.raises(ValueError, match="may not be named 'stats'"):
        repository_models([str(tmp_path)], {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .j2t package"):
        repository_models([str(tmp_path / "empty")], {})


def test_loopback_is_all_of_127_8_and_ipv6s_one():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "127.255.0.9", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "192.0.2.2", "::", "fd00::2", "example.com"))


# ---- one `jit2triton serve DIR` for the module ----

@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """emb (dynamic batch, batched) and two (static, two inputs), and their TorchScript models."""
    return write_repository(tmp_path_factory.mktemp("repository"))


class Server:
    def __init__(self, process: subprocess.Popen, port: int) -> None:
        self.process, self.port, self.lines = process, port, []
        self.processes: dict = {}  # every process of the server's tree, seen while it served
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def url(self, path: str = "") -> str:
        return f"http://{HOST}:{self.port}{path}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(30)


@pytest.fixture(scope="module")
def server(repository):
    if ray is None:
        pytest.skip("ray[serve] is not installed")
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "jit2triton.cli", "serve", repository[0], "--host", HOST,
                                "--port", str(port), "--max-batch", "8", "--batch-wait-ms", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    running = Server(process, port)
    try:
        deadline = time.monotonic() + 180
        while not any(line.startswith("try: ") for line in running.lines):  # printed once every app is up
            assert process.poll() is None and time.monotonic() < deadline, running.output
            time.sleep(0.3)
        running.processes = {pid: still_running(pid) for pid in process_tree(process.pid) if pid != process.pid}
        yield running
    finally:
        running.stop()


def _call(server: Server, method: str, path: str, doc=None) -> tuple[int, object]:
    request = urllib.request.Request(server.url(path), method=method,
                                     data=None if doc is None else json.dumps(doc).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.skipif(ray is None, reason="ray[serve] is not installed")
def test_rays_processes_stay_on_loopback_and_http_listens_where_asked(server):
    sockets = listening(process_tree(server.process.pid))
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in sockets}, sockets
    # HTTP where asked, and every other socket on loopback (one of Ray's may take the same port number on another
    # address: the port was free there when the test chose it; seen once, on ::ffff:127.0.0.1)
    assert [address for _, address, port in sockets if port == server.port and address not in LOOPBACK] == [HOST], \
        sockets
    assert all(address in LOOPBACK for _, address, port in sockets if (address, port) != (HOST, server.port)), sockets


@pytest.mark.skipif(ray is None, reason="ray[serve] is not installed")
def test_tritonclient_serves_both_models_with_real_dims_config_index_and_statistics(server, repository):
    httpclient = pytest.importorskip("tritonclient.http", reason="pip install 'tritonclient[http]'")
    client = httpclient.InferenceServerClient(url=f"{HOST}:{server.port}")
    models = repository[1]
    assert client.is_server_ready() and client.is_model_ready("emb") and client.is_model_ready("two")
    assert client.get_model_metadata("emb")["outputs"] == [{"name": "output__0", "datatype": "FP32", "shape": [-1, 8]}]
    assert [t["shape"] for t in client.get_model_metadata("two")["inputs"]] == [[2, 4], [2, 3]]
    config = client.get_model_config("emb")
    assert config["max_batch_size"] == 8 and config["input"] == [{"name": "ids", "data_type": "TYPE_INT64",
                                                                  "dims": [3]}]
    assert client.get_model_config("two")["max_batch_size"] == 0
    assert {m["name"]: m["state"] for m in client.get_model_repository_index()} == {"emb": "READY", "two": "READY"}
    before = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}

    rows = 0
    for n in (1, 3, 2):
        ids = torch.randint(0, VOCAB, (n, 3))
        given = httpclient.InferInput("ids", [n, 3], "INT64")
        given.set_data_from_numpy(ids.numpy())
        got = client.infer("emb", [given]).as_numpy("output__0")
        assert torch.allclose(torch.from_numpy(got.copy()), models["emb"](ids), atol=1e-5)
        rows += n
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    inputs = [httpclient.InferInput("x", [2, 4], "FP32"), httpclient.InferInput("y", [2, 3], "FP32")]
    inputs[0].set_data_from_numpy(x.numpy())
    inputs[1].set_data_from_numpy(y.numpy(), binary_data=False)
    got = client.infer("two", inputs, model_version="1").as_numpy("output__0")
    assert torch.allclose(torch.from_numpy(got.copy()), models["two"](x, y), atol=1e-6)

    stats = client.get_inference_statistics("emb")["model_stats"][0]
    assert stats["name"] == "emb" and stats["inference_count"] - before["emb"]["inference_count"] == rows
    success = stats["inference_stats"]["success"]
    assert success["count"] - before["emb"]["inference_stats"]["success"]["count"] == 3 and success["ns"] > 0
    assert stats["execution_count"] - before["emb"]["execution_count"] == 3  # one request at a time: one call each
    both = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    assert both["two"]["inference_stats"]["success"]["count"] == before["two"]["inference_stats"]["success"]["count"] + 1


@pytest.mark.skipif(ray is None, reason="ray[serve] is not installed")
def test_errors_name_what_the_client_sent(server):
    status, doc = _call(server, "POST", "/v2/models/emb/infer", {"inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": [1, VOCAB + 2, 0]}]})
    assert status == 500 and "input 'ids' holds an index outside [0, 10)" in doc["error"], doc
    assert "%" not in doc["error"] and "model source" not in doc["error"], doc
    status, doc = _call(server, "POST", "/v2/models/emb/infer", {"inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    assert status == 400 and doc["error"].endswith("got int64[1, 4] on cpu"), doc
    assert "convert" not in doc["error"].lower(), doc
    status, doc = _call(server, "GET", "/v2/models/nope")
    assert status == 404 and doc["error"] == "unknown model 'nope'; this server serves 'emb', 'two'", doc
    status, doc = _call(server, "GET", "/v2/models/emb/versions/2")
    assert status == 404 and "has no version '2'" in doc["error"], doc


@pytest.mark.skipif(ray is None, reason="ray[serve] is not installed")
def test_a_model_unloaded_is_unavailable_and_loads_again(server, repository):
    assert _call(server, "POST", "/v2/repository/models/two/unload") == (200, {})
    index = {m["name"]: m for m in _call(server, "POST", "/v2/repository/index")[1]}
    assert index["two"]["state"] == "UNAVAILABLE" and index["emb"]["state"] == "READY", index
    status, doc = _call(server, "GET", "/v2/models/two")
    assert status == 404 and "POST /v2/repository/models/two/load loads it" in doc["error"], doc
    # one model loaded: the simple JSON form answers at / for it
    assert _call(server, "GET", "/")[1]["max_rows_per_call"] == 8
    ids = torch.randint(0, VOCAB, (2, 3))
    status, doc = _call(server, "POST", "/", {"inputs": ids.tolist()})
    assert status == 200 and torch.allclose(torch.tensor(doc["outputs"]), repository[1]["emb"](ids), atol=1e-5), doc
    assert _call(server, "POST", "/v2/repository/models/two/load") == (200, {})
    assert _call(server, "GET", "/v2/models/two/ready")[0] == 200
    status, doc = _call(server, "POST", "/v2/repository/models/three/load")
    assert status == 404 and "unknown model 'three'" in doc["error"], doc


@pytest.mark.skipif(ray is None, reason="ray[serve] is not installed")
def test_sigterm_drains_says_stopped_and_leaves_no_process(server):
    """Last: it stops the module's server."""
    ids = torch.randint(0, VOCAB, (1, 3))
    answer = []

    def send():
        try:
            answer.append(_call(server, "POST", "/v2/models/emb/infer", {"inputs": [
                {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": ids.flatten().tolist()}]}))
        except OSError as err:  # not accepted before the proxy closed: refused, never half-answered
            answer.append((None, err))

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.05)  # the request on its way: SIGTERM drains what the replicas hold
    server.stop(signal.SIGTERM)
    sender.join(60)
    output = server.output
    assert server.process.returncode == 0 and output.rstrip().endswith("stopped"), output[-2000:]
    assert "SIGTERM received" not in output and "Traceback" not in output, output[-2000:]
    assert "\x1b[" not in output and "POST /v2" not in output, output[-2000:]  # no colour, no access lines
    assert f"serving emb.j2t at http://{HOST}:{server.port}/v2/models/emb with 1 replica, batching dim batch, up to " \
           "8 rows per call" in output, output
    left = [pid for pid, start in server.processes.items() if still_running(pid) == start]
    assert server.processes and not left, [(pid, _name(pid)) for pid in left]
    assert answer and answer[0][0] in (200, None), answer  # answered, or refused before it was taken


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode()[:100]
    except OSError:
        return "?"
