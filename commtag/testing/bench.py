"""Helpers the launch scripts share: child-process measurement, medians, the machine line, markdown, a free port.

Why peak RSS is read from /proc and not from wait4/getrusage: on Linux a
child's ru_maxrss starts at its parent's RSS when it forks (exec keeps the
old high-water mark), so a big benchmark parent would inflate every child.
``VmHWM`` in /proc/PID/status belongs to the exec'd program alone; it is
polled every few milliseconds for the child and its descendants (torchrun's
workers) and the last value read before each exits is kept.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence


@dataclass
class ChildRun:
    """Wall time, per-process peak RSS and exit status of one child process (and its descendants)."""

    wall_s: float
    returncode: int
    stderr_tail: str
    #: pid -> (command line, peak RSS bytes), the child first.
    peaks: dict[int, tuple[str, int]] = field(default_factory=dict)

    @property
    def root_peak(self) -> int:
        """Peak RSS of the child process itself."""
        return next(iter(self.peaks.values()), ("", 0))[1]

    @property
    def worker_peaks(self) -> list[int]:
        """Peak RSS of each descendant running the merge (torchrun's or ``-j``'s workers), largest
        first: not another process a launcher starts (under torch 2.13 torchrun's agent may start
        one that imports torch, 245 MB, which was once taken for a worker)."""
        return sorted((peak for cmdline, peak in list(self.peaks.values())[1:] if "commtag.merge" in cmdline),
                      reverse=True)


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    kids = [int(k) for k in handle.read().split()]
                found += kids
                todo += kids
        except OSError:
            continue
    return found


def _hwm(pid: int) -> Optional[tuple[str, int]]:
    try:
        with open(f"/proc/{pid}/status") as handle:
            status = handle.read()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return cmdline, int(line.split()[1]) * 1024
    return None


def run_child(argv: Sequence[str], timeout_s: float = 900.0, env: Optional[dict] = None,
              cwd: Optional[str] = None) -> ChildRun:
    """Run ``argv`` to completion (in ``cwd``), polling peak RSS; stdout is discarded, the end of stderr kept."""
    stderr_path = f"/tmp/commtag-bench-stderr-{os.getpid()}.txt"
    peaks: dict[int, tuple[str, int]] = {}
    with open(stderr_path, "wb") as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=cwd)
        while proc.poll() is None:
            for pid in [proc.pid, *_descendants(proc.pid)]:
                seen = _hwm(pid)
                if seen is None:
                    continue
                # Between fork and exec a process still shows its parent's image: a new
                # command line means a new program, whose high-water mark starts afresh.
                before = peaks.get(pid)
                peaks[pid] = seen if before is None or before[0] != seen[0] else (seen[0], max(seen[1], before[1]))
            if time.perf_counter() - start > timeout_s:
                proc.kill()
            time.sleep(0.005)
        wall = time.perf_counter() - start
    with open(stderr_path, "rb") as handle:
        tail = handle.read()[-2000:].decode(errors="replace")
    os.unlink(stderr_path)
    return ChildRun(wall, proc.returncode, tail, peaks)


def records_size(instances: Iterable) -> int:
    """Bytes the collective instances' records take: each instance, its fields, and the keys and
    values of its dicts and the items of its tuples, every object counted once over all (the
    call-site args and member tuples that instances share count once)."""
    seen: set[int] = set()
    total = 0

    def count(obj: object) -> None:
        nonlocal total
        if id(obj) not in seen:
            seen.add(id(obj))
            total += sys.getsizeof(obj)

    for inst in instances:
        count(inst)
        for name in inst.__slots__:
            value = getattr(inst, name)
            count(value)
            if isinstance(value, dict):
                for key, item in value.items():
                    count(key)
                    count(item)
            elif isinstance(value, tuple):
                for item in value:
                    count(item)
    return total


def parallel_speedup(loops: int = 20_000_000) -> float:
    """How much faster two CPU-bound processes finish twice the work of one, here and now: the
    ceiling of any two-worker speedup measured beside it. 2.0 on two idle cores; two logical CPUs
    that share a core, or a host busy elsewhere, give less (1.5-1.9 on this project's machine,
    from one minute to the next), so a -j 2 ratio is read against it."""
    argv = [sys.executable, "-c", f"s = 0\nfor i in range({loops}): s += i"]
    one, two = best_walls([argv], [argv, argv])
    return 2 * one / two


def best_walls(*runs: Sequence[Sequence[str]], rounds: int = 3) -> list[float]:
    """Each of ``runs`` (commands started together, timed until the last ends) run ``rounds``
    times, the runs alternating: each's best wall time (one slow run alone would skew a ratio)."""
    walls: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for commands, times in zip(runs, walls):
            start = time.perf_counter()
            children = [subprocess.Popen(list(argv)) for argv in commands]
            for child in children:
                child.wait()
            times.append(time.perf_counter() - start)
    return [min(times) for times in walls]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def free_port() -> int:
    """A TCP port free on this host now, for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> str:
    """One line describing where the numbers were taken."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        with open("/proc/meminfo") as handle:
            mem_gib = int(handle.readline().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        mem_gib = float("nan")
    load = os.getloadavg()[0]
    return (
        f"{cpu}, {os.cpu_count()} logical CPUs, {mem_gib:.0f} GiB RAM, Linux {platform.release()}, "
        f"Python {platform.python_version()}; 1-min load average at start {load:.1f}"
    )


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(value: float, target: float, higher_is_better: bool = False) -> str:
    """'met' or 'MISSED' for a figure against its target."""
    if value != value:  # NaN: not measured
        return "not measured"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "MISSED"
