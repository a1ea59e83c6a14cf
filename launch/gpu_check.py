"""GPU check: graphed NCCL collectives get, at replay, the metadata the profiler gives them eagerly.

Run on a machine with one CUDA GPU, NCCL and cuda-python (world size 1)::

    python launch/gpu_check.py [--out tests/fixtures/gpu_graphs]

with commtag installed (launch/setup.sh), or ``python -m launch.gpu_check ...`` from the repository
root of a checkout that is not installed (the working directory then supplies commtag).

What it does:

0. before commtag is installed, captures a graph and lists its nodes after
   every op: each listing must extend the last (the driver lists nodes in
   creation order, which capture bookkeeping relies on).

Then, with ``commtag.install()`` active throughout:

1. eager: all_reduce(AVG), out-of-place all_gather_into_tensor, broadcast,
   an all_reduce(AVG) on a second process group ("tp", ranks [0]), and a
   functional all_reduce("avg") -- between compute kernels -- under
   the profiler (commtag.trace_handler writes trace + sidecar);
2. graph: the same step captured with ``torch.cuda.graph`` and replayed 3
   times under the profiler; plus a second graph captured with
   ``CUDAGraph.capture_begin/capture_end`` holding one all_reduce(AVG);
3. matching: ``commtag.merge.rank.replays.match_graph_replays`` on the graph trace
   and its sidecar; every collective that launched device work eagerly must
   be annotated on every replay with the eager profiler's values, key by key
   (exception: ``Seq`` -- a replay carries its capture-time Seq, which is
   checked against commtag's own record instead; keys the profiler writes
   that commtag does not produce, such as ``Comms Id``, are listed);
4. hypotheses of docs/cuda-graphs.md: (1) the lower 32 bits of
   a replayed kernel's "graph node id" equal the node's creation index; (2)
   a replay's NCCL kernels, by start time, follow capture order and their
   names confirm the collectives. Both are measured and written down, never
   assumed;
5. optional: torch.compile(mode="reduce-overhead") over a functional
   all_reduce (CUDA-graph trees): is the collective intercepted at the c10d
   operator level and matched at replay?
6. nccl2 (launch/gpu_check_nccl2.py, in a process of its own, first): where
   torch >= 2.14 runs on CUDA, ProcessGroupNCCL2's real records against the
   note's (docs/nccl2.md §8) and commtag's
   annotations; elsewhere it says NOT AVAILABLE. Its fixtures go beside
   ``--out``, in ``gpu_nccl2``.

Everything measured goes to ``<out>/findings.json``; raw traces and sidecars
to ``<out>/eager`` and ``<out>/graph``; versions and the command to
``<out>/PROVENANCE.md``. What this stack gives no data for (a Kineto that
writes no graph node id, a profiler that writes no Seq) is written NOT
MEASURABLE: neither passed nor failed. Exit status: 0 all checks passed, 1 a
check failed (fixtures are still written: they are the evidence), 2 no GPU /
no NCCL / no cuda-python here.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from commtag.testing.bench import free_port
from commtag.vocab import (
    ANN_REPLAY, COLLECTIVE_NAME_KEY, COMMS_ID_KEY, CORRELATION_KEY, DEVICE_WORK_NODE_TYPES, GRAPH_ID_KEY, GRAPH_NODE_ID_KEY,
    KERNEL_CATEGORY, KERNEL_EAGER_KEYS, KERNEL_NODE_TYPE, LAUNCH_CATEGORIES, PG_DESC_KEY, SEQ_KEY,
)

REPO = Path(__file__).resolve().parents[1]
#: Documented exceptions to key-by-key equality.
EXCEPTIONS = {
    SEQ_KEY: "a replay carries the capture-time Seq (the counter does not advance at replay); checked against commtag's capture record",
    COMMS_ID_KEY: "profiler-only hash of (pg name, seq, ...); commtag does not write it",
}
N = 4096


def fail_setup(message: str) -> int:
    print(f"gpu_check: {message}", file=sys.stderr)
    return 2


def _load(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _one(directory: Path, suffix: str) -> Path:
    found = sorted(directory.glob(f"*{suffix}"))
    if len(found) != 1:
        raise RuntimeError(f"expected one *{suffix} in {directory}, found {[p.name for p in found]}")
    return found[0]


class Checks:
    """Collects pass/fail lines and findings; nothing here raises on a failed check."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.passed: list[str] = []
        self.not_measurable: list[str] = []
        self.findings: dict[str, Any] = {}

    def check(self, ok: bool, what: str) -> bool:
        (self.passed if ok else self.failures).append(what)
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        return ok

    def unmeasurable(self, what: str) -> None:
        """A question this stack gives no data for: neither passed nor failed, written down."""
        self.not_measurable.append(what)
        print("NOT MEASURABLE " + what, flush=True)


