"""Nothing goes missing unsaid: every event of every trace we have is in the merged trace, or
counted under a reason.

The inputs are every public trace other projects wrote (tests/data/public, at any
depth) and a real gloo run
profiled here. For each rank, read
independently from its JSON: every complete event must be a slice of the
merged trace on the rank's own rows with the same name, start and end (ns on
the absolute base, ``ts * 1000 + baseTimeNanoseconds``), every instant an
instant, and the merge's account must add up: events read = written + left
out, the left-out counted by their kind.
"""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from commtag.vocab import ANN_KERNELS_SCOPE
from commtag.merge.rank.rows import left_out_reason
from commtag.merge.inputs.load import discover
from merging import merge
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES as SHARED_PUBLIC
from gloo_world import run_world
from pftrace_reader import lane_of, read
from torchrun_merge import torchrun_merge



def _load(path: Path) -> dict:
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _is_trace(path: Path) -> bool:
    if not path.name.endswith((".json", ".json.gz")):
        return False
    data = _load(path)
    return isinstance(data, dict) and isinstance(data.get("traceEvents"), list)


PUBLIC_TRACES = sorted(p for p in SHARED_PUBLIC.rglob("*") if _is_trace(p))


def _ns(value: float) -> int:
    return value * 1000 if isinstance(value, int) else round(value * 1000)


def _expected(files: list[Path]) -> tuple[Counter, Counter, Counter, int]:
    """One rank's complete events (name, start, end), instants (name, ts), reasons for the
    others, and the number of events, from its JSON files alone."""
    slices: Counter = Counter()
    instants: Counter = Counter()
    left: Counter = Counter()
    read = 0
    for path in files:
        trace = _load(path)
        base = trace.get("baseTimeNanoseconds", 0)
        for e in trace["traceEvents"]:
            read += 1
            if e.get("ph") == "X":
                start = _ns(e["ts"]) + base
                slices[(e.get("name", ""), start, start + _ns(e.get("dur", 0)))] += 1
            elif e.get("ph") in ("i", "I"):
                instants[(e.get("name", ""), _ns(e["ts"]) + base)] += 1
            else:
                left[left_out_reason(e.get("ph"), e.get("cat"))] += 1
    return slices, instants, left, read


def _written(out: Path) -> dict[int, tuple[Counter, Counter]]:
    """Per rank, the slices and instants on its own rows (not its lanes, not commtag's
    kernel-category instants), read back from the merged file."""
    parsed = read(out)
    found: dict[int, tuple[Counter, Counter]] = {}
    for s in parsed.slices:
        path = parsed.name_path(s.track)
        if lane_of(parsed, s) is not None or path[1] == "commtag markers" or (s.instant and ANN_KERNELS_SCOPE in s.args):
            continue
        rank = int(re.match(r"rank (\d+) ", path[0]).group(1))
        slices, instants = found.setdefault(rank, (Counter(), Counter()))
        if s.instant:
            instants[(s.name, s.ts)] += 1
        else:
            slices[(s.name, s.ts, s.end)] += 1
    return found


def assert_accounted(inputs: list[Path], out: Path, result) -> None:
    assert validate_file(out) == []
    written = _written(out)
    ranks = discover(inputs)
    assert [r.rank for r in ranks] == result.ranks
    expected = {rank.rank: _expected([f.path for f in rank.files]) for rank in ranks}
    for rank, (slices, instants, _, _) in expected.items():
        got_slices, got_instants = written.get(rank, (Counter(), Counter()))
        missing = slices - got_slices
        assert not missing, (rank, len(missing), list(missing.items())[:5])
        assert got_slices == slices, (rank, list((got_slices - slices).items())[:5])
        assert got_instants == instants, (rank, instants - got_instants, got_instants - instants)
    accounts = {a.rank: a for a in result.accounts}
    assert sorted(accounts) == result.ranks
    for rank, (slices, instants, left, read_count) in expected.items():
        account = accounts[rank]
        assert account.read == read_count
        assert account.written == sum(slices.values()) + sum(instants.values())
        assert account.left_out == dict(left)
        assert account.read == account.written + sum(account.left_out.values())


@pytest.mark.parametrize("trace", PUBLIC_TRACES, ids=lambda p: p.name)
def test_every_public_event_is_written_or_accounted_for(tmp_path: Path, trace: Path) -> None:
    # A file name with a rank in it: some public traces name none.
    src = tmp_path / f"rank0.{trace.name}"
    src.symlink_to(trace)
    out = tmp_path / "merged.pftrace"
    result = merge([src], out, progress=False)
    assert_accounted([src], out, result)


def test_the_public_traces_were_found() -> None:
    assert len(PUBLIC_TRACES) >= 19, f"expected the public traces under {SHARED_PUBLIC}"


def _profiled_run(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    import commtag

    commtag.install()
    try:
        pair = dist.new_group([0, 1])
        ends = dist.new_group([0, world_size - 1])
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=1, repeat=2),
                     on_trace_ready=commtag.trace_handler(out_dir)) as prof:
            for _ in range(2):  # two profiled steps: two trace files per rank
                t = torch.ones(64)
                dist.all_reduce(t)
                if rank in (0, 1):
                    dist.all_reduce(t, group=pair)
                if rank in (0, world_size - 1):
                    dist.broadcast(t, src=0, group=ends)
                dist.all_gather_into_tensor(torch.empty(64 * world_size), t)
                dist.barrier()
                prof.step()
    finally:
        commtag.uninstall()


