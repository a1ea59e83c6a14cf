"""Read the collective lane slices back out of a merged .pftrace.

So that ``commtag summary merged.pftrace`` needs only the file users share: the
lane slices carry the eager keys and the ``"commtag ..."`` keys (among them
``"commtag rank"``, written by :func:`commtag.merge.analyze.annotate`), which
is all the analysis needs to rebuild its :class:`CollectiveInstance` records.
The file is read frame by frame, so memory stays bounded by one packet plus
the lane slices, not the whole trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Iterator, Optional

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from commtag.kernels import ANN_ID, ANN_RANK, ANN_SCOPE, Breakdown
from commtag.merge.records import CollectiveInstance
from commtag.schema import parse_rank_list

_BEGIN = pb.TrackEvent.TYPE_SLICE_BEGIN
_END = pb.TrackEvent.TYPE_SLICE_END
_INSTANT = pb.TrackEvent.TYPE_INSTANT
_CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED


class ReadbackError(ValueError):
    """The file is not a Perfetto trace commtag can read lane slices from."""


def read_instances(path: Path) -> list[CollectiveInstance]:
    """Every collective lane slice of a merged trace, as analysis records."""
    return read_merged(path)[0]


#: Kernel breakdowns by scope ("stream", "graph launch", "lane") -> (rank, id) -> breakdown.
KernelTables = dict[str, dict[tuple[int, object], Breakdown]]


def read_merged(path: Path) -> tuple[list[CollectiveInstance], KernelTables]:
    """The collective lane slices and the kernel-category breakdowns of a merged trace.

    The breakdowns are the annotations the merge wrote on graph launch slices
    and on the instants that open each GPU stream and lane row
    (:meth:`commtag.kernels.Breakdown.annotations`); one pass reads both.
    """
    kernels: KernelTables = {}
    names: dict[int, dict[int, str]] = {}
    keys: dict[int, dict[int, str]] = {}
    strings: dict[int, dict[int, str]] = {}
    open_slices: dict[int, list[Optional[tuple[int, dict[str, object]]]]] = {}
    out: list[CollectiveInstance] = []
    with open(path, "rb") as stream:
        for packet in _packets(stream, path):
            seq = packet.trusted_packet_sequence_id
            if packet.sequence_flags & _CLEARED or seq not in names:
                names[seq], keys[seq], strings[seq] = {}, {}, {}
            if packet.HasField("interned_data"):
                interned = packet.interned_data
                names[seq].update((e.iid, e.name) for e in interned.event_names)
                keys[seq].update((e.iid, e.name) for e in interned.debug_annotation_names)
                strings[seq].update((e.iid, e.str.decode("utf-8", "replace")) for e in interned.debug_annotation_string_values)
            if not packet.HasField("track_event"):
                continue
            event = packet.track_event
            stack = open_slices.setdefault(event.track_uuid, [])
            if event.type == _BEGIN:
                args = _annotations(event.debug_annotations, keys[seq], strings[seq])
                stack.append((packet.timestamp, args) if "commtag pg uid" in args else None)
                if ANN_SCOPE in args:
                    _kernel_breakdown(kernels, args)
            elif event.type == _END and stack:
                begun = stack.pop()
                if begun is not None:
                    instance = _instance(begun[0], packet.timestamp, begun[1])
                    if instance is not None:
                        out.append(instance)
            elif event.type == _INSTANT and event.debug_annotations:
                args = _annotations(event.debug_annotations, keys[seq], strings[seq])
                if ANN_SCOPE in args:
                    _kernel_breakdown(kernels, args)
    return out, kernels


def _kernel_breakdown(tables: KernelTables, args: dict[str, object]) -> None:
    """File one annotated breakdown under its scope, rank and id (malformed ones are skipped)."""
    rank, ident = args.get(ANN_RANK), args.get(ANN_ID)
    if isinstance(rank, int) and ident is not None:
        tables.setdefault(str(args[ANN_SCOPE]), {})[(rank, ident)] = Breakdown.from_annotations(args)


def _packets(stream: BinaryIO, path: Path) -> Iterator[pb.TracePacket]:
    """TracePackets of a serialized Trace: ``0x0A varint(len) packet`` frames."""
    while True:
        tag = stream.read(1)
        if not tag:
            return
        if tag != b"\x0a":
            raise ReadbackError(f"{path}: not a Perfetto protobuf trace (unexpected field tag {tag!r})")
        size = _varint(stream, path)
        data = stream.read(size)
        if len(data) != size:
            raise ReadbackError(f"{path}: truncated trace (a packet is cut short)")
        packet = pb.TracePacket()
        try:
            packet.ParseFromString(data)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise ReadbackError(f"{path}: corrupt packet ({exc})") from exc
        yield packet


def _varint(stream: BinaryIO, path: Path) -> int:
    value = shift = 0
    while True:
        byte = stream.read(1)
        if not byte:
            raise ReadbackError(f"{path}: truncated trace (a frame length is cut short)")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ReadbackError(f"{path}: not a Perfetto protobuf trace (bad frame length)")


def _annotations(items, keys: dict[int, str], strings: dict[int, str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        name = item.name or keys.get(item.name_iid, "")
        if name:
            out[name] = _value(item, strings)
    return out


def _value(item, strings: dict[int, str]) -> object:
    kind = item.WhichOneof("value")
    if kind == "string_value_iid":
        return strings.get(item.string_value_iid, "")
    if kind is None:
        return None
    return getattr(item, kind)


def _instance(start_ns: int, end_ns: int, args: dict[str, object]) -> Optional[CollectiveInstance]:
    """A record from one lane slice's annotations; None when keys the analysis needs are absent."""
    try:
        ranks = parse_rank_list(str(args.get("Process Group Ranks", "[]"))) or []
        replay = args.get("commtag replay")
        replay = None if replay in (None, "null") else replay
        return CollectiveInstance(
            rank=int(args["commtag rank"]),  # type: ignore[arg-type]
            pg_uid=str(args["commtag pg uid"]),
            is_p2p=bool(args.get("commtag p2p", False)),
            seq=int(args["Seq"]),  # type: ignore[arg-type]
            replay=int(replay) if replay is not None else None,  # type: ignore[arg-type]
            collective=str(args["Collective name"]),
            in_nelems=int(args.get("In msg nelems", 0)),  # type: ignore[arg-type]
            out_nelems=int(args.get("Out msg nelems", 0)),  # type: ignore[arg-type]
            dtype=str(args.get("dtype", "")),
            group_size=int(args.get("Group size", len(ranks) or 1)),  # type: ignore[arg-type]
            group_ranks=tuple(ranks),
            start_ns=start_ns,
            end_ns=end_ns,
            source=str(args.get("commtag source", "trace")),
            lane_name=str(args.get("commtag lane", "")),
            args=args,
            lane_id=int(args.get("commtag lane id", 0)),  # type: ignore[arg-type]
        )
    except (KeyError, TypeError, ValueError):
        return None