# ---------------------------------------------------------------------------- the workload


def _make_step(torch: Any, dist: Any, funcol: Any, bufs: dict[str, Any], sub: Any) -> Any:
    def step() -> None:
        bufs["y"].mul_(1.5)                                           # compute kernel
        dist.all_reduce(bufs["x"], op=dist.ReduceOp.AVG)              # AVG: pre-multiply, launches work
        dist.all_gather_into_tensor(bufs["gather_out"], bufs["gather_in"])  # out of place: copies
        bufs["z"].add_(1.0)                                           # compute kernel
        dist.broadcast(bufs["b"], src=0)                              # may launch nothing at world size 1
        dist.all_reduce(bufs["s"], op=dist.ReduceOp.AVG, group=sub)   # a second process group: its own lane
        reduced = funcol.all_reduce(bufs["f"], "avg", dist.group.WORLD)  # c10d op level, not the Python API
        bufs["f_out"].copy_(funcol.wait_tensor(reduced))

    return step


def _buffers(torch: Any) -> dict[str, Any]:
    dev = torch.device("cuda", 0)
    return {
        "x": torch.randn(N, device=dev),
        "y": torch.randn(N, device=dev),
        "z": torch.randn(N, device=dev),
        "b": torch.randn(N, device=dev, dtype=torch.bfloat16),
        "gather_in": torch.randn(N, device=dev),
        "gather_out": torch.empty(N, device=dev),
        "f": torch.randn(N, device=dev),
        "f_out": torch.empty(N, device=dev),
        "s": torch.randn(N // 2, device=dev),
    }


def run_workload(out: Path, checks: Checks) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import commtag
    from commtag.runtime import capture

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())})
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    _check_listing_order(torch, dist, checks)
    commtag.install()
    sub = dist.new_group([0], group_desc="tp")
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    bufs = _buffers(torch)
    step = _make_step(torch, dist, funcol, bufs, sub)

    # Warm up (NCCL communicator, allocator) on a side stream, as capture requires.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    with torch.profiler.profile(activities=activities, on_trace_ready=commtag.trace_handler(out / "eager")):
        step()
        torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    single = torch.cuda.CUDAGraph()
    x2 = torch.randn(2 * N, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dist.all_reduce(x2, op=dist.ReduceOp.AVG)  # warm-up of this shape
        torch.cuda.synchronize()
        single.capture_begin()
        try:
            x2.mul_(2.0)
            dist.all_reduce(x2, op=dist.ReduceOp.AVG)
        finally:
            single.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph.replay()  # replay 0 happens before profiling: indices in the trace start at 1
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities, on_trace_ready=commtag.trace_handler(out / "graph")):
        for _ in range(3):
            graph.replay()
            single.replay()
        torch.cuda.synchronize()
    checks.findings["captures_in_process"] = [c.model_dump(mode="json", exclude={"replays"}) for c in capture.captures_snapshot()]
    _compile_check(torch, dist, funcol, activities, out, checks)
    commtag.uninstall()
    dist.destroy_process_group()


