"""Compile jobs share one machine-wide limit (emitters/jobs.py): as many slots as the cores this process may use or
JIT2TRITON_JOBS, held across threads and processes alike, freed when a holder dies, and held by g++'s compiles."""
import multiprocessing
import os
import select
import threading
import time

import pytest

from jit2triton.emitters import compile_cpp, jobs
from jit2triton.errors import ConversionError


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JIT2TRITON_CACHE", str(tmp_path / "cache"))


def test_slots_are_the_cores_this_process_may_use_or_what_the_user_sets(monkeypatch):
    monkeypatch.delenv(jobs.ENV, raising=False)
    monkeypatch.setattr(jobs.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    monkeypatch.setattr(jobs.os, "cpu_count", lambda: 64)
    assert jobs.job_slots() == 3
    monkeypatch.setenv(jobs.ENV, "5")
    assert jobs.job_slots() == 5
    for bad in ("0", "-2", "four"):
        monkeypatch.setenv(jobs.ENV, bad)
        with pytest.raises(ConversionError, match=f"JIT2TRITON_JOBS='{bad}' is not a number of compile jobs"):
            jobs.job_slots()


def test_threads_never_hold_more_slots_than_there_are(monkeypatch):
    monkeypatch.setenv(jobs.ENV, "2")
    running, most, lock = [0], [0], threading.Lock()

    def job():
        with jobs.job_slot():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
    threads = [threading.Thread(target=job) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 2


def _hold_slot(ready_fd: int) -> None:
    with jobs.job_slot():
        os.write(ready_fd, b"1")
        time.sleep(30)


def test_another_process_s_slot_is_waited_for_and_freed_when_it_dies(monkeypatch):
    """A slot held by another conversion is not taken; one whose holder was killed is free at once."""
    monkeypatch.setenv(jobs.ENV, "1")
    ready, said = os.pipe()
    holder = multiprocessing.get_context("fork").Process(target=_hold_slot, args=(said,))
    holder.start()
    try:
        assert select.select([ready], [], [], 10)[0] and os.read(ready, 1) == b"1"
        taken = threading.Event()

        def wait_for_slot():
            with jobs.job_slot():
                taken.set()
        threading.Thread(target=wait_for_slot, daemon=True).start()
        assert not taken.wait(0.3)  # the other process holds the one slot
        holder.kill()  # killed while holding it: no release ran
        holder.join()
        assert taken.wait(5)
    finally:
        holder.kill()
        os.close(ready)
        os.close(said)


def test_a_cpp_compile_holds_a_slot(monkeypatch):
    """g++ runs only while its conversion holds a slot: with the one slot taken it waits."""
    if compile_cpp.find_compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv(jobs.ENV, "1")
    source = f"// {os.getpid()} {time.time()}\nextern \"C\" int answer() {{ return 42; }}\n"  # never cached
    built = []
    with jobs.job_slot():
        compiling = threading.Thread(target=lambda: built.append(compile_cpp.compile_library(source, compile_cpp.host_isa())))
        compiling.start()
        compiling.join(1.0)
        assert not built
    compiling.join(30)
    assert built and built[0][:4] == b"\x7fELF"
