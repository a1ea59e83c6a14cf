"""Property-based fuzzing of the loader and merger on mutated real traces.

Bases: public traces nobody here wrote (old-format DLRM ranks, eager NCCL
metadata from A100/B200, gloo CPU-only, graph ids, HIP-graph replay; large
ones cut down to a few hundred events around their collectives) and the
traces + sidecars of a real 2-rank gloo run with commtag. Hypothesis
changes fields to values of any JSON type and size, deletes fields and
events, duplicates events, damages the distributedInfo and the sidecars,
and cuts or flips the files' bytes.

Properties: the merge either succeeds, and then ``commtag validate`` finds
nothing wrong with what it wrote, or it stops with a MergeInputError that
names a file (never an uncaught exception); a failed merge writes nothing.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from commtag.merge.errors import MergeInputError
from merging import merge
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES as PUBLIC
from gloo_world import run_world

pytestmark = pytest.mark.slow

#: (public files, as ranks) each base is made of.
PUBLIC_BASES = {
    "dlrm-2rank": ["param-dlrm-8rank/worker0_step_12.1694128201545.pt.trace.json.gz",
                   "param-dlrm-8rank/worker1_step_12.1694128201556.pt.trace.json.gz"],
    "hta-2rank": ["hta-sampled-2rank/sampled_rank-0.json.gz", "hta-sampled-2rank/sampled_rank-1.json.gz"],
    "a100-eager": ["eager-nccl-metadata/hta_a100_nccl_data.json.gz"],
    "b200-eager": ["eager-nccl-metadata/tracelens_b200_eager_trace.json.gz"],
    "gloo-cpu": ["edge-cases/hta_gloo_cpu_only_rank34_of300.json.gz"],
    "graph-ids": ["edge-cases/kineto_h100_graph_node_id_zero.json"],
    "hip-graph": ["edge-cases/tracelens_vllm_hipgraph_replay.json.gz"],
    "no-dist-info": ["edge-cases/hta_no_distributed_info.json.gz"],
}
#: Events kept per rank: enough for every kind of event, small enough for many examples.
KEEP = 400
#: Examples per property; COMMTAG_FUZZ_EXAMPLES raises it for a long hunt. Random or derandomized
#: comes from the hypothesis profile (tests/conftest.py: derandomized in CI).
SETTINGS = settings(max_examples=int(os.environ.get("COMMTAG_FUZZ_EXAMPLES", "300")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

EVENT_KEYS = ["ts", "dur", "pid", "tid", "ph", "name", "cat", "args", "s", "id"]
ARG_KEYS = ["correlation", "graph node id", "graph id", "Collective name", "Process Group Name", "Seq",
            "In msg nelems", "dtype", "Process Group Ranks", "Group size", "External id", "stream", "device"]
DIST_KEYS = ["rank", "world_size", "pg_config", "backend"]
PG_KEYS = ["pg_name", "pg_desc", "ranks", "pg_size", "backend_config"]
STRINGS = ["", "../../../tmp/evil", "/etc/passwd", "gloo:all_reduce", "c10d::allreduce_", "kernel", "cuda_runtime",
           "cudaGraphLaunch", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", "X", "i", "M", "0",
           "[0, 1]", "[0, ..., 7]", "Float", "allreduce", "send", "CPU", "GPU 0", "\u0000\ufffd\U0001F600"]

scalars = (
    st.none() | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, 1, -1, 2**31, 2**63 - 1, 2**63, 2**64, 1e18, 1e300, 1.5, 0.25])
    | st.sampled_from(STRINGS) | st.text(max_size=6)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(ARG_KEYS + EVENT_KEYS) | st.text(max_size=4), children, max_size=3),
    max_leaves=6,
)
index = st.integers(min_value=0, max_value=10**6)  # taken modulo the list length
event_mutation = st.one_of(
    st.tuples(st.just("set"), index, st.sampled_from(EVENT_KEYS), json_values),
    st.tuples(st.just("arg"), index, st.sampled_from(ARG_KEYS), json_values),
    st.tuples(st.just("del"), index, st.sampled_from(EVENT_KEYS)),
    st.tuples(st.just("drop"), index),
    st.tuples(st.just("dup"), index),
    st.tuples(st.just("replace"), index, json_values),
    st.tuples(st.just("dist"), st.sampled_from(DIST_KEYS), json_values),
    st.tuples(st.just("pg"), index, st.sampled_from(PG_KEYS), json_values),
    st.tuples(st.just("top"), st.sampled_from(["baseTimeNanoseconds", "distributedInfo", "deviceProperties",
                                               "traceEvents", "schemaVersion"]), json_values),
)


def _read(path: Path) -> dict:
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _cut_down(trace: dict) -> dict:
    """Keep metadata, every collective-related event and the first others, up to KEEP events."""
    events = trace["traceEvents"]
    def wanted(e: dict) -> bool:
        name = str(e.get("name", "")).lower()
        return e.get("ph") == "M" or "nccl" in name or "c10d" in name or "gloo" in name or "graph" in name
    keep = [e for e in events if wanted(e)][: KEEP // 2]
    keep += [e for e in events if not wanted(e)][: KEEP - len(keep)]
    return {**trace, "traceEvents": keep}


def _gloo_run(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    commtag.install()
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        t = torch.ones(8)
        dist.all_reduce(t)
        dist.broadcast(t, src=1)
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        dist.barrier()
    commtag.uninstall()


#: Every base as a list of (file name, parsed JSON): traces, and sidecars where there are any.
#: Module-level rather than a fixture argument, so Hypothesis does not print it with each example.
BASES: dict[str, list[tuple[str, dict]]] = {}


@pytest.fixture(scope="module", autouse=True)
def _bases(tmp_path_factory: pytest.TempPathFactory):
    # Single files get a "rank0." prefix: the rank of a trace without distributedInfo comes from its name.
    out: dict[str, list[tuple[str, dict]]] = {
        key: [(("rank0." if len(names) == 1 else "") + Path(name).name, _cut_down(_read(PUBLIC / name)))
              for name in names]
        for key, names in PUBLIC_BASES.items()
    }
    run = tmp_path_factory.mktemp("gloo_fuzz_base")
    run_world(_gloo_run, 2, str(run))
    out["gloo-commtag"] = [(p.name, _read(p)) for p in sorted(run.iterdir())]
    BASES.update(out)
    yield
    BASES.clear()


def _at(items: list, i: int) -> int:
    return i % len(items)


def _mutate_trace(trace: dict, mutation: tuple) -> None:
    kind = mutation[0]
    events = trace.get("traceEvents")
    if kind in ("set", "arg", "del", "drop", "dup", "replace") and (not isinstance(events, list) or not events):
        return
    if kind == "set":
        e = events[_at(events, mutation[1])]
        if isinstance(e, dict):
            e[mutation[2]] = mutation[3]
    elif kind == "arg":
        e = events[_at(events, mutation[1])]
        if isinstance(e, dict):
            args = e.setdefault("args", {})
            if isinstance(args, dict):
                args[mutation[2]] = mutation[3]
    elif kind == "del":
        e = events[_at(events, mutation[1])]
        if isinstance(e, dict):
            e.pop(mutation[2], None)
    elif kind == "drop":
        events.pop(_at(events, mutation[1]))
    elif kind == "dup":
        i = _at(events, mutation[1])
        events.insert(i, json.loads(json.dumps(events[i])))
    elif kind == "replace":
        events[_at(events, mutation[1])] = mutation[2]
    elif kind == "dist":
        info = trace.get("distributedInfo")
        if isinstance(info, dict):
            info[mutation[1]] = mutation[2]
    elif kind == "pg":
        info = trace.get("distributedInfo")
        pgs = info.get("pg_config") if isinstance(info, dict) else None
        if isinstance(pgs, list) and pgs and isinstance(pgs[_at(pgs, mutation[1])], dict):
            pgs[_at(pgs, mutation[1])][mutation[2]] = mutation[3]
    elif kind == "top":
        trace[mutation[1]] = mutation[2]


def _mutate_tree(node: object, path: list[int], value: object, delete: bool) -> None:
    """Set (or delete) the value at a path of indices walked down a JSON tree."""
    for step_no, step in enumerate(path):
        children = list(node.keys()) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        if not children:
            return
        key = children[step % len(children)]
        last = step_no == len(path) - 1
        if last:
            if delete:
                del node[key]
            else:
                node[key] = value
            return
        node = node[key]


def _write(directory: Path, name: str, data: dict) -> Path:
    # The standard library writes integers of any size (orjson stops at 64 bits).
    raw = json.dumps(data).encode()
    path = directory / name
    path.write_bytes(gzip.compress(raw, compresslevel=1) if name.endswith(".gz") else raw)
    return path


def _check_merge(directory: Path, skip: bool, align: str) -> None:
    """The properties: a clear input error writing nothing, or an output that validates."""
    out = directory / "merged.pftrace"
    try:
        result = merge(directory, out, progress=False, skip_bad_ranks=skip, align=align)
    except MergeInputError as exc:
        event("input error")
        assert str(exc.path) and str(exc).startswith(f"{exc.path}: ") and exc.problem
        assert not out.exists()
        assert not [p for p in directory.iterdir() if ".tmp-" in p.name or ".shard" in p.name]
        return
    event("merged, some skipped" if result.skipped else "merged")
    assert validate_file(out) == []


@SETTINGS
@given(base=st.sampled_from(sorted(PUBLIC_BASES) + ["gloo-commtag"]), which=index,
       mutations=st.lists(event_mutation, min_size=1, max_size=6), skip=st.booleans(),
       align=st.sampled_from(["none", "collectives"]))
# Found by a random run: a base time written after the events that moves them past int64 overflowed
# the rows' arrays while they were shifted, before the bounds were checked.
@example(base="a100-eager", which=0, mutations=[("set", 0, "ts", 0), ("top", "baseTimeNanoseconds", 9_218_913_359_802_718_666)],
         skip=False, align="none")
# Found by random runs: a kernel whose "Collective name" or "External id" is a list ended in a TypeError in attach.
@example(base="a100-eager", which=0, mutations=[("arg", 42, "Collective name", [0])], skip=False, align="none")
@example(base="a100-eager", which=0, mutations=[("arg", 42, "External id", [])], skip=False, align="none")
def test_mutated_traces_merge_or_fail_clearly(base, which, mutations, skip, align):
    files = BASES[base]
    traces = [i for i, (name, _) in enumerate(files) if "commtag" not in name]
    target = traces[_at(traces, which)]
    with tempfile.TemporaryDirectory(prefix="fuzz_merge_") as tmp:
        directory = Path(tmp)
        for i, (name, data) in enumerate(files):
            if i == target:
                data = json.loads(json.dumps(data))
                for mutation in mutations:
                    _mutate_trace(data, mutation)
            _write(directory, name, data)
        _check_merge(directory, skip, align)


@SETTINGS
@given(which=index, edits=st.lists(st.tuples(st.lists(index, min_size=1, max_size=6), json_values, st.booleans()),
                                   min_size=1, max_size=4), skip=st.booleans())
def test_mutated_sidecars_merge_or_fail_clearly(which, edits, skip):
    files = BASES["gloo-commtag"]
    sidecars = [i for i, (name, _) in enumerate(files) if name.endswith(".commtag.json")]
    target = sidecars[_at(sidecars, which)]
    with tempfile.TemporaryDirectory(prefix="fuzz_sidecar_") as tmp:
        directory = Path(tmp)
        for i, (name, data) in enumerate(files):
            if i == target:
                data = json.loads(json.dumps(data))
                for path, value, delete in edits:
                    _mutate_tree(data, path, value, delete)
            _write(directory, name, data)
        _check_merge(directory, skip, "none")


@SETTINGS
@given(base=st.sampled_from(sorted(PUBLIC_BASES) + ["gloo-commtag"]), which=index,
       damage=st.one_of(st.tuples(st.just("cut"), st.floats(min_value=0, max_value=1)),
                        st.tuples(st.just("flip"), st.floats(min_value=0, max_value=1), st.integers(1, 255)),
                        st.tuples(st.just("raw-cut"), st.floats(min_value=0, max_value=1))),
       skip=st.booleans())
def test_damaged_bytes_merge_or_fail_clearly(base, which, damage, skip):
    files = BASES[base]
    target = _at(files, which)
    with tempfile.TemporaryDirectory(prefix="fuzz_bytes_") as tmp:
        directory = Path(tmp)
        paths = [_write(directory, name, data) for name, data in files]
        victim = paths[target]
        raw = victim.read_bytes()
        if damage[0] == "raw-cut":  # cut inside the JSON, then compress again: valid gzip, broken JSON
            text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
            text = text[: int(len(text) * damage[1])]
            raw = gzip.compress(text, compresslevel=1) if victim.name.endswith(".gz") else text
        elif damage[0] == "cut":
            raw = raw[: int(len(raw) * damage[1])]
        else:
            at = min(len(raw) - 1, int(len(raw) * damage[1]))
            raw = raw[:at] + bytes([raw[at] ^ damage[2]]) + raw[at + 1:]
        victim.write_bytes(raw)
        _check_merge(directory, skip, "none")


def test_the_bases_merge_cleanly(tmp_path: Path):
    """Unmutated, every base merges and validates: the fuzz starts from good inputs."""
    for key, files in BASES.items():
        directory = tmp_path / key
        directory.mkdir()
        for name, data in files:
            _write(directory, name, data)
        result = merge(directory, directory / "merged.pftrace", progress=False)
        assert result.ranks, key
        assert validate_file(directory / "merged.pftrace") == [], key
        shutil.rmtree(directory)
