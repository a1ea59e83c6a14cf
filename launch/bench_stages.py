"""Where a merge's time goes: CPU seconds per stage, per rank and per event, against the parse floor.

One ``-j 1`` merge runs in this process through the library, each stage wrapped in a timer
(instrumentation only: the stages run unchanged and write the same bytes). Times are exclusive:
a stage's own CPU, less the stages it calls (reading a batch is "parse", not "convert"). Then the
parse floor of the same files (gunzip + orjson of every trace and sidecar) runs in the same process,
``--reps`` times each, alternating, so the ratio is of one sitting. CPU time (``time.process_time``)
is read, not wall time: the machine is shared.

The stages, in a merge's order:

* ``discovery``: finding the files, their ranks, the sidecars' heads (``inputs/load.py``);
* ``sidecars``: reading and validating each sidecar whole (``inputs/sidecars.py``);
* ``parse``: inflating a trace and orjson on its batches (``inputs/jsonstream.py``);
* ``convert``: checking, placing and encoding each event (``rank/convert.py: feed``);
* ``attach``: gloo, replays, eager metadata (``rank/attach.py``);
* ``settle``: encoding the attached events, launch flows (``rank/convert.py: _settle``);
* ``rows``: a rank's rows named and ordered, its summary (``timeline``, ``rank_summary``);
* ``write``: the rows as packets (``pftrace/writer.py: write_rank``);
* ``keep``: a rank's records kept until the analysis (``engine/shards.py: Held.take``; packed only
  where workers exchange them: a world of one, as this merge is, hands the objects over);
* ``wire``: records as JSON columns and back (``engine/exchange.py: to_wire, from_wire``, which
  ``engine/routes.py`` calls in ``keep`` and between the analysis' rounds, with workers only);
* ``analysis``: matching, skew, bandwidth, impact (``engine/shards.py: analyse``, ``gather``);
* ``lanes``: the lanes block (``engine/pipeline.py: write_lanes``);
* ``other``: the rest of the merge (the plan, its checks, publishing the output).

Usage: ``python launch/bench_stages.py DIR [--reps 3] [--detail none] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import orjson

from commtag.testing.bench import machine, markdown_table, median, verdict

#: stage -> what it wraps: (module, attribute path). A wrapped function's time is its stage's, less
#: the time of the wrapped functions it calls.
STAGES: dict[str, list[tuple[str, str]]] = {
    "discovery": [("commtag.merge.engine.pipeline", "discover")],
    "sidecars": [("commtag.merge.rank.stage", "load_sidecar")],
    "parse": [("commtag.merge.inputs.jsonstream", "TraceStream.batches")],
    "convert": [("commtag.merge.rank.convert", "RankConverter.feed")],
    "attach": [("commtag.merge.rank.convert", "attach")],
    "settle": [("commtag.merge.rank.convert", "RankConverter._settle")],
    "rows": [("commtag.merge.rank.convert", "RankConverter.timeline"),
             ("commtag.merge.engine.pipeline", "rank_summary")],
    "write": [("commtag.merge.pftrace.writer", "write_rank")],
    "keep": [("commtag.merge.engine.shards", "Held.take")],
    "wire": [("commtag.merge.engine.routes", "to_wire"), ("commtag.merge.engine.routes", "from_wire")],
    "analysis": [("commtag.merge.engine.pipeline", "share_analysis"), ("commtag.merge.engine.pipeline", "gather")],
    "lanes": [("commtag.merge.engine.pipeline", "write_lanes")],
}
#: Targets of a merge's CPU against the parse floor's, by (ranks, --detail): many small ranks.
TARGETS = {(128, None): 3.0, (1024, "none"): 2.0}
#: The stages that run once per rank (the rest once per merge).
PER_RANK = ("sidecars", "parse", "convert", "attach", "settle", "rows", "write", "keep")


class StageClock:
    """Exclusive CPU time per stage: entering a stage pauses the one it was called from."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list[Any]] = []  # [stage, started, time of callees]

    def enter(self, stage: str) -> None:
        self._stack.append([stage, time.process_time(), 0.0])

    def leave(self) -> None:
        stage, started, inner = self._stack.pop()
        took = time.process_time() - started
        self.spent[stage] = self.spent.get(stage, 0.0) + took - inner
        self.calls[stage] = self.calls.get(stage, 0) + 1
        if self._stack:
            self._stack[-1][2] += took

    def wrap(self, stage: str, func: Callable) -> Callable:
        clock = self

        def timed(*args, **kwargs):
            clock.enter(stage)
            try:
                return func(*args, **kwargs)
            finally:
                clock.leave()

        def timed_generator(*args, **kwargs):
            inner = func(*args, **kwargs)
            while True:
                clock.enter(stage)
                try:
                    item = next(inner)
                except StopIteration:
                    return
                finally:
                    clock.leave()
                yield item

        return timed_generator if stage == "parse" else timed


