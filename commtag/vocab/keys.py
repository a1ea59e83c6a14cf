"""commtag's own keys, spelled "commtag ..." so they never collide with Kineto's."""

from __future__ import annotations


# Every key commtag adds is spelled "commtag ..." so that it never collides with Kineto's.
# On an annotation (sidecar and merged trace; the aliases of CollectiveAnnotation's own fields):
ANN_LANE_ID = "commtag lane id"
ANN_LANE = "commtag lane"
ANN_PG_UID = "commtag pg uid"
ANN_P2P = "commtag p2p"
ANN_P2P_PAIR_SEQ = "commtag p2p pair seq"
ANN_ASYNC = "commtag async"
ANN_THREAD = "commtag thread"
ANN_CAPTURE_ID = "commtag capture id"
ANN_REPLAY = "commtag replay"
ANN_ERROR = "commtag error"
#: On an nccl2 batch_op_issue (one record for a whole batch_isend_irecv): the global peer of
#: each send and of each receive, in the order of its "In split size" / "Out split size"
#: (nccl2 writes no peer, docs/nccl2.md §2-3); what pairs the batch with its peers' batches.
ANN_SEND_PEERS = "commtag send peers"
ANN_RECV_PEERS = "commtag recv peers"
#: On an all-to-all whose split sizes were not seen (:data:`SPLITS_NOT_RECORDED`): its "In /
#: Out split size" say nothing of who sent whom (c10d's hooks are not given them, §7a).
ANN_SPLITS = "commtag splits"
SPLITS_NOT_RECORDED = "not recorded"
# Added by the merge to a slice: whose it is, where it came from, how it was joined.
ANN_RANK = "commtag rank"
ANN_SOURCE = "commtag source"
#: How a replayed kernel was matched: "tools-id", "node-id" or "order".
ANN_MATCH = "commtag match"
#: What a Seq the trace did not carry was derived from ("kernel order", ...).
ANN_SEQ_FROM = "commtag seq from"
#: False where an instance must not be matched across ranks.
ANN_CROSS_RANK = "commtag cross-rank"
#: On an nccl2 record's slices: its format (vocab.NCCL2_FORMAT), read back to its legacy view.
ANN_RECORD_FORMAT = "commtag record format"
#: On an nccl2 send/recv: the peer's global rank, which nccl2 does not write (no Dst / Src Rank,
#: docs/nccl2.md §2), from its "Rank" and the group's members.
ANN_PEER = "commtag peer"
#: The k-th (from 0) of a rank's nccl2 records sharing one group and Seq (a coalesced call's
#: per-tensor records, docs/nccl2.md §4): each is an instance of its own.
ANN_SEQ_PART = "commtag seq part"
#: What the merge guessed, and why (metadata-less NCCL kernels).
ANN_INFERRED = "commtag inferred"
#: "not identified" where a gloo call's work event could not be told apart.
ANN_GLOO_WORK = "commtag gloo work"
#: On a call that had not finished when its window's trace was handed over: what its end is.
ANN_UNFINISHED = "commtag unfinished"
UNFINISHED_END = "still running when its trace was written; its end is not in this trace"
# Written by the analysis on a matched instance's slices and markers.
ANN_RANKS_MATCHED = "commtag ranks matched"
ANN_SKEW_US = "commtag skew us"
ANN_LAST_RANK = "commtag last rank"
ANN_MISSING_RANKS = "commtag missing ranks"
ANN_MEMBERS_NOT_FOUND = "commtag members not found"
ANN_BYTES = "commtag bytes"
ANN_ALGBW = "commtag algbw GB/s"
ANN_BUSBW = "commtag busbw GB/s"
ANN_DESYNC = "commtag desync"
ANN_WAIT_US = "commtag wait us"
ANN_STRAGGLER = "commtag straggler"
#: How many hosts a matched instance's ranks span (commtag.merge.analysis.explain).
ANN_NODES = "commtag nodes"
#: What a matched instance's time went to: one of commtag.merge.analysis.explain.CAUSES.
ANN_CAUSE = "commtag cause"
#: On a busbw above what any link carries: the figure left out, and why.
ANN_BUSBW_IMPLAUSIBLE = "commtag busbw implausible"
#: On an instance's own args: the NCCL Inspector record joined to it (that rank's view of it):
#: NCCL's busbw and algbw (GB/s), its execution time (us), its timing source, its coll_sn.
ANN_NCCL_BUSBW = "commtag nccl busbw GB/s"
ANN_NCCL_ALGBW = "commtag nccl algbw GB/s"
ANN_NCCL_EXEC_US = "commtag nccl exec us"
ANN_NCCL_SOURCE = "commtag nccl timing source"
ANN_NCCL_SN = "commtag nccl sn"
#: On an instance's own args (the merge's rank pass): how long after its CPU call its device work
#: (NCCL kernel, gloo work) started on that rank, us; what tells launch skew from arrival skew.
ANN_LAUNCH_US = "commtag launch us"
#: A marker's kind ("straggler", "desync", a trace window).
ANN_MARKER = "commtag marker"
ANN_WINDOW_RANK = "commtag window of rank"
ANN_WINDOW_NS = "commtag window ns"
#: On a window marker: the ProfilerStep spans of the window (commtag.merge.steps.encode).
ANN_WINDOW_STEPS = "commtag window steps"
#: On a window marker of a merge that kept part of the job: its --steps or --window, as the user wrote it.
ANN_WINDOW_SELECTION = "commtag window selection"
ANN_WORLD_SIZE = "commtag world size"
#: On the alignment marker: how the clocks were aligned, as JSON (method, reference, each clock's offset and residual).
ANN_ALIGNMENT = "commtag alignment"
# With torch's own CUDA-graph annotations (torch 2.14+).
#: Key commtag adds to the annotation it hands torch's ``mark_kernels`` for a captured
#: collective (where the user turned torch's graph annotations on): ``"<capture id>.<n>"``, the
#: n-th collective commtag saw in that capture. torch's exporter bakes it into the replayed
#: events' args; the sidecar's captured collective carries the same value (``torch_mark``).
TORCH_MARK_KEY = "commtag graph mark"
#: Arg of a graphed event the merge put back on the stream it ran on: the lane torch had moved
#: it to (a process group's lane, which commtag's own lane of that group replaces).
TORCH_LANE_ARG = "commtag torch lane"

# The kernel breakdown (commtag.kernels.Breakdown.annotations).
ANN_KERNELS = "commtag kernels"
ANN_KERNELS_PREFIX = "commtag kernels "
ANN_DOMINANT = "commtag dominant"
ANN_KERNELS_SCOPE = "commtag kernels scope"
ANN_KERNELS_ID = "commtag kernels id"

# Flight Recorder dumps beside a profile (commtag.merge.hangs.beside): on a lane slice whose call a
# dump holds (same rank, group and Seq), the dump's word on it.
#: The entry's ``state`` as the dump wrote it ("scheduled", "started", "completed").
ANN_FR_STATE = "commtag fr state"
#: What the state means (commtag.merge.hangs.diagnose.Position.outcome): completed, ended, failed, in flight.
ANN_FR_OUTCOME = "commtag fr outcome"
#: Only on a call the dump holds in flight: vocab.flight_recorder.FR_IN_FLIGHT.
ANN_FR_END = "commtag fr end"
#: What the call raised, where the dump says it (commtag's own dumps).
ANN_FR_ERROR = "commtag fr error"
#: The dump file the state was read from.
ANN_FR_DUMP = "commtag fr dump"
