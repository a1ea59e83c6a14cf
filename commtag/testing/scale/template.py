"""The template of a scale set: a window of a public single-rank trace, rebased, and where its collectives are."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import orjson

from commtag.testing import PUBLIC_TRACES
from commtag.vocab import (
    CORRELATION_KEY, DEVICE_WORK_NODE_TYPES, KERNEL_CATEGORY, KINETO_ID_ARGS, LAUNCH_CATEGORIES, is_graph_launch, nccl_kind,
)

#: Largest arrival skew between members of a collective, µs.
MAX_JITTER_US = 40.0
#: Clock error between nodes, µs.
MAX_CLOCK_OFFSET_US = 500.0
#: The window starts this late after baseTimeNanoseconds, so no clock offset makes a ts negative
#: (Kineto floors its base below the first event: ts is never negative).
LEAD_IN_US = 2 * MAX_CLOCK_OFFSET_US
TEMPLATE_DIR = PUBLIC_TRACES / "single-rank-scale"
TEMPLATES = {
    "v100": "hta_v100_df_index_resolver.json.gz",
    "a100": "hta_a100_rank0_of16.json.gz",
    "mi300": "tracelens_mi300_xdit_sd35.json.gz",
}


@dataclass
class Template:
    """A window of template events, rebased to ts 0, and where its collectives are."""

    name: str
    top: dict
    meta: list[dict]
    events: list[dict]
    span_us: float
    cpu_pid: int
    gpu_pid: int
    #: Indices into ``events`` of NCCL kernels, with their role and max jitter.
    nccl: list[tuple[int, str, float]]
    #: correlation -> index of the cuda_runtime launch event.
    launches: dict[int, int]
    #: Index of a template graph-replayed GPU event -> (graph id, node index).
    template_graph_nodes: dict[int, tuple[int, int]]
    id_ceiling: int


def is_gpu(event: dict) -> bool:
    return event.get("cat") in DEVICE_WORK_NODE_TYPES


def _ts(event: dict) -> float:
    return float(event.get("ts", 0.0))


def load_template(path: Path, per_rank_events: int) -> Template:
    """Take the first ``per_rank_events`` events by time, tiling the template if it is shorter."""
    top = orjson.loads(gzip.decompress(path.read_bytes()))
    raw = top.pop("traceEvents")
    meta = [e for e in raw if e.get("ph") == "M"]
    body = sorted((e for e in raw if e.get("ph") != "M"), key=_ts)
    del raw
    if not body:
        raise ValueError(f"{path}: template has no events")
    id_ceiling = 1 + max(
        (int(v) for e in body for k, v in e.get("args", {}).items() if k in KINETO_ID_ARGS and isinstance(v, int)),
        default=0,
    )
    id_ceiling = max(id_ceiling, 1 + max((int(e["id"]) for e in body if isinstance(e.get("id"), int)), default=0))
    stride = 10 ** len(str(id_ceiling))
    if per_rank_events < len(body):
        body = _densest_window(body, per_rank_events)
    t0 = _ts(body[0])
    span = max(_ts(e) + float(e.get("dur", 0.0)) for e in body) - t0
    events: list[dict] = []
    tile = 0
    while len(events) < per_rank_events:
        shift = tile * (span + 1000.0)
        for event in body:
            if len(events) == per_rank_events:
                break
            events.append(_rebase(event, shift - t0 + LEAD_IN_US, tile * stride))
        tile += 1
    gpu_counts: dict[int, int] = {}
    cpu_counts: dict[int, int] = {}
    for e in events:
        if "pid" in e:
            target = gpu_counts if is_gpu(e) else cpu_counts
            target[e["pid"]] = target.get(e["pid"], 0) + 1
    gpu_pid = max(gpu_counts, key=gpu_counts.__getitem__) if gpu_counts else 0
    cpu_pid = max(cpu_counts, key=cpu_counts.__getitem__)
    window_end = max(_ts(e) + float(e.get("dur", 0.0)) for e in events)
    launches = {
        e["args"][CORRELATION_KEY]: i
        for i, e in enumerate(events)
        if e.get("cat") in LAUNCH_CATEGORIES and CORRELATION_KEY in e.get("args", {})
    }
    return Template(
        name=path.name,
        top=top,
        meta=meta,
        events=events,
        span_us=window_end,
        cpu_pid=cpu_pid,
        gpu_pid=gpu_pid,
        nccl=_find_nccl(events),
        launches=launches,
        template_graph_nodes=_template_graph_nodes(events, launches),
        id_ceiling=stride * tile,
    )


def _is_nccl(event: dict) -> bool:
    return event.get("cat") == KERNEL_CATEGORY and nccl_kind(event.get("name", "")) is not None


def _densest_window(body: list[dict], size: int) -> list[dict]:
    """The ``size`` consecutive events (by time) holding the most NCCL kernels: a busy training step."""
    flags = [_is_nccl(e) for e in body]
    best_start, best = 0, sum(flags[:size])
    count = best
    for start in range(1, len(body) - size + 1):
        count += flags[start + size - 1] - flags[start - 1]
        if count > best:
            best_start, best = start, count
    return body[best_start : best_start + size]


def _rebase(event: dict, shift: float, id_offset: int) -> dict:
    out = dict(event)
    if "ts" in out:
        out["ts"] = round(_ts(out) + shift, 3)
    if id_offset:
        if isinstance(out.get("id"), int):
            out["id"] += id_offset
        args = out.get("args")
        if args and any(k in args for k in KINETO_ID_ARGS):
            args = dict(args)
            for key in KINETO_ID_ARGS:
                if isinstance(args.get(key), int) and args[key] >= 0:
                    args[key] += id_offset
            out["args"] = args
    return out


def _find_nccl(events: list[dict]) -> list[tuple[int, str, float]]:
    """NCCL kernels, their role (one role per NCCL stream) and how early each may start."""
    last_end: dict[int, float] = {}
    found: list[tuple[int, int, float]] = []
    for i, e in enumerate(events):
        if not is_gpu(e):
            continue
        stream = e.get("args", {}).get("stream", e.get("tid"))
        if _is_nccl(e):
            gap = _ts(e) - last_end.get(stream, _ts(e) - MAX_JITTER_US)
            found.append((i, stream, max(0.0, min(MAX_JITTER_US, 0.9 * gap))))
        last_end[stream] = max(last_end.get(stream, 0.0), _ts(e) + float(e.get("dur", 0.0)))
    roles = ("default", "tp", "dp")
    streams = sorted({s for _, s, _ in found})
    role_of = {s: roles[k % len(roles)] for k, s in enumerate(streams)}
    return [(i, role_of[s], jitter) for i, s, jitter in found]


def _template_graph_nodes(events: list[dict], launches: dict[int, int]) -> dict[int, tuple[int, int]]:
    """GPU events launched by the template's own cudaGraphLaunch: one graph per kernel-name sequence."""
    graph_corrs = {c for c, i in launches.items() if is_graph_launch(events[i]["name"])}
    by_corr: dict[int, list[int]] = {}
    for i, e in enumerate(events):
        if is_gpu(e) and e.get("args", {}).get(CORRELATION_KEY) in graph_corrs:
            by_corr.setdefault(e["args"][CORRELATION_KEY], []).append(i)
    graph_ids: dict[tuple[str, ...], int] = {}
    nodes: dict[int, tuple[int, int]] = {}
    for indices in by_corr.values():
        signature = tuple(events[i]["name"] for i in indices)
        graph = graph_ids.setdefault(signature, 100 + len(graph_ids))
        for node, i in enumerate(indices):
            nodes[i] = (graph, node)
    return nodes
