"""How many compile jobs run at once, machine-wide: every conversion on the machine shares one limit.

A conversion compiles in parallel (Triton's compiler in threads, g++ as a child process). Sized each to the
machine (a pool of os.cpu_count() threads per process), four conversions side by side ran four times as many
compiles as there were cores, and DenseNet-121, 24.5 s alone on an H200, did not convert in 240 s.

The limit is a pool of slots, one lock file each under the cache (`jobs/slot-<i>`); a job holds a slot's `flock`
while it runs. Why this and not the alternatives:
- a count in a shared file, or a POSIX named semaphore, stays taken when its holder is killed; an `flock` is
  released by the kernel when the process holding it dies, however it dies: a crashed conversion leaks no slot;
- an environment variable alone limits one process, not the several that do not know of each other;
- a daemon handing out tokens is one more thing to start, find and keep alive.
The slots are as many as the cores this process may use (`os.sched_getaffinity`: a container or `taskset` gives
fewer than the machine has), or JIT2TRITON_JOBS where the user sets it; processes whose counts differ share the
slots they have in common. The cache is per user, so are the slots.
"""
from __future__ import annotations

import os
import random
import time
from contextlib import contextmanager
from typing import Iterator

from jit2triton.errors import ConversionError

from .cache import cache_dir

try:
    import fcntl
except ImportError:  # Windows: no flock; each process keeps to its own cores' count, unshared
    fcntl = None

ENV = "JIT2TRITON_JOBS"
POLL_S = 0.02  # a job waiting for a slot looks again this often (a kernel's compile takes 0.1-2 s)


def job_slots() -> int:
    """How many compile jobs may run at once: JIT2TRITON_JOBS, else the cores this process may run on."""
    asked = os.environ.get(ENV, "").strip()
    if asked:
        if not asked.isdigit() or int(asked) < 1:
            raise ConversionError(f"{ENV}={asked!r} is not a number of compile jobs: set it to a whole number of 1 "
                                  f"or more (or unset it: the cores this process may use)")
        return int(asked)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@contextmanager
def job_slot() -> Iterator[None]:
    """Hold one of the machine's compile slots while the block runs (waiting for one to come free)."""
    if fcntl is None:
        yield
        return
    fd = _take_slot(job_slots())
    try:
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


def _take_slot(slots: int) -> int:
    """An open descriptor holding one slot's lock. The first slot tried is a random one, so that jobs waiting at the
    same time do not all queue on slot 0."""
    folder = cache_dir("jobs")
    paths = [os.path.join(folder, f"slot-{i}") for i in range(slots)]
    while True:
        first = random.randrange(slots)
        for path in paths[first:] + paths[:first]:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                os.close(fd)
        time.sleep(POLL_S)
