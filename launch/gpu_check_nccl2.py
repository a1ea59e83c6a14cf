"""GPU check, nccl2 step: what ProcessGroupNCCL2 really records, against what commtag assumes.

Run on a machine with one CUDA GPU and torch >= 2.14 (``launch/gpu_check.py`` runs it as its
last step; alone: ``python launch/gpu_check_nccl2.py [--out DIR]``). Elsewhere it prints
``NOT AVAILABLE nccl2: <why>`` and exits 0: the points below stay unverified.

In a fresh process (the backend behind ``"nccl"`` is chosen at its first use;
``TORCH_DIST_USE_NCCL2=1`` makes torch 2.14 choose nccl2, 2.15 does by default) it
profiles one job of every collective a one-rank world can run, with commtag
installed, and settles the points docs/nccl2.md §8 leaves open:

1. every ``record_param_comms`` record, key by key, against the records
   :mod:`commtag.testing.nccl2` generates for the same job (Seq compared as an
   offset: communicator set-up may take numbers first); keys the trace has that
   the generator does not write, and the key order on kernels, are written down;
2. the kernels each record's External id links to (names, counts);
3. the user_annotation names around the calls;
4. the ``init`` and ``wait`` records and their Seq;
6. the class and ``name()`` of ``pg._get_backend(cuda)``, and what commtag's
   sidecar says of the group (``backend_impls``, ``record_format``);
7. whether ``_register_on_completion_hook`` accepts a hook on nccl2.

And commtag's own annotations (the sidecar) against the trace's records, eager key
by eager key: the parity this step exists for. Findings go to ``<out>/findings.json``.
Exit status: 0 passed or not available, 1 a check failed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from commtag.testing.bench import free_port
from commtag.testing.nccl2 import JobCall, JobGroup, records
from commtag.vocab import (
    COLLECTIVE_NAME_KEY, COMMS_OP, EXTERNAL_ID_KEY, KERNEL_CATEGORY, KERNEL_EAGER_KEYS, NCCL2_FORMAT,
    NON_COLLECTIVE_NAMES, SEQ_KEY, USE_NCCL2_ENV,
)

REPO = Path(__file__).resolve().parents[1]
N = 1024
WORLD = JobGroup("0", "default_pg", (0,))
#: The job, as the generator describes it (the child process runs the same calls, in order).
JOB = (
    JobCall("allreduce", WORLD, (N,)), JobCall("broadcast", WORLD, (N,)), JobCall("reduce", WORLD, (N,)),
    JobCall("all_gather", WORLD, (N,)), JobCall("_allgather_base", WORLD, (N,)),
    JobCall("reduce_scatter", WORLD, (N,)), JobCall("_reduce_scatter_base", WORLD, (N,)),
    JobCall("all_to_allv", WORLD, (N,)), JobCall("all_to_allv", WORLD, (N,), splits=((N,), (N,))),
    JobCall("all_to_all", WORLD, (N,)), JobCall("gather", WORLD, (N,)), JobCall("scatter", WORLD, (N,)),
    JobCall("barrier", WORLD, (0,)), JobCall("allreduce_coalesced", WORLD, (N, N // 2)),
)


def unavailable() -> Optional[str]:
    """Why this step cannot run here, or None."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    major_minor = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if major_minor < (2, 14):
        return f"torch {torch.__version__} has no nccl2 (2.14+)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible here"
    if not torch.distributed.is_nccl_available():
        return "this torch has no NCCL backend"
    return None


