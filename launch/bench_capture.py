"""One-time cost per collective at CUDA-graph capture: commtag installed against absent.

GPU only (one CUDA GPU, NCCL, cuda-python; NCCL world size 1). Elsewhere it
prints why it cannot run and exits 2, which ``launch/bench.sh`` reports as
"not measured".

What a collective costs commtag while a graph is captured: the wrapper's
slow path (description, numbering), the graph's node count before and after
the call, and, once per capture, resolving its nodes when the capture ends
(index, type, kernel name, tools id). None of it should grow with the nodes
captured so far, so graphs of several sizes are measured: ``C`` collectives,
each after ``K`` small compute kernels; a shape with ``K`` > 0 against the
same ``C`` with ``K`` = 0 gives the cost of each other operator captured
(commtag's dispatch mode sees every operator while a capture is open).

How: each repetition captures one graph of a shape with
``CUDAGraph.capture_begin``/``capture_end`` on a side stream (the work
``torch.cuda.graph`` wraps, without its garbage collection and cache
emptying, which would swamp the difference) and times begin to end,
instantiation included. Variants alternate within each repetition (absent
first on even repetitions), ``commtag.install()``/``uninstall()`` switching
between them. Per shape: median capture time per variant, and the added
cost per collective, (median installed - median absent) / C. Every
installed capture must have recorded its C collectives with their nodes,
or the run fails (exit 1): otherwise it would time nothing.

Then what logging a replay adds to ``CUDAGraph.replay()``: one graph of the
first shape's collectives, captured with commtag installed, replayed in
blocks of 50 with commtag installed and absent, alternating (the launch's
CPU time; every installed replay must have been logged, or the run fails).

Usage: ``python launch/bench_capture.py [--shapes 8x0,64x0,256x0,256x32] [--reps 15] [--json F]`` with
commtag installed (launch/setup.sh), or ``python -m launch.bench_capture ...`` from the repository
root of a checkout that is not installed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import orjson

from commtag.testing.bench import free_port, machine, markdown_table, median

#: Elements of the all_reduce buffer (fp32) and of the compute kernels' tensor.
NELEMS = 1 << 16


def unavailable() -> Optional[str]:
    """Why this machine cannot run the benchmark, or None."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible here"
    if not torch.distributed.is_nccl_available():
        return "this torch has no NCCL backend"
    try:
        from cuda.bindings import runtime  # noqa: F401 - only whether it imports matters
    except Exception as exc:  # noqa: BLE001 - any import failure (absent, broken driver) means not measured
        return f"cuda-python (cuda.bindings) is not importable ({exc}); commtag records nothing at capture without it"
    return None


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'8x1,64x8' -> [(8, 1), (64, 8)]: collectives x compute kernels before each."""
    shapes = []
    for part in text.split(","):
        collectives, _, kernels = part.strip().partition("x")
        shapes.append((int(collectives), int(kernels or 0)))
    if not shapes or any(c < 1 or k < 0 for c, k in shapes):
        raise argparse.ArgumentTypeError(f"shapes must look like 8x1,64x8 (collectives >= 1), got {text!r}")
    return shapes


class Workload:
    """The captured step: K in-place adds, then an in-place all_reduce, C times.

    The reduction is AVG: on a one-rank communicator an in-place SUM launches
    nothing (no node to record), while AVG scales the buffer with one kernel."""

    def __init__(self, torch: Any, dist: Any) -> None:
        self.torch = torch
        self.dist = dist
        self.stream = torch.cuda.Stream()
        self.buffer = torch.ones(NELEMS, device="cuda")
        self.scratch = torch.zeros(NELEMS, device="cuda")
        # NCCL's communicator and this buffer size are set up eagerly, on the side stream as capture requires.
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for _ in range(3):
                self.scratch.add_(1.0)
                dist.all_reduce(self.buffer, op=dist.ReduceOp.AVG)
        torch.cuda.synchronize()

    def capture(self, collectives: int, kernels: int) -> int:
        """Capture one graph of the shape; ns from capture_begin to the end of capture_end."""
        elapsed, graph = self.captured(collectives, kernels)
        del graph
        return elapsed

    def captured(self, collectives: int, kernels: int) -> tuple[int, Any]:
        """Capture one graph of the shape: (ns from capture_begin to the end of capture_end, the graph)."""
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.stream(self.stream):
            start = time.perf_counter_ns()
            graph.capture_begin()
            try:
                for _ in range(collectives):
                    for _ in range(kernels):
                        self.scratch.add_(1.0)
                    self.dist.all_reduce(self.buffer, op=self.dist.ReduceOp.AVG)
            finally:
                graph.capture_end()
            elapsed = time.perf_counter_ns() - start
        torch.cuda.synchronize()
        return elapsed, graph

    def replays(self, graph: Any, count: int) -> list[int]:
        """ns of each of ``count`` calls of ``graph.replay()`` (the launch: what commtag's log adds to)."""
        times = []
        for _ in range(count):
            start = time.perf_counter_ns()
            graph.replay()
            times.append(time.perf_counter_ns() - start)
        self.torch.cuda.synchronize()
        return times


def recorded_last(collectives: int) -> Optional[str]:
    """What is wrong with the newest capture commtag recorded, or None when it holds ``collectives``
    collectives, each with graph nodes."""
    from commtag.runtime import capture

    records = capture.captures_snapshot()
    if not records:
        return "commtag recorded no capture"
    last = max(records, key=lambda r: r.capture_id)
    if len(last.collectives) != collectives:
        return f"commtag recorded {len(last.collectives)} collectives in a capture of {collectives}"
    empty = sum(1 for c in last.collectives if not c.nodes)
    if empty:
        return f"{empty} of {collectives} captured collectives have no graph nodes"
    return None


def measure(shapes: Sequence[tuple[int, int]], reps: int) -> tuple[list[dict], dict, dict]:
    import torch
    import torch.distributed as dist

    import commtag

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())})
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        work = Workload(torch, dist)
        # First captures: torch's own lazy set-up, then commtag's (cuda-python, the tracker, the c10d hooks).
        first_absent = work.capture(*shapes[0])
        commtag.install()
        first_installed = work.capture(*shapes[0])
        problem = recorded_last(shapes[0][0])
        commtag.uninstall()
        if problem:
            raise RuntimeError(f"first capture: {problem}")
        rows = []
        for collectives, kernels in shapes:
            times: dict[str, list[int]] = {"absent": [], "installed": []}

            def one(variant: str, collectives: int = collectives, kernels: int = kernels,
                    times: dict[str, list[int]] = times) -> None:
                times[variant].append(work.capture(collectives, kernels))
                problem = recorded_last(collectives) if variant == "installed" else None
                if problem:
                    raise RuntimeError(f"shape {collectives}x{kernels}: {problem}")

            alternating(reps, one)
            absent, installed = median(times["absent"]), median(times["installed"])
            rows.append({
                "collectives": collectives, "kernels_per_collective": kernels,
                "graph_nodes_about": collectives * (kernels + 1), "reps": reps,
                "absent_ms": absent / 1e6, "installed_ms": installed / 1e6,
                "ratio": installed / absent,
                "added_us_per_collective": (installed - absent) / collectives / 1e3,
                "raw_ns": times,
            })
        first = {"absent_ms": first_absent / 1e6, "installed_ms": first_installed / 1e6, "shape": list(shapes[0])}
        return rows, first, replay_cost(work, shapes[0][0], reps)
    finally:
        dist.destroy_process_group()


