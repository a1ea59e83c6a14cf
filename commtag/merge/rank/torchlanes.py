"""Traces in which torch already laid graphed collectives out per process group.

torch 2.15+'s ``export_chrome_trace(..., cuda_graph_annotations=..., graph_lanes="all")``
bakes each CUDA-graph node's annotation into its replayed events' args and moves the
events onto the lane the annotation names: a tid on the GPU's pid named by the
annotation's ``"Process Group Description"``, the stream the event ran on kept as
``"original_stream"`` (and the trace's header says ``"cudaGraphInlineAnnotated": true``).

The merge draws every process group once, on commtag's lane of that group (the same on
every member rank, with the cross-rank flows). A group lane of torch's would stand beside
it as a second lane of the same group, holding the same kernels. The rule: **commtag's
lane wins**. Each event torch moved onto a lane named by a process group is written on the
stream it ran on again, its ``args.stream`` saying that stream and
:data:`~commtag.vocab.TORCH_LANE_ARG` the lane torch had given it; everything torch
baked into its args is kept. Nothing is dropped: the event is written once, on its stream,
and torch's group lane, left empty, is not drawn. Lanes torch named otherwise (its
``default_stream``, a user's ``mark_stream`` lanes) stay as torch wrote them.
"""

from __future__ import annotations

from typing import Iterable

from commtag.vocab import (
    TORCH_ANNOTATED_CATEGORIES, TORCH_INLINE_ANNOTATED_KEY, TORCH_LANE_ARG, TORCH_LANE_KEY, TORCH_LANE_NAME_KEY,
    TORCH_ORIGINAL_STREAM_KEY,
)


def has_torch_lanes(header: dict) -> bool:
    """Whether torch baked graph annotations into this trace (only then can it have moved events)."""
    return header.get(TORCH_INLINE_ANNOTATED_KEY) is True


def restore_group_lanes(events: Iterable) -> None:
    """Put every event torch moved onto a process group's lane back on its stream (in place).

    Only torch moves an event and says where from (``original_stream``); a Kineto eager
    kernel carries "Process Group Description" too, but never that key, so it stays put.
    """
    for e in events:
        if e.__class__ is not dict or e.get("cat") not in TORCH_ANNOTATED_CATEGORIES:
            continue
        args = e.get("args")
        if args.__class__ is not dict or TORCH_LANE_NAME_KEY not in args:
            continue
        stream = args.get(TORCH_ORIGINAL_STREAM_KEY)
        lane = e.get("tid")
        if stream.__class__ is not int or lane == stream:
            continue
        args[TORCH_LANE_ARG] = lane
        args[TORCH_LANE_KEY] = stream
        e["tid"] = stream