def _check_listing_order(torch: Any, dist: Any, checks: Checks) -> None:
    """commtag takes a collective's nodes to be those between the graph's node counts before and
    after the call, which holds only if the driver lists nodes in creation order. Capture a graph
    (before commtag is installed), list its nodes after every op: each listing must extend the last."""
    import time

    from commtag.runtime.capture.graph_api import CudaBindingsGraphAPI

    api = CudaBindingsGraphAPI()
    a = torch.randn(N, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    listings: list[list[int]] = []
    counts: list[int] = []
    with torch.cuda.stream(stream):
        dist.all_reduce(a, op=dist.ReduceOp.AVG)  # warm-up of this shape outside the capture
        torch.cuda.synchronize()
        graph.capture_begin()
        try:
            for i in range(48):
                if i % 4 == 3:
                    dist.all_reduce(a, op=dist.ReduceOp.AVG)
                else:
                    a.mul_(1.0001)
                _, capture_graph = api.capture_info(int(stream.cuda_stream))
                listings.append([int(node) for node in api.nodes(capture_graph)])
                counts.append(api.node_count(capture_graph))
            started = time.perf_counter_ns()
            for _ in range(200):
                api.node_count(capture_graph)
            count_ns = (time.perf_counter_ns() - started) / 200
            started = time.perf_counter_ns()
            for _ in range(200):
                api.nodes(capture_graph)
            list_ns = (time.perf_counter_ns() - started) / 200
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    extends = all(later[: len(earlier)] == earlier for earlier, later in zip(listings, listings[1:]))
    counted = counts == [len(listing) for listing in listings]
    checks.findings["node_listing"] = {
        "creation_order": extends, "count_matches_listing": counted, "nodes_after_each_op": counts,
        "node_count_ns": count_ns, f"listing_{counts[-1]}_nodes_ns": list_ns,
    }
    checks.check(extends and counted and counts[-1] > counts[0],
                 f"the driver lists capture-graph nodes in creation order: each of {len(listings)} listings extends "
                 f"the last, and the node count equals the listing ({counts[0]} -> {counts[-1]} nodes)")


def _compile_check(torch: Any, dist: Any, funcol: Any, activities: list, out: Path, checks: Checks) -> None:
    """torch.compile(mode="reduce-overhead"): CUDA-graph trees around a functional collective."""
    import commtag

    try:
        def fn(t: Any) -> Any:
            return funcol.wait_tensor(funcol.all_reduce(t * 2.0, "avg", dist.group.WORLD)) + 1.0

        compiled = torch.compile(fn, mode="reduce-overhead")
        t = torch.randn(N, device="cuda")
        for _ in range(4):  # warm-up runs, then recording (capture), then replays
            compiled(t)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities, on_trace_ready=commtag.trace_handler(out / "compiled")):
            for _ in range(2):
                compiled(t)
            torch.cuda.synchronize()
        checks.findings["compile_reduce_overhead"] = "ran"
    except Exception as exc:  # noqa: BLE001 - optional: recorded as a finding
        checks.findings["compile_reduce_overhead"] = f"failed to run: {type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------- analysis


def _device_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("cat") in DEVICE_WORK_NODE_TYPES]


def analyse(out: Path, checks: Checks) -> None:
    """The five checks of the module docstring on the traces and sidecars ``run_workload`` wrote."""
    from commtag.merge.rank.replays import match_graph_replays
    from commtag.merge.inputs.clock import base_ns
    from commtag.sidecarfile import read_sidecar

    eager_trace = _load(_one(out / "eager", ".pt.trace.json.gz"))
    graph_trace = _load(_one(out / "graph", ".pt.trace.json.gz"))
    graph_side = read_sidecar(_one(out / "graph", ".commtag.json"))
    eager_side = read_sidecar(_one(out / "eager", ".commtag.json"))
    findings = checks.findings

    eager_by_name = _check_eager(eager_trace, eager_side, checks)
    graphed = _check_graph_sidecar(graph_trace, graph_side, checks)
    captures = graph_side.captures

    # -- matching, as the merge does it ---------------------------------------
    base = base_ns(graph_trace)
    result = match_graph_replays(graph_trace["traceEvents"], captures, base)
    findings["match_methods"] = sorted({m.method for m in result.matches})
    findings["unmatched_replays"] = [u.__dict__ for u in result.unmatched]
    findings["notes"] = result.notes
    checks.check(not result.unmatched, f"every replay carrying captured collectives matched ({len(result.unmatched)} not)")

    _check_hypothesis1(graph_trace, graphed, captures, result, checks)
    _check_hypothesis2(graph_trace, captures, base, checks)
    _check_replayed_keys(graph_trace, captures, result, eager_by_name, checks)
    findings["exceptions"] = EXCEPTIONS
    _check_compiled(out, checks)


