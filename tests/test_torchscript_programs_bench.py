"""benchmarks/torchscript_programs.py runs end to end on the CPU (issue 46): two cheap host-step programs converted,
checked against TorchScript on a fresh input and timed; its table has their rows, with numbers that parse and a
small error, and its JSON says the same. torch.compile is left out here (its first compile alone costs more than
this test's budget); the GPU machine's run covers it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = {"int_list_ops": "int and list ops (200 iterations)", "list_loop": "loop over List[Tensor], scripted"}


def test_the_benchmark_prints_a_row_per_program_with_numbers_and_a_small_error(tmp_path) -> None:
    out = tmp_path / "results.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "benchmarks/torchscript_programs.py", "--quick", "--device", "cpu",
                           "--programs", ",".join(PROGRAMS), "--no-compile", "--threads", "1", "--rounds", "2",
                           "--calls", "1", "--warmup", "1", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    table = done.stdout[done.stdout.index("| program |"):].splitlines()
    assert len(table) == 2 + len(PROGRAMS), done.stdout
    for line, title in zip(table[2:], PROGRAMS.values()):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == title, line
        convert_s, nodes, error, torchscript_us, package_us, ratio = cells[1:7]
        assert float(convert_s) >= 0, line  # (seconds to one decimal: a cached conversion prints 0.0)
        kernels, fallbacks, vendor = (int(n) for n in nodes.split(" / "))
        assert kernels > 0, line  # both programs keep generated kernels
        assert float(error) < 1e-5, line  # a fast wrong answer must not show as a win
        assert float(torchscript_us) > 0 and float(package_us) > 0, line
        assert abs(float(ratio.rstrip("x")) - float(torchscript_us) / float(package_us)) < 0.01, line
    results = json.loads(out.read_text())
    assert results["setting"]["device"].startswith("CPU")
    assert [row["program"] for row in results["rows"]] == list(PROGRAMS)
    assert all(row["runtime"] == "cpp" and row["max_rel_error"] < 1e-5 for row in results["rows"])


def test_a_program_whose_library_is_missing_is_listed_as_skipped() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torchscript_programs as bench
    missing = [name for name, entry in bench.PROGRAMS.items()
               if entry.library and bench.importlib.util.find_spec(entry.library) is None]
    if not missing:
        pytest.skip("torchvision, torchaudio and torch_geometric are all installed here")
    row = bench.measure(missing[0], None, "")
    assert row["skipped"] == f"skipped: {bench.PROGRAMS[missing[0]].library} not installed"
    assert bench.table_line(row).startswith(f"| {bench.PROGRAMS[missing[0]].title} | skipped: ")