def _replay_line(replay: dict) -> str:
    return (f"Each replay (graph of {replay['collectives']} collectives, median of {replay['replays_per_variant']} "
            f"calls of CUDAGraph.replay() per variant): {replay['absent_us']:.1f} us absent, "
            f"{replay['installed_us']:.1f} us installed, {replay['added_us']:+.1f} us to log it.")


def per_operator(rows: list[dict]) -> str:
    """What each other operator captured costs: a shape with K kernels per collective against
    the same number of collectives with none (commtag's dispatch mode sees every operator while
    a capture is open, to catch collectives that pass no Python function)."""
    bare = {r["collectives"]: r for r in rows if r["kernels_per_collective"] == 0}
    lines = []
    for r in rows:
        base = bare.get(r["collectives"])
        if base is not None and r["kernels_per_collective"]:
            ops = r["collectives"] * r["kernels_per_collective"]
            added = (r["installed_ms"] - r["absent_ms"]) - (base["installed_ms"] - base["absent_ms"])
            lines.append(f"Each other operator captured ({r['collectives']} x {r['kernels_per_collective']} against "
                         f"{r['collectives']} x 0): {added * 1e3 / ops:+.1f} us.\n\n")
    return "".join(lines)


def alternating(rounds: int, run: Callable[[str], None]) -> None:
    """``run("absent")`` and ``run("installed")`` in each round, absent first on even rounds,
    commtag installed only around the second (uninstalled again even if ``run`` raises)."""
    import commtag

    for i in range(rounds):
        for variant in (("absent", "installed") if i % 2 == 0 else ("installed", "absent")):
            if variant == "installed":
                commtag.install()
            try:
                run(variant)
            finally:
                commtag.uninstall()