def _check_eager(eager_trace: dict, eager_side: Any, checks: Checks) -> dict[tuple[str, str], list[dict]]:
    """Step 1: what the profiler attached eagerly equals commtag's own record; the events by
    (collective, group description)."""
    findings = checks.findings
    eager = [e for e in _device_events(eager_trace) if COLLECTIVE_NAME_KEY in e.get("args", {})]
    findings["eager_annotated_device_events"] = [
        {"cat": e["cat"], "name": e["name"], "args": {k: e["args"][k] for k in e["args"] if k in KERNEL_EAGER_KEYS or k == COMMS_ID_KEY}}
        for e in eager
    ]
    eager_by_name: dict[tuple[str, str], list[dict]] = {}
    for e in eager:
        eager_by_name.setdefault((e["args"][COLLECTIVE_NAME_KEY], e["args"].get(PG_DESC_KEY, "")), []).append(e)
    # Each record is paired with the annotated kernels launched inside its own call: by identity, not by order.
    from commtag.merge.inputs.clock import base_ns, event_ns

    base = base_ns(eager_trace)
    launched_at = {e["args"][CORRELATION_KEY]: event_ns(e, base)[0] for e in eager_trace["traceEvents"]
                   if e.get("cat") in LAUNCH_CATEGORIES and CORRELATION_KEY in e.get("args", {})}
    paired: set[int] = set()
    findings["eager_collectives_without_device_work"] = []
    checks.check(bool(eager), "the eager profiler attached collective metadata to device events")
    for record in eager_side.collectives:
        mine = record.annotation.eager_dict()
        name = record.annotation.collective_name
        inside = [e for e in eager if record.start_ns <= launched_at.get(e["args"].get(CORRELATION_KEY), -1) <= record.end_ns]
        if not inside:
            findings["eager_collectives_without_device_work"].append(name)
            continue
        for event in inside:
            paired.add(id(event))
            diff = {k: (event["args"][k], mine.get(k)) for k in KERNEL_EAGER_KEYS
                    if k in event["args"] and event["args"][k] != mine.get(k)}
            checks.check(not diff, f"eager {name} Seq {record.annotation.seq}: commtag's record equals the profiler's "
                                   f"metadata on the kernel it launched, key by key {diff or ''}")
    unrecorded = [e["args"][COLLECTIVE_NAME_KEY] for e in eager if id(e) not in paired]
    findings["eager_kernels_without_commtag_record"] = unrecorded
    if unrecorded:
        print(f"FINDING eager kernels the profiler annotated that commtag recorded no call for: {unrecorded} "
              "(a functional collective outside a capture passes no Python wrapper)", flush=True)
    written = sorted({k for e in eager for k in e["args"] if k in KERNEL_EAGER_KEYS})
    findings["eager_kernel_keys_written"] = written
    if eager and SEQ_KEY not in written:
        checks.unmeasurable("Seq on eager kernels: this torch's profiler writes no Seq (commtag's records carry it)")
    return eager_by_name


def _check_graph_sidecar(graph_trace: dict, graph_side: Any, checks: Checks) -> list[dict]:
    """Step 2: the graph trace carries node ids and the sidecar its captures; the replayed device events."""
    findings = checks.findings
    graphed = [e for e in _device_events(graph_trace) if e.get("args", {}).get(GRAPH_ID_KEY)]
    node_ids = [int(e["args"].get(GRAPH_NODE_ID_KEY, 0)) for e in graphed]
    findings["graph_node_ids_written"] = any(node_ids)
    findings["graph_node_id_encoding"] = (
        "none written" if not any(node_ids)
        else "packed (graph << 32 | node)" if any(n >> 32 for n in node_ids) else "node id only")
    print(f"FINDING graph node id on replayed device work: {findings['graph_node_id_encoding']} "
          f"({len(graphed)} of {len(_device_events(graph_trace))} device events carry a graph id)", flush=True)
    captures = graph_side.captures
    findings["sidecar_captures"] = [
        {"capture_id": c.capture_id, "total_nodes": c.total_nodes, "graph_id": c.graph_id, "exec_graph_id": c.exec_graph_id,
         "replays": [r.index for r in c.replays],
         "collectives": [{"name": cc.annotation.collective_name, "seq": cc.annotation.seq, "source": cc.source,
                          "reduce_op": cc.reduce_op,
                          "nodes": [n.model_dump(mode="json") for n in cc.nodes]} for cc in c.collectives]}
        for c in captures
    ]
    checks.check(len(captures) == 2, f"two captures in the graph sidecar (got {len(captures)})")
    checks.check(all(c.replays for c in captures), "the replay log reached the sidecar for every capture")
    kernel_nodes = [n for c in captures for cc in c.collectives for n in cc.nodes if n.node_type == KERNEL_NODE_TYPE]
    checks.check(all(n.kernel_name for n in kernel_nodes), "cuFuncGetName gave a name for every captured kernel node")
    funcol_seen = any(cc.source == "c10d-op" for c in captures for cc in c.collectives)
    checks.check(funcol_seen, "the functional all_reduce was caught at the c10d operator level during capture")
    return graphed


