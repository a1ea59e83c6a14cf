"""What the packets of a sequence leave to it: its default track and its clock, read back.

The writer (:mod:`commtag.merge.pftrace.sequence`) leaves each row's main
track and the absolute time out of the event packets; the readers
(:mod:`commtag.merge.pftrace.readback`, :mod:`commtag.merge.pftrace.validate`)
put them back here, the way trace_processor does.
"""

from __future__ import annotations

from typing import Optional

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

_CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_BOOTTIME = pb.BUILTIN_CLOCK_BOOTTIME
#: Clock ids a sequence defines for itself (ClockSnapshot.Clock's): from, up to (not including).
_SEQUENCE_CLOCKS = (64, 128)


class SequenceDefaults:
    """What each sequence's packets leave out, followed packet by packet as trace_processor does.

    A packet's ``trace_packet_defaults`` replace its sequence's defaults and a
    cleared sequence has none. A TrackEvent without a ``track_uuid`` is on the
    default's ``track_uuid`` (trace_processor's default track, uuid 0, where
    there is none). A timestamp on a clock of the sequence's own (ids 64-127,
    the packet's ``timestamp_clock_id`` or the default's) is converted through
    the sequence's clock snapshot; on an incremental one it is the signed step
    from the previous such timestamp. Call :meth:`see` on every packet, in file
    order (a step moves its clock), before asking about it.
    """

    def __init__(self) -> None:
        self._track: dict[int, int] = {}
        self._clock_id: dict[int, int] = {}
        #: (sequence, clock id) -> [incremental, the clock's last value, BOOTTIME minus the clock].
        self._clocks: dict[tuple[int, int], list] = {}
        #: Each sequence's default clock, where it is one of the sequence's own (what most packets use).
        self._default_clock: dict[int, list] = {}

    def see(self, packet: pb.TracePacket) -> int:
        """Follow ``packet``'s changes to its sequence's defaults and clocks; its timestamp on the
        trace's clock (for a packet without one, the sequence's clock as it stands; 0 for a clock
        snapshot, which has no time of its own)."""
        seq = packet.trusted_packet_sequence_id
        if packet.sequence_flags & _CLEARED or packet.incremental_state_cleared:
            self._track.pop(seq, None)
            self._set_clock(seq, None)
        if packet.HasField("trace_packet_defaults"):
            defaults = packet.trace_packet_defaults
            self._track.pop(seq, None)
            if defaults.track_event_defaults.HasField("track_uuid"):
                self._track[seq] = defaults.track_event_defaults.track_uuid
            self._set_clock(seq, defaults.timestamp_clock_id if defaults.HasField("timestamp_clock_id") else None)
        if packet.HasField("clock_snapshot"):
            clocks = {c.clock_id: c for c in packet.clock_snapshot.clocks}
            boottime = clocks.get(_BOOTTIME)
            for clock_id, clock in clocks.items():
                if _SEQUENCE_CLOCKS[0] <= clock_id < _SEQUENCE_CLOCKS[1] and boottime is not None:
                    self._clocks[(seq, clock_id)] = [clock.is_incremental, clock.timestamp,
                                                     boottime.timestamp - clock.timestamp]
            self._set_clock(seq, self._clock_id.get(seq))
            return 0
        # A packet without a timestamp reads as a step of 0: the clock stays where it is.
        clock = self._clocks.get((seq, packet.timestamp_clock_id)) if packet.timestamp_clock_id \
            else self._default_clock.get(seq)
        if clock is None:
            return packet.timestamp
        if clock[0]:
            step = packet.timestamp
            clock[1] += step - (1 << 64) if step >= 1 << 63 else step
        else:
            clock[1] = packet.timestamp
        return clock[1] + clock[2]

    def track(self, packet: pb.TracePacket) -> Optional[int]:
        """The track of ``packet``'s event: its own, else its sequence's default, else None."""
        event = packet.track_event
        if event.HasField("track_uuid"):
            return event.track_uuid
        return self._track.get(packet.trusted_packet_sequence_id)

    def _set_clock(self, seq: int, clock_id: Optional[int]) -> None:
        """Make ``clock_id`` (None: none) ``seq``'s default clock."""
        if clock_id is None:
            self._clock_id.pop(seq, None)
            self._default_clock.pop(seq, None)
            return
        self._clock_id[seq] = clock_id
        clock = self._clocks.get((seq, clock_id))
        if clock is None:
            self._default_clock.pop(seq, None)
        else:
            self._default_clock[seq] = clock
