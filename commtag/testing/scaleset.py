"""Build an N-rank scale set (Kineto traces + commtag sidecars) from a public single-rank trace.

Why: nobody here has a 128-rank GPU job, yet the merge must be measured on one.
Every rank is a clone of the same window of a real Kineto trace (SPMD), so the
background is real data; on top of it this adds what a commtag-instrumented job
would contain:

* ``distributedInfo`` with a ``pg_config`` of several process groups
  (default, tensor-parallel blocks of ``--tp`` ranks, data-parallel strides);
* the template's own NCCL kernels as eager collectives: eager metadata on the
  kernel (as the profiler writes it) and a recorded call in the sidecar;
* CUDA-graph replays: a ``cudaGraphLaunch`` on a launcher thread and the
  replayed kernels (compute and NCCL) carrying ``"graph id"``/``"graph node
  id"``, and the matching :class:`~commtag.schema.GraphCapture` records;
* the template's own ``cudaGraphLaunch`` kernels (graphs without
  collectives) get graph ids too, as Kineto writes them;
* a per-node clock offset and per-rank arrival jitter; collectives end
  together in true time, as they do on real hardware.

Usage: ``python -m commtag.testing.scaleset --ranks 32 -o /tmp/commtag-scale-32`` (or
``python launch/gen_scaleset.py ...``); tests and ``launch/bench_merge.py`` call it so, and
``launch/bench_scale.py`` with ``--ranks 1024 --tp 8 --ranks-per-node 8``.
The ground truth (clock offsets, counts) goes to ``scaleset.manifest.json``.
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import orjson

from commtag.atomic import write_atomic
from commtag.constants import SIDECAR_SUFFIX, TRACE_SUFFIX
from commtag.runtime.record.sidecar import dumps, sidecar_name
from commtag.testing.scale.plan import GRAPH_FRACTION, GRAPHS, RANKS_PER_NODE, STEP, Group, SetPlan, build_groups, plan_set, replay_budget
from commtag.testing.scale.rank import build_rank
from commtag.testing.scale.template import TEMPLATE_DIR, TEMPLATES, load_template

MANIFEST_NAME = "scaleset.manifest.json"
#: Bumped whenever the generated content changes, so benchmarks regenerate stale sets.
GENERATOR_VERSION = 4


@dataclass
class SetSummary:
    """What was written, for the manifest and the benchmark."""

    out_dir: str
    generator_version: int
    #: The arguments it was made with: a later run with the same ones may reuse it.
    requested: dict
    ranks: int
    template: str
    events: int
    json_bytes: int
    gz_bytes: int
    largest_rank_json_bytes: int
    collectives_per_rank: int
    replays_per_rank: int
    captures_per_rank: int
    clock_offset_us: list[float]
    #: role -> [number of groups, ranks in each]: what the job's pg_configs hold together.
    process_groups: dict[str, list[int]]
    #: role -> collective calls each rank makes in its group of that role (eager ones and those inside
    #: graph replays); their sum is the rank's lane slices.
    collective_calls_per_rank: dict[str, int]


def requested_args(total_events: int, template: str, seed: int, graph_fraction: float, node_id_format: str,
                   ranks_per_node: int, tp: Optional[int]) -> dict:
    """The arguments a set is made with, as its manifest keeps them (``tp`` only when asked, so sets made
    before the option existed are still reused)."""
    requested = {"events": total_events, "template": template, "seed": seed, "graph_fraction": graph_fraction,
                 "node_id_format": node_id_format, "ranks_per_node": ranks_per_node}
    if tp is not None:
        requested["tp"] = tp
    return requested


def calls_by_role(plan: SetPlan) -> dict[str, int]:
    """Collective calls of one rank per group role: the template's eager ones, then those of every replay."""
    calls = {role: 0 for role in ("default", "tp", "dp")}
    for _, role, _ in plan.template.nccl:
        calls[role] += 1
    for _, graph in plan.replay_times:
        for kind in GRAPHS[graph].nodes:
            if isinstance(kind, tuple):
                calls[kind[0]] += 1
    return calls