def _check_hypothesis1(graph_trace: dict, graphed: list[dict], captures: list, result: Any, checks: Checks) -> None:
    """Hypothesis 1: the lower 32 bits of "graph node id" are the node's creation index.

    Per replay and its capture (from the replay log), the offsets (node id - index) every named
    captured node allows; the hypothesis holds if {0} is what remains."""
    from commtag.vocab import NODE_ID_MASK, base_name

    findings = checks.findings
    category_of_node = {node: category for category, node in DEVICE_WORK_NODE_TYPES.items()}
    by_corr: dict[int, list[dict]] = {}
    for e in graphed:
        by_corr.setdefault(e["args"][CORRELATION_KEY], []).append(e)
    capture_of = {m.event["args"][CORRELATION_KEY]: m.capture_id for m in result.matches}
    offsets: set[int] = set()
    h1_detail = []
    for corr, events in by_corr.items():
        ids_by_key: dict[str, set[int]] = {}
        for e in events:
            key = base_name(e["name"]) if e["cat"] == KERNEL_CATEGORY else e["cat"]
            ids_by_key.setdefault(key, set()).add(int(e["args"][GRAPH_NODE_ID_KEY]) & NODE_ID_MASK)
        for c in captures:
            if corr in capture_of and capture_of[corr] != c.capture_id:
                continue
            allowed: Optional[set[int]] = None
            for cc in c.collectives:
                for n in cc.nodes:
                    key = base_name(n.kernel_name) if n.node_type == KERNEL_NODE_TYPE else category_of_node.get(n.node_type, "")
                    here = {nid - n.index for nid in ids_by_key.get(key, set())}
                    allowed = here if allowed is None else allowed & here
            if allowed:
                offsets |= allowed
                h1_detail.append({"correlation": corr, "capture": c.capture_id, "offsets": sorted(allowed),
                                  "node_ids_low32": sorted(set().union(*ids_by_key.values())), "total_nodes": c.total_nodes})
    findings["hypothesis1_offsets_seen"] = sorted(offsets)
    findings["hypothesis1_replays"] = h1_detail[:20]
    if not graphed:
        findings["hypothesis1"] = "not measurable: this Kineto writes no graph node id on replayed work"
        checks.unmeasurable("hypothesis 1 (node id lower 32 bits = creation index): no replayed event carries a graph node id")
        return
    findings["hypothesis1"] = "holds" if offsets == {0} else "refuted"
    checks.check(offsets == {0}, f"hypothesis 1: node id (lower 32 bits) - creation index, consistent over each replay = {sorted(offsets)}")


def _check_hypothesis2(graph_trace: dict, captures: list, base: int, checks: Checks) -> None:
    """Hypothesis 2: the same replays, node ids erased, match by order alone."""
    from commtag.merge.rank.captures import comm_nodes
    from commtag.merge.rank.replays import match_graph_replays

    findings = checks.findings
    stripped = json.loads(json.dumps(graph_trace["traceEvents"]))
    for e in stripped:
        if GRAPH_NODE_ID_KEY in e.get("args", {}):
            e["args"][GRAPH_NODE_ID_KEY] = 0
    by_order = match_graph_replays(stripped, captures, base)
    expected_kernels = sum(
        1 for c in captures for cc in c.collectives for n in comm_nodes(cc) if n.node_type == KERNEL_NODE_TYPE
    )
    findings["hypothesis2_unmatched"] = [u.__dict__ for u in by_order.unmatched]
    findings["hypothesis2"] = "holds" if not [u for u in by_order.unmatched if "copy/memset" not in u.reason] else "refuted"
    checks.check(findings["hypothesis2"] == "holds",
                 f"hypothesis 2: NCCL kernels of each replay, by start time, pair with capture order and names confirm "
                 f"({len(by_order.matches)} kernels matched by order; {expected_kernels} captured NCCL kernel nodes per full set of replays)")


