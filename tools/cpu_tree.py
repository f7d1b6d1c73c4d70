"""CPU seconds of a command and every process it starts, Ray's workers included, by process kind.

`getrusage(RUSAGE_CHILDREN)` misses Ray's worker processes (they are reaped where their times never reach the
command), so this samples /proc every 0.5 s and keeps each descendant's last user + system time; a process that lives
less than a sample is missed, one that ends loses at most its last half second.

    .venv/bin/python tools/cpu_tree.py -- .venv/bin/python -m pytest tests/e2e/test_entrypoints_graceful_stop.py -q
"""

from __future__ import annotations

import collections
import ctypes
import os
import subprocess
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36  # orphans of the tree stay under this process, so they are still counted
TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.5
# Names for processes that keep the interpreter's name; Ray's workers name themselves `ray::<Class>`.
KINDS = (
    "gcs_server", "raylet", "dashboard/agent.py", "runtime_env/agent", "log_monitor", "dashboard/dashboard.py",
    "monitor.py", "training_entrypoints.sweep", "sweepctl", "pytest", "ray start",
)  # fmt: skip


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(comm, ppid, CPU seconds) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2 :].split()
    return stat[stat.index("(") + 1 : stat.rindex(")")], int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def _kind(pid: int, comm: str) -> str:
    if comm.startswith("ray::") or comm in ("raylet", "gcs_server"):  # the raylet's command line names the worker's
        return comm
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmd = ""
    if "default_worker" in cmd:
        return "ray worker (no task yet)"
    return next((kind for kind in KINDS if kind in cmd), comm)


class Sampler:
    def __init__(self, root: int):
        self.root = root
        self.kind: dict[int, str] = {}
        self.cpu: dict[int, float] = {}  # each descendant's last sampled CPU seconds
        self.stop = threading.Event()

    def run(self) -> None:
        while True:
            procs = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p))) is not None}
            ours: set[int] = set()
            for pid in procs:
                chain, up = [], pid
                while up > 1 and up != self.root and up not in ours and up in procs:
                    chain.append(up)
                    up = procs[up][1]
                if up == self.root or up in ours:
                    ours.update(chain)
            for pid in ours:
                comm, _, self.cpu[pid] = procs[pid]
                if pid not in self.kind or (comm.startswith("ray::") and comm != "ray::IDLE"):
                    self.kind[pid] = _kind(pid, comm)  # a worker renames itself after the actor or task it took
            if self.stop.wait(SAMPLE_S):
                return


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print(__doc__, file=sys.stderr)
        return 2
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    sampler = Sampler(os.getpid())
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    load_before, started = os.getloadavg()[0], time.monotonic()
    returncode = subprocess.call(command)
    while True:  # reap what the command left behind, so its last CPU is sampled first
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    wall = time.monotonic() - started
    sampler.stop.set()
    thread.join()
    count: collections.Counter[str] = collections.Counter()
    cpu: collections.Counter[str] = collections.Counter()
    for pid, kind in sampler.kind.items():
        count[kind] += 1
        cpu[kind] += sampler.cpu[pid]
    total = sum(cpu.values())
    print(
        f"cpu_tree: {total:.1f} CPU s over {wall:.1f} s wall, load average {load_before:.1f} -> "
        f"{os.getloadavg()[0]:.1f}, exit {returncode}",
        file=sys.stderr,
    )
    for kind, seconds in cpu.most_common():
        print(f"  {seconds:8.1f} CPU s  {count[kind]:4d} processes  {kind}", file=sys.stderr)
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