def run_job(out: Path) -> None:
    """The child: one profiled job on a one-rank nccl world (nccl2 chosen by the environment)."""
    import torch
    import torch.distributed as dist

    import commtag

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    torch.cuda.set_device(0)
    commtag.install()
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    facts: dict[str, Any] = {"backend_class": type(backend).__name__, "backend_name": str(backend.name())}
    try:
        dist.group.WORLD._register_on_completion_hook(lambda work_info: None)
        facts["on_completion_hook"] = "accepted"
    except Exception as exc:  # noqa: BLE001 - the answer is the finding
        facts["on_completion_hook"] = f"{type(exc).__name__}: {exc}"
    x = torch.ones(N, device="cuda")
    one = [torch.empty(N, device="cuda")]
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, on_trace_ready=commtag.trace_handler(out)):
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
        dist.reduce(x, dst=0)
        dist.all_gather(one, x)
        dist.all_gather_into_tensor(torch.empty(N, device="cuda"), x)
        dist.reduce_scatter(torch.empty(N, device="cuda"), [x])
        dist.reduce_scatter_tensor(torch.empty(N, device="cuda"), x)
        dist.all_to_all_single(torch.empty(N, device="cuda"), x)
        dist.all_to_all_single(torch.empty(N, device="cuda"), x, [N], [N])
        dist.all_to_all(one, [x])
        dist.gather(x, one, dst=0)
        dist.scatter(x, [x.clone()], src=0)
        dist.barrier()
        with dist._coalescing_manager(device=torch.device("cuda", 0)):
            dist.all_reduce(x)
            dist.all_reduce(torch.ones(N // 2, device="cuda"))
        torch.cuda.synchronize()
    commtag.uninstall()
    dist.destroy_process_group()
    (out / "facts.json").write_text(json.dumps(facts, indent=1))


def _load(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def analyse(out: Path) -> tuple[list[str], dict[str, Any]]:
    """Failed checks and findings from the child's trace, sidecar and facts."""
    failures: list[str] = []
    trace = _load(next(out.glob("*.pt.trace.json*")))
    sidecar = _load(next(out.glob("*.commtag.json")))
    findings: dict[str, Any] = json.loads((out / "facts.json").read_text())
    events = trace.get("traceEvents", [])
    ops = sorted((e for e in events if e.get("name") == COMMS_OP), key=lambda e: e.get("ts", 0))
    calls = [e["args"] for e in ops if e["args"].get(COLLECTIVE_NAME_KEY) not in NON_COLLECTIVE_NAMES]
    findings["non_collective_records"] = [e["args"] for e in ops if e["args"].get(COLLECTIVE_NAME_KEY) in
                                          NON_COLLECTIVE_NAMES]
    expected = records(JOB, 0, NCCL2_FORMAT)
    if len(calls) != len(expected):
        failures.append(f"{len(calls)} collective records, the generator writes {len(expected)}")
    offsets = set()
    for got, want in zip(calls, expected):
        offsets.add(got.get(SEQ_KEY, 0) - want[SEQ_KEY])
        for key, value in want.items():
            if key != SEQ_KEY and got.get(key) != value:
                failures.append(f"{want[COLLECTIVE_NAME_KEY]}: {key} is {got.get(key)!r}, the note says {value!r}")
        findings.setdefault("keys_the_generator_does_not_write", {})[want[COLLECTIVE_NAME_KEY]] = sorted(
            set(got) - set(want))
    if len(offsets) > 1:
        failures.append(f"Seq differs from the note's rule by varying offsets {sorted(offsets)}")
    kernels = [e for e in events if e.get("cat") == KERNEL_CATEGORY]
    by_external = {e["args"].get(EXTERNAL_ID_KEY): e["args"] for e in ops}
    findings["kernels_per_record"] = [
        (by_external.get(k["args"].get(EXTERNAL_ID_KEY), {}).get(COLLECTIVE_NAME_KEY), k["name"],
         [key for key in k["args"] if key in KERNEL_EAGER_KEYS]) for k in kernels
        if k["args"].get(EXTERNAL_ID_KEY) in by_external]
    findings["user_annotations"] = sorted({e["name"] for e in events if e.get("cat") in
                                           ("user_annotation", "gpu_user_annotation")})
    findings["sidecar_groups"] = [{k: g.get(k) for k in ("name", "backend", "backend_impls", "record_format")}
                                  for g in sidecar["process_groups"]]
    if not any(g.get("record_format") == NCCL2_FORMAT for g in sidecar["process_groups"]):
        failures.append(f"commtag did not tell the group is nccl2: {findings['sidecar_groups']}")
    annotations = [c["annotation"] for c in sidecar["collectives"]]
    if len(annotations) != len(calls):
        failures.append(f"commtag recorded {len(annotations)} calls, the trace has {len(calls)} records")
    for ann, got in zip(annotations, calls):
        for key in KERNEL_EAGER_KEYS:
            if ann.get(key) != got.get(key):
                failures.append(f"commtag's {got.get(COLLECTIVE_NAME_KEY)}: {key} {ann.get(key)!r} != trace {got.get(key)!r}")
    return failures, findings


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "gpu_nccl2")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.child:
        run_job(out)
        return 0
    why = unavailable()
    if why is not None:
        print(f"NOT AVAILABLE nccl2: {why}", flush=True)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*"):
        stale.unlink()
    env = {**os.environ, USE_NCCL2_ENV: "1"}
    child = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--out", str(out)], env=env,
                           timeout=600)
    if child.returncode != 0:
        print(f"FAIL nccl2 job exited {child.returncode}", flush=True)
        return 1
    failures, findings = analyse(out)
    (out / "findings.json").write_text(json.dumps({"failures": failures, **findings}, indent=1, default=str))
    for failure in failures:
        print("FAIL nccl2 " + failure, flush=True)
    print(f"nccl2: {len(failures)} failed; findings in {out / 'findings.json'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