def _check_replayed_keys(graph_trace: dict, captures: list, result: Any,
                         eager_by_name: dict[tuple[str, str], list[dict]], checks: Checks) -> None:
    """Step 3: key by key, every replay's annotation equals the eager profiler's metadata."""
    from commtag.vocab import parse_nccl_kernel

    findings = checks.findings
    replays_seen: dict[tuple[int, int], list] = {}
    for m in result.matches:
        replays_seen.setdefault((m.capture_id, m.annotation.replay), []).append(m)
    findings["replays_annotated"] = sorted(f"capture {c} replay {r}: {len(ms)} events" for (c, r), ms in replays_seen.items())
    main = next((c for c in captures if len(c.collectives) > 1), None)
    in_main = [m for m in result.matches if m.capture_id == (main.capture_id if main else -1)]
    lanes = {(m.annotation.pg_desc, m.annotation.lane_id) for m in in_main}
    checks.check(len(lanes) == len({desc for desc, _ in lanes}) == len({lane for _, lane in lanes}) == 2,
                 f"the step's replayed collectives sit on one lane per process group: {sorted(lanes)}")
    for (name, desc), events in eager_by_name.items():
        expected = events[0]["args"]
        got = [m for m in in_main if m.annotation.collective_name == name and m.annotation.pg_desc == desc]
        name = f"{name} on {desc}"
        replays = sorted({m.annotation.replay for m in got})
        checks.check(replays == [1, 2, 3], f"graph {name}: annotated on each of the 3 profiled replays (replays {replays})")
        diffs, seq_wrong = [], []
        for m in got:
            mine = m.args()
            diff = {k: (expected.get(k), mine.get(k)) for k in KERNEL_EAGER_KEYS
                    if k != SEQ_KEY and (k in expected or k in mine) and expected.get(k) != mine.get(k)}
            if diff:
                diffs.append((m.annotation.replay, m.method, diff))
            captured = main.collectives[m.collective]
            if mine[SEQ_KEY] != captured.annotation.seq or mine.get(ANN_REPLAY) != m.annotation.replay:
                seq_wrong.append(m.annotation.replay)
            event = m.event
            findings.setdefault("replayed_event_names", {}).setdefault(name, sorted({event["name"]}))
            parsed = parse_nccl_kernel(event["name"]) if event.get("cat") == KERNEL_CATEGORY else None
            findings.setdefault("parsed_kernel_names", {})[name] = parsed.__dict__ if parsed else None
        checks.check(bool(got) and not diffs, f"graph {name}: every replayed event's eager keys equal the eager profiler's {diffs[:2] or ''}")
        checks.check(bool(got) and not seq_wrong, f"graph {name}: Seq is the capture-time Seq and the replay index is set {seq_wrong or ''}")
        findings.setdefault("graph_match_methods", {})[name] = sorted({m.method for m in got})


def _check_compiled(out: Path, checks: Checks) -> None:
    """Step 5 (optional): torch.compile(mode="reduce-overhead")'s graphs, matched as the merge would."""
    from commtag.merge.rank.replays import match_graph_replays
    from commtag.merge.inputs.clock import base_ns
    from commtag.sidecarfile import read_sidecar

    findings = checks.findings
    compiled_dir = out / "compiled"
    if compiled_dir.exists() and list(compiled_dir.glob("*.commtag.json")):
        side = read_sidecar(_one(compiled_dir, ".commtag.json"))
        trace = _load(_one(compiled_dir, ".pt.trace.json.gz"))
        res = match_graph_replays(trace["traceEvents"], side.captures, base_ns(trace))
        findings["compile_reduce_overhead_matches"] = len(res.matches)
        findings["compile_reduce_overhead_unmatched"] = [u.__dict__ for u in res.unmatched]
        findings["compile_reduce_overhead_captured"] = [
            (cc.annotation.collective_name, cc.source) for c in side.captures for cc in c.collectives
        ]
        checks.check(bool(res.matches) and not res.unmatched,
                     f"torch.compile(mode='reduce-overhead'): its replayed all_reduce annotated "
                     f"({len(res.matches)} events, {len(res.unmatched)} replays unmatched)")