def generate(
    out_dir: Path,
    ranks: int,
    total_events: int = 1_000_000,
    template: str = "v100",
    seed: int = 0,
    graph_fraction: float = GRAPH_FRACTION,
    node_id_format: str = "low",
    ranks_per_node: int = RANKS_PER_NODE,
    compresslevel: int = 6,
    progress: bool = False,
    tp: Optional[int] = None,
) -> SetSummary:
    """Write ``ranks`` traces and sidecars with at least ``total_events`` events in all; ``tp`` ranks per
    tensor-parallel group (default :func:`default_tp`), ``ranks / tp`` per data-parallel group."""
    if ranks < 2:
        raise ValueError("a scale set needs at least 2 ranks")
    build_groups(ranks, tp)  # a tp that does not divide the world is refused before anything is written
    path = TEMPLATE_DIR / TEMPLATES.get(template, template)
    if not path.is_file():
        raise FileNotFoundError(f"template {path} not found (known: {', '.join(TEMPLATES)})")
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = [p for p in out_dir.iterdir() if p.name.endswith((TRACE_SUFFIX, SIDECAR_SUFFIX))]
    if stale and not (out_dir / MANIFEST_NAME).is_file():
        raise ValueError(f"{out_dir} holds traces that are not a generated scale set; choose another directory")
    for old in stale:  # an earlier generated set: its ranks must not mix with the new ones
        old.unlink()
    requested = requested_args(total_events, template, seed, graph_fraction, node_id_format, ranks_per_node, tp)
    per_rank = math.ceil(total_events / ranks)
    replays, added = replay_budget(per_rank, graph_fraction)
    template_window = load_template(path, max(100, per_rank - added))
    plan = plan_set(ranks, template_window, seed, replays, node_id_format, ranks_per_node, tp)
    events = json_bytes = gz_bytes = largest = 0
    for rank in range(ranks):
        trace, sidecar, count = build_rank(plan, rank)
        raw = orjson.dumps(trace)
        packed = gzip.compress(raw, compresslevel=compresslevel)
        write_atomic(out_dir / sidecar.trace_file, packed)
        write_atomic(out_dir / sidecar_name(rank, STEP), dumps(sidecar))
        events += count
        json_bytes += len(raw)
        gz_bytes += len(packed)
        largest = max(largest, len(raw))
        if progress:
            print(f"\r{out_dir}: rank {rank + 1}/{ranks}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    summary = SetSummary(
        out_dir=str(out_dir),
        generator_version=GENERATOR_VERSION,
        requested=requested,
        ranks=ranks,
        template=path.name,
        events=events,
        json_bytes=json_bytes,
        gz_bytes=gz_bytes,
        largest_rank_json_bytes=largest,
        collectives_per_rank=len(plan.template.nccl),
        replays_per_rank=len(plan.replay_times),
        captures_per_rank=len(GRAPHS),
        clock_offset_us=[round(x, 3) for x in plan.clock_offset_us],
        process_groups=_group_counts(plan.groups),
        collective_calls_per_rank=calls_by_role(plan),
    )
    write_atomic(out_dir / MANIFEST_NAME, orjson.dumps(summary.__dict__, option=orjson.OPT_INDENT_2))
    return summary


def _group_counts(groups: Sequence[Group]) -> dict[str, list[int]]:
    counts: dict[str, list[int]] = {}
    for g in groups:
        counts.setdefault(g.role, [0, len(g.ranks)])[0] += 1
    return counts


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="world size N (default 8)")
    parser.add_argument("--events", type=int, default=1_000_000, help="events in all ranks together (default 1M)")
    parser.add_argument("--template", default="v100", help=f"one of {', '.join(TEMPLATES)} or a file name")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--node-id-format", choices=("low", "full"), default="low",
                        help="'graph node id' as the node index or as (graph id << 32) | index")
    parser.add_argument("--ranks-per-node", type=int, default=RANKS_PER_NODE,
                        help="ranks sharing a host clock (default %(default)s)")
    parser.add_argument("--tp", type=int, default=None,
                        help="ranks per tensor-parallel group, a divisor of --ranks; the data-parallel groups "
                             "take one rank of each (default: 4 from 8 ranks up, else half the world)")
    parser.add_argument("-o", "--out", type=Path, default=None, help="output directory (default /tmp/commtag-scale-N)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the set already in the directory if it was made with the same arguments")
    args = parser.parse_args(argv)
    out = args.out or Path(f"/tmp/commtag-scale-{args.ranks}")
    if args.reuse and (out / MANIFEST_NAME).is_file():
        manifest = orjson.loads((out / MANIFEST_NAME).read_bytes())
        wanted = requested_args(args.events, args.template, args.seed, GRAPH_FRACTION, args.node_id_format,
                                args.ranks_per_node, args.tp)
        if (manifest.get("generator_version"), manifest.get("ranks"), manifest.get("requested")) == (
            GENERATOR_VERSION, args.ranks, wanted
        ):
            print(orjson.dumps(manifest).decode())
            return 0
    try:
        summary = generate(out, args.ranks, args.events, args.template, args.seed,
                           node_id_format=args.node_id_format, ranks_per_node=args.ranks_per_node,
                           progress=sys.stderr.isatty(), tp=args.tp)
    except (ValueError, FileNotFoundError) as error:
        print(f"gen_scaleset: {error}", file=sys.stderr)
        return 2
    print(orjson.dumps(summary.__dict__).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
