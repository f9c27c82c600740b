"""The TCP sockets a process tree listens on, read from /proc (Linux): which addresses Ray's processes bind."""
from __future__ import annotations

import os
import socket

LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def process_tree(root: int) -> set[int]:
    """`root` and every process started under it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended while we looked
            continue
        children.setdefault(parent, []).append(int(entry))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    return tree


def still_running(pid: int):
    """The process's start time (clock ticks after boot), or None where it ended: with the pid, it names one
    process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def listening(pids: set[int]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of each listening TCP socket the processes hold."""
    owners = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # ended, or not ours to read
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners[target[8:-1]] = pid
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/net/{table}") as lines:
            for line in list(lines)[1:]:
                columns = line.split()
                if columns[3] != "0A" or columns[9] not in owners:  # 0A: LISTEN
                    continue
                address, port = columns[1].split(":")
                raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.append((_name(owners[columns[9]]), socket.inet_ntop(family, raw), int(port, 16)))
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return str(pid)