# ---------------------------------------------------------------------------- provenance


def provenance(out: Path, checks: Checks) -> None:
    import torch

    def version(dist_name: str) -> str:
        try:
            return importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001 - a missing nvidia-smi is written down, not fatal
        smi = f"nvidia-smi unavailable ({exc})"
    try:
        from cuda.bindings import runtime

        cuda_driver = str(runtime.cudaDriverGetVersion()[1])
    except Exception as exc:  # noqa: BLE001 - a driver we cannot ask is written down, not fatal
        cuda_driver = f"unknown ({exc})"
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "unknown"
    info = {
        "gpu": torch.cuda.get_device_name(0),
        "nvidia-smi": smi,
        "cuda driver version (cudaDriverGetVersion)": cuda_driver,
        "torch": torch.__version__,
        "torch cuda": str(torch.version.cuda),
        "nccl": nccl,
        "cuda-bindings": version("cuda-bindings"),
        "cuda-python": version("cuda-python"),
        "python": platform.python_version(),
        "host os": platform.platform(),
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), *sys.orig_argv[1:]]),
        "result": "all checks passed" if not checks.failures else f"{len(checks.failures)} checks failed",
    }
    checks.findings["provenance"] = info
    lines = ["# Provenance of these fixtures", "",
             "Written by launch/gpu_check.py on a lent GPU machine; the CPU tests read them.", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += ["", "## Checks", ""] + [f"- PASS {p}" for p in checks.passed] + [f"- FAIL {f}" for f in checks.failures]
    lines += [f"- NOT MEASURABLE {n}" for n in checks.not_measurable]
    lines += ["", "Hypotheses (docs/cuda-graphs.md):",
              f"- 1 (node id low 32 bits == creation index): {checks.findings.get('hypothesis1')} "
              f"(offsets seen {checks.findings.get('hypothesis1_offsets_seen')})",
              f"- 2 (replay NCCL kernels follow capture order, names confirm): {checks.findings.get('hypothesis2')}", ""]
    (out / "PROVENANCE.md").write_text("\n".join(lines))
    (out / "findings.json").write_text(json.dumps(checks.findings, indent=1, default=str))


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "gpu_graphs")
    args = parser.parse_args(argv)
    nccl2 = subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_check_nccl2.py")),
                            "--out", str(args.out.resolve().parent / "gpu_nccl2")], timeout=900).returncode
    try:
        import torch
    except ImportError as exc:
        return fail_setup(f"torch is not importable ({exc})")
    if not torch.cuda.is_available():
        return fail_setup("no CUDA GPU is visible here; run this on a GPU machine (it checks CUDA-graph replays)")
    if not torch.distributed.is_nccl_available():
        return fail_setup("this torch has no NCCL backend")
    try:
        from cuda.bindings import runtime  # noqa: F401 - only whether it imports matters
    except Exception as exc:  # noqa: BLE001 - any import failure (absent, broken driver) is a setup error
        return fail_setup(f"cuda-python (cuda.bindings) is not importable ({exc}); pip install cuda-bindings")
    out = args.out.resolve()
    for sub in ("eager", "graph", "compiled"):
        for stale in (out / sub).glob("*") if (out / sub).exists() else ():
            stale.unlink()
    out.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    try:
        run_workload(out, checks)
    except Exception as exc:  # noqa: BLE001 - still write what we have
        import traceback

        traceback.print_exc()
        checks.check(False, f"workload ran to the end ({type(exc).__name__}: {exc})")
    try:
        analyse(out, checks)
    except Exception as exc:  # noqa: BLE001 - a crash is a failed check, printed with its traceback
        import traceback

        traceback.print_exc()
        checks.check(False, f"analysis ran to the end ({type(exc).__name__}: {exc})")
    provenance(out, checks)
    print(f"gpu_check: {len(checks.passed)} passed, {len(checks.failures)} failed; fixtures in {out}"
          + ("" if nccl2 == 0 else "; the nccl2 step failed"))
    return 1 if checks.failures or nccl2 != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
