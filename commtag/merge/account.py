"""What became of one rank's trace events: the account the merge prints per rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence


@dataclass(slots=True)
class EventAccount:
    """What became of one rank's trace events: every event read is either written (a
    slice or an instant) or left out, counted under its reason."""

    rank: int
    read: int = 0
    written: int = 0
    #: reason -> how many events it left out.
    left_out: dict[str, int] = field(default_factory=dict)
    #: With ``list_left_out``: one line per event left out (file, index, phase, name, reason).
    listed: list[str] = field(default_factory=list)
    #: Launch flows (runtime call -> device work) the merged trace holds, counted as written.
    flows: int = 0

    def describe(self, who: Optional[str] = None) -> str:
        """One line: read, written, and what was left out and why."""
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(self.left_out.items(), key=lambda kv: -kv[1]))
        return (f"{who or f'rank {self.rank}'}: {self.read} events read, {self.written} written, "
                f"{self.flows} launch flows drawn" + (f"; left out: {why}" if why else "; nothing left out"))

    @staticmethod
    def total(accounts: Sequence["EventAccount"]) -> "EventAccount":
        """The accounts of several ranks added up (rank -1: it is nobody's own)."""
        whole = EventAccount(-1)
        for account in accounts:
            whole.read += account.read
            whole.written += account.written
            whole.flows += account.flows
            for reason, n in account.left_out.items():
                whole.left_out[reason] = whole.left_out.get(reason, 0) + n
        return whole
