"""Any number of merge workers writes the bytes one process writes.

A generated job of 132 ranks, so that ranks share packet sequences in blocks of three
(commtag.merge.ids.sequence_block) and 3 workers' even shares (44 ranks) would end inside a
block: ``-j 2``, ``-j 3``, ``-j 5`` and torchrun's 2 workers each write ``-j 1``'s file, byte for byte,
and that file is a valid trace whose sequences each start cleared.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from commtag.merge.engine.hosts import chunks
from commtag.merge.ids import sequence_block
from commtag.merge.inputs.load import discover
from commtag.merge.pftrace.validate import validate_file
from commtag.merge.pftrace.wire import iter_frames
from torchrun_merge import torchrun_merge

pytestmark = pytest.mark.slow

RANKS = 132


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("job") / "job"
    subprocess.run([sys.executable, "-m", "commtag.testing.scaleset", "--ranks", str(RANKS), "--events", "40000",
                    "--tp", "4", "-o", str(out)], check=True, capture_output=True, timeout=300)
    return out


def _merge(job: Path, out: Path, *args: str) -> bytes:
    done = subprocess.run([sys.executable, "-m", "commtag.merge", str(job), "-o", str(out), *args, "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out.read_bytes()


def test_workers_take_whole_blocks_of_ranks(job: Path) -> None:
    ranks = discover([job], None)
    block = sequence_block(len(ranks))
    assert block == 3
    for workers in (2, 3, 5):
        shares = chunks(ranks, workers, block)
        assert [r.rank for share in shares for r in share] == list(range(RANKS))
        assert all(share and share[0].rank % block == 0 for share in shares), [len(s) for s in shares]
        # Balanced: a block goes to the worker its middle falls in, so each end of a share is off by
        # at most half a block, and worker 0 (which also leads) holds at most half a block over its part.
        total = sum(r.size for r in ranks)
        largest = max(sum(r.size for r in ranks[i:i + block]) for i in range(0, len(ranks), block))
        loads = [sum(r.size for r in share) for share in shares]
        assert loads[0] <= total / workers + largest / 2, (loads, total / workers)
        assert all(abs(load - total / workers) <= largest for load in loads), (loads, total / workers)


def test_any_number_of_workers_writes_one_process_bytes(job: Path, tmp_path: Path) -> None:
    one = _merge(job, tmp_path / "j1.pftrace", "-j", "1")
    assert validate_file(tmp_path / "j1.pftrace") == []
    for jobs in ("2", "3", "5"):  # 5: each worker gets pieces from four, in rounds it parses a quarter of
        assert _merge(job, tmp_path / f"j{jobs}.pftrace", "-j", jobs) == one, f"-j {jobs}"
    torchrun = tmp_path / "torchrun.pftrace"
    done = torchrun_merge([str(job), "-o", str(torchrun), "--no-progress"], workers=2)
    assert done.returncode == 0, done.stderr
    assert torchrun.read_bytes() == one
    # Each sequence is one run of packets (the header's, then 44 blocks' rank blocks, then their
    # lanes), cleared before any packet of it needs what it interns.
    runs: list[int] = []
    cleared: set[int] = set()
    with open(tmp_path / "j1.pftrace", "rb") as stream:
        for frame in iter_frames(stream):
            packet = pb.TracePacket()
            packet.ParseFromString(frame)
            seq, flags = packet.trusted_packet_sequence_id, packet.sequence_flags
            if not runs or runs[-1] != seq:
                assert seq not in runs, f"sequence {seq} comes back after another"
                runs.append(seq)
            if flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
                assert seq not in cleared, f"sequence {seq} is cleared twice"
                cleared.add(seq)
            if flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE or packet.HasField("interned_data"):
                assert seq in cleared, f"sequence {seq} interns or needs state before it is cleared"
    blocks = -(-RANKS // 3)
    assert runs == [1, *range(2, 2 + 2 * blocks, 2), *range(3, 3 + 2 * blocks, 2)]