def _instrument(clock: StageClock) -> None:
    import importlib

    for stage, targets in STAGES.items():
        for module_name, attribute in targets:
            owner: Any = importlib.import_module(module_name)
            *path, name = attribute.split(".")
            for part in path:
                owner = getattr(owner, part)
            setattr(owner, name, clock.wrap(stage, getattr(owner, name)))


def floor(directory: Path) -> None:
    """The parse floor: decompress and parse every input, keep nothing (launch/bench_merge.py's)."""
    for path in sorted(directory.glob("*.pt.trace.json.gz")):
        orjson.loads(gzip.decompress(path.read_bytes()))
    for path in sorted(directory.glob("*.commtag.json")):
        orjson.loads(path.read_bytes())


def measure(directory: Path, reps: int, detail: Optional[str]) -> dict:
    """Floor and an instrumented merge, alternating, ``reps`` times; CPU seconds of each."""
    from commtag.merge import merge
    from commtag.merge.inputs.selection import Selection, parse_detail

    selection = Selection(detail=parse_detail(detail)) if detail is not None else None
    clock = StageClock()
    _instrument(clock)
    runs = []
    for _ in range(reps):
        gc.collect()
        start = time.process_time()
        floor(directory)
        floor_s = time.process_time() - start
        clock.spent.clear()
        clock.calls.clear()
        with tempfile.TemporaryDirectory(prefix="commtag-stages-") as out:
            gc.collect()
            start = time.process_time()
            result = merge(directory, Path(out) / "merged.pftrace", selection=selection, progress=False, jobs=1)
            total = time.process_time() - start
        stages = dict(clock.spent)
        stages["other"] = total - sum(stages.values())
        runs.append({"floor_s": floor_s, "merge_s": total, "stages": stages, "ranks": len(result.ranks),
                     "events": sum(a.read for a in result.accounts)})
        print(f"floor {floor_s:.2f} s CPU, merge {total:.2f} s CPU ({total / floor_s:.2f}x)", file=sys.stderr, flush=True)
    return {"machine": machine(), "directory": str(directory), "detail": detail, "runs": runs}


def report(results: dict) -> str:
    """The breakdown as markdown: each stage's median CPU, its share, per rank and per event."""
    runs = results["runs"]
    ranks, events = runs[0]["ranks"], runs[0]["events"]
    floor_s = median([r["floor_s"] for r in runs])
    total = median([r["merge_s"] for r in runs])
    ratio = median([r["merge_s"] / r["floor_s"] for r in runs])
    target = TARGETS.get((ranks, results["detail"]))
    said = f"\n\nTarget: merge <= {target}x the parse floor: {ratio:.2f}x, {verdict(ratio, target)}." if target else ""
    rows = []
    for stage in [*STAGES, "other"]:
        spent = median([r["stages"].get(stage, 0.0) for r in runs])
        rows.append([stage, f"{spent:.2f}", f"{spent / total:.0%}", f"{spent / floor_s:.2f}x",
                     f"{spent / ranks * 1e3:.2f}" if stage in PER_RANK else "-", f"{spent / events * 1e6:.2f}"])
    rows.append(["merge", f"{total:.2f}", "100%", f"{ratio:.2f}x",
                 f"{total / ranks * 1e3:.2f}", f"{total / events * 1e6:.2f}"])
    rows.append(["parse floor", f"{floor_s:.2f}", "", "1.00x", f"{floor_s / ranks * 1e3:.2f}",
                 f"{floor_s / events * 1e6:.2f}"])
    head = (f"{results['directory']}: {ranks} ranks, {events:,} events, --detail {results['detail'] or '(all)'}; "
            f"medians of {len(runs)} alternating runs, CPU seconds; {results['machine']}.")
    return head + "\n\n" + markdown_table(["stage", "CPU s", "of the merge", "vs floor", "ms per rank", "µs per event"],
                                          rows) + said


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="a generated set (launch/gen_scaleset.py)")
    parser.add_argument("--reps", type=int, default=3, help="alternating runs of floor and merge (default 3)")
    parser.add_argument("--detail", help="the merge's --detail (default: every rank)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    results = measure(args.directory, args.reps, args.detail)
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