@pytest.fixture(scope="module")
def gloo_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gloo3")
    run_world(_profiled_run, 3, str(out))
    return out


@pytest.mark.slow
def test_every_gloo_event_is_written_or_accounted_for(gloo_traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged.pftrace"
    result = merge(gloo_traces, out, progress=False)
    assert len(list(gloo_traces.glob("*.pt.trace.json.gz"))) == 6  # 3 ranks x 2 steps
    assert result.instances  # the collectives were attached: their events are written with their keys
    assert_accounted([gloo_traces], out, result)


def _account_lines(stderr: str) -> dict[int, str]:
    lines = [ln for ln in stderr.splitlines() if re.match(r"commtag merge: rank \d+: ", ln)]
    return {int(ln.split()[3].rstrip(":")): ln for ln in lines}


@pytest.mark.slow
def test_the_cli_says_per_rank_what_it_read_wrote_and_left_out(gloo_traces: Path, tmp_path: Path) -> None:
    result = merge(gloo_traces, tmp_path / "api.pftrace", progress=False)
    plain = subprocess.run([sys.executable, "-m", "commtag", "merge", str(gloo_traces), "-o", str(tmp_path / "a"),
                            "--no-progress"], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    lines = _account_lines(plain.stderr)
    assert sorted(lines) == [0, 1, 2]
    for account in result.accounts:
        line = lines[account.rank]
        assert (f"rank {account.rank}: {account.read} events read, {account.written} written, "
                f"{account.flows} launch flows drawn; left out: ") in line
        for reason, n in account.left_out.items():
            assert f"{n} {reason}" in line
    assert "left out: " not in plain.stderr.replace("; left out: ", "")  # no per-event list without --verbose

    verbose = subprocess.run([sys.executable, "-m", "commtag", "merge", str(gloo_traces), "-o", str(tmp_path / "b"),
                              "--no-progress", "--verbose"], capture_output=True, text=True, timeout=300)
    assert verbose.returncode == 0, verbose.stderr
    assert _account_lines(verbose.stderr) == lines
    listed = [ln for ln in verbose.stderr.splitlines() if ln.startswith("commtag merge:   left out: ")]
    assert len(listed) == sum(n for a in result.accounts for n in a.left_out.values())
    # each listed event names its file, its index there and its reason, and is what that file holds
    for ln in listed[:50]:
        where = re.match(r"commtag merge:   left out: (.+): traceEvents\[(\d+)\] (.*?): (.+)$", ln)
        assert where, ln
        event = _load(Path(where.group(1)))["traceEvents"][int(where.group(2))]
        assert where.group(3) == repr(event.get("name"))
        assert where.group(4) == left_out_reason(event.get("ph"), event.get("cat"))


@pytest.mark.slow
def test_torchrun_workers_report_the_same_accounts(gloo_traces: Path, tmp_path: Path) -> None:
    single = subprocess.run([sys.executable, "-m", "commtag", "merge", str(gloo_traces), "-o", str(tmp_path / "one"),
                             "--no-progress"], capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    double = torchrun_merge([str(gloo_traces), "-o", str(tmp_path / "two"), "--no-progress"])
    assert double.returncode == 0, double.stderr[-3000:]
    assert _account_lines(double.stderr) == _account_lines(single.stderr)
    assert len(_account_lines(single.stderr)) == 3


def _spans(files: list[Path]) -> list[tuple[str, int, int]]:
    """The profiler's own span events of a rank's files ("PyTorch Profiler (0)", pid "Spans")."""
    found = []
    for path in files:
        trace = _load(path)
        base = trace.get("baseTimeNanoseconds", 0)
        for e in trace["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "Trace":
                assert e["pid"] == "Spans"
                start = _ns(e["ts"]) + base
                found.append((e["name"], start, start + _ns(e["dur"])))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("source", ["gloo", "dlrm"])
def test_the_profilers_own_span_is_a_row_of_its_rank(gloo_traces: Path, tmp_path: Path, source: str) -> None:
    inputs = gloo_traces if source == "gloo" else SHARED_PUBLIC / "param-dlrm-8rank"
    out = tmp_path / "merged.pftrace"
    merge(inputs, out, progress=False)
    parsed = read(out)
    for rank in discover([inputs]):
        spans = _spans([f.path for f in rank.files])
        assert len(spans) == len(rank.files)  # one per profiled step
        assert all(name.startswith("PyTorch Profiler (") for name, _, _ in spans)
        rows = [(s.name, s.ts, s.end) for s in parsed.slices
                if parsed.name_path(s.track) and parsed.name_path(s.track)[0].startswith(f"rank {rank.rank} ")
                and parsed.name_path(s.track)[1:] == ["Spans", "PyTorch Profiler"]]
        assert sorted(rows) == sorted(spans)
