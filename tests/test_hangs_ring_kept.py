"""The ring's dump of a real gloo job: a call only the ring keeps (no profiler, no capture) is
dumped with the same op, Seq, sizes, dtypes and state as the same call kept while a profiler
records, and as the calls were made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from commtag.merge.hangs.dumps import load_plain_pickle
from commtag.vocab import flight_recorder as fr

WORLD_SIZE = 2
#: The calls of tests/ring_world.py on rank 0 as the dump names them, with their sizes and dtypes.
RANK0_CALLS = [
    ("gloo:all_reduce", [[6]], ["Float"], [[6]], ["Float"]),
    ("gloo:all_reduce", [[6]], ["Float"], [[6]], ["Float"]),  # complex64: its real view, 2 x 3 floats
    ("gloo:all_reduce", [[5]], ["Double"], [[5]], ["Double"]),
    ("gloo:broadcast", [[7]], ["Int"], [[7]], ["Int"]),
    ("gloo:reduce", [[6]], ["Float"], [[6]], ["Float"]),
    ("gloo:all_gather", [[2]], ["Float"], [[4]], ["Float"]),
    ("gloo:all_gather", [[2]], ["Float"], [[4]], ["Float"]),
    ("gloo:all_to_all", [[6]], ["Float"], [[6]], ["Float"]),
    ("gloo:barrier", [[0]], ["Byte"], [[0]], ["Byte"]),
    ("gloo:send 0->1", [[4]], ["Float"], [[4]], ["Float"]),
]
#: What of an entry says which call it was and how it ended (times, ids and threads differ).
SAME = (fr.E_PROFILING_NAME, fr.E_INPUT_SIZES, fr.E_INPUT_DTYPES, fr.E_OUTPUT_SIZES, fr.E_OUTPUT_DTYPES,
        fr.E_STATE, fr.E_RETIRED, fr.E_IS_P2P, fr.E_PROCESS_GROUP, fr.CT_ERROR, fr.CT_PEER,
        fr.CT_IN_SPLITS, fr.CT_OUT_SPLITS)


def _run(tmp_path: Path) -> Path:
    store, dumps = tmp_path / "store", tmp_path / "dumps"
    store.mkdir()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    script = Path(__file__).with_name("ring_world.py")
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(WORLD_SIZE), str(store), str(dumps)],
                              env=env) for rank in range(WORLD_SIZE)]
    assert [proc.wait(timeout=600) for proc in procs] == [0] * WORLD_SIZE
    return dumps


@pytest.mark.slow
def test_a_call_only_the_ring_keeps_is_dumped_as_a_profiled_one(tmp_path: Path) -> None:
    dumps = _run(tmp_path)
    for rank in range(WORLD_SIZE):
        entries = load_plain_pickle((dumps / f"commtag_fr_{rank}").read_bytes())[fr.FR_ENTRIES]
        half = len(entries) // 2
        assert len(entries) == 2 * half == 2 * len(RANK0_CALLS)
        ring_only, profiled = entries[:half], entries[half:]
        for alone, recorded in zip(ring_only, profiled):
            assert {k: alone.get(k) for k in SAME} == {k: recorded.get(k) for k in SAME}
            assert alone[fr.E_STATE] == fr.STATE_COMPLETED and alone[fr.E_COMPLETED_NS] >= alone[fr.E_STARTED_NS]
            # The second round's Seq is the first's plus the calls of that kind in a round.
            if alone[fr.E_IS_P2P]:
                assert (alone[fr.E_SEQ], alone[fr.E_P2P_SEQ], recorded[fr.E_P2P_SEQ]) == (0, 1, 2)
            else:
                assert recorded[fr.E_SEQ] == alone[fr.E_SEQ] + half - 1
        assert [e[fr.E_SEQ] for e in ring_only if not e[fr.E_IS_P2P]] == list(range(1, half))
        if rank == 0:
            assert [tuple(e[k] for k in SAME[:5]) for e in ring_only] == RANK0_CALLS
