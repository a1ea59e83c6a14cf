"""How gloo runs collectives: its work events and their families."""

from __future__ import annotations


#: c10d CPU ops (as Kineto names them) whose gloo work runs on the calling thread, as
#: ``gloo:send``/``gloo:recv`` events, instead of as one ``gloo:<collective>`` event on a worker:
#: monitored_barrier sends to and receives from group rank 0 inside ProcessGroupGloo.
C10D_OPS_WITHOUT_GLOO_WORK = frozenset({"c10d::monitored_barrier_"})
#: gloo's work events ("gloo:all_reduce"), on the group's worker threads or the caller's (p2p).
GLOO_WORK_PREFIX = "gloo:"
#: gloo (torch 2.13) runs a collective as ``gloo:<op>`` events of another family here: both
#: reduce_scatters run as all_reduce works (families as :func:`family` names them).
GLOO_WORK_FAMILY = {"reducescatter": "allreduce"}
#: Collective names gloo runs as one work per group member (the list reduce_scatter), each
#: on a worker thread of the group; every other collective is one work.
GLOO_WORK_PER_MEMBER = frozenset({"reduce_scatter"})
#: Families whose gloo work runs on the calling thread, starting inside its c10d op (p2p);
#: the rest run on the group's own worker threads (``pt_gloo_runloop``), in queue order.
GLOO_CALLER_FAMILIES = frozenset({"send", "recv"})
#: Work families whose gloo event shows, in its "Input Dims" (``record_shapes``), exactly the
#: tensors its one-work call reduces (all_reduce, all_reduce_coalesced, a fused coalescing
#: block, reduce_scatter_tensor's input), or for the list reduce_scatter the one member's chunk
#: each of its works reduces (its output's count; torch's ProcessGroupGloo::reduce_scatter runs
#: an all_reduce per member on a buffer of the output's shape): a work showing another element
#: count is another call's.
GLOO_SHAPED_FAMILIES = frozenset({"allreduce"})
#: How long after a blocking call has returned its gloo work's event may still end: gloo completes
#: the work's future before it ends the work's profiler scope (ProcessGroupGloo::AsyncWork::
#: finishWorkGloo: returnFutureWithOutput, then finish()), so the caller can return in between,
#: and a loaded worker thread can be descheduled there (0.05 to 0.52 ms seen on torch 2.13, 2 busy
#: cores). The work still starts inside the call; a work ending later than this is another call's.
GLOO_WORK_END_LAG_NS = 5_000_000