def replay_cost(work: Workload, collectives: int, blocks: int, per_block: int = 50) -> dict:
    """What logging a replay adds to ``CUDAGraph.replay()``: one graph captured with commtag
    installed, replayed in blocks with it installed (each replay logged) and absent, alternating."""
    import commtag
    from commtag.runtime import capture

    commtag.install()
    try:
        _, graph = work.captured(collectives, 0)
        capture_id = max(c.capture_id for c in capture.captures_snapshot())
    finally:
        commtag.uninstall()
    times: dict[str, list[int]] = {"absent": [], "installed": []}
    alternating(blocks, lambda variant: times[variant].extend(work.replays(graph, per_block)))
    (record,) = [c for c in capture.captures_snapshot() if c.capture_id == capture_id]
    if len(record.replays) != len(times["installed"]):
        raise RuntimeError(f"{len(record.replays)} replays logged of {len(times['installed'])} made with commtag installed")
    absent, installed = median(times["absent"]), median(times["installed"])
    return {"collectives": collectives, "replays_per_variant": len(times["absent"]),
            "absent_us": absent / 1e3, "installed_us": installed / 1e3, "added_us": (installed - absent) / 1e3}


def report(rows: list[dict], first: dict, replay: dict) -> str:
    table = markdown_table(
        ["collectives x kernels before each", "graph nodes (about)", "reps", "capture ms, absent",
         "capture ms, installed", "installed / absent", "added us per collective"],
        [[f"{r['collectives']} x {r['kernels_per_collective']}", r["graph_nodes_about"], r["reps"],
          f"{r['absent_ms']:.2f}", f"{r['installed_ms']:.2f}", f"{r['ratio']:.2f}x",
          f"{r['added_us_per_collective']:+.1f}"] for r in rows],
    )
    c, k = first["shape"]
    return (
        "Median capture time (capture_begin to the end of capture_end, instantiation included); "
        "variants alternate per repetition.\n\n" + table + "\n\n" + per_operator(rows) + (
        f"First capture in the process ({c} x {k}): {first['absent_ms']:.1f} ms without commtag, then "
        f"{first['installed_ms']:.1f} ms with it (loading cuda-python and commtag's capture hooks).\n\n"
        + _replay_line(replay))
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shapes, default=parse_shapes("8x0,64x0,256x0,256x32"),
                        help="graphs to capture: collectives x compute kernels before each "
                             "(default 8x0,64x0,256x0,256x32: per collective, then per other operator)")
    parser.add_argument("--reps", type=int, default=15, help="captures per variant and shape (default 15)")
    parser.add_argument("--quick", action="store_true", help="one small shape, 5 repetitions")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(f"Capture cost per collective: not measured ({reason}).")
        if args.json:
            args.json.write_bytes(orjson.dumps({"skipped": reason}))
        return 2
    shapes, reps = ([(8, 0)], 5) if args.quick else (args.shapes, args.reps)
    info = machine()
    try:
        rows, first, replay = measure(shapes, reps)
    except RuntimeError as exc:
        print(f"bench_capture: {exc}", file=sys.stderr)
        return 1
    import torch

    gpu = f"{torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}, torch {torch.__version__}"
    print(f"Machine: {info}; {gpu}.\n")
    print(report(rows, first, replay))
    if args.json:
        args.json.write_bytes(orjson.dumps({"machine": info, "gpu": gpu, "rows": rows, "first": first, "replay": replay},
                                           option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
