"""Helpers the benchmarks share: child-process measurement, medians, the machine line, markdown.

Why child processes: peak RSS of one run can only be told apart from the
others' if each run is its own process; ``os.wait4`` returns the rusage of
exactly that child (and the descendants it reaped, e.g. torchrun's workers).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass
class ChildRun:
    """Wall time, peak RSS and exit status of one child process."""

    wall_s: float
    peak_rss_bytes: int
    returncode: int
    stderr_tail: str


def run_child(argv: Sequence[str], timeout_s: float = 900.0, env: Optional[dict] = None) -> ChildRun:
    """Run ``argv`` to completion; stdout is discarded, the end of stderr kept for errors."""
    stderr_path = f"/tmp/commtag-bench-stderr-{os.getpid()}.txt"
    with open(stderr_path, "wb") as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        deadline = start + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    with open(stderr_path, "rb") as handle:
        tail = handle.read()[-2000:].decode(errors="replace")
    os.unlink(stderr_path)
    # ru_maxrss is in KiB on Linux.
    return ChildRun(wall, usage.ru_maxrss * 1024, proc.returncode, tail)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


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
