"""launch/gpu_check_nccl2.py where it cannot run (CI, this machine): it says so and passes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "gpu_check_nccl2.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check_nccl2", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_torch_2_14_and_cuda_the_nccl2_step_says_not_available(capsys: pytest.CaptureFixture,
                                                                       tmp_path: Path) -> None:
    module = _module()
    why = module.unavailable()
    if why is None:
        pytest.skip("this machine can run nccl2: launch/gpu_check.py runs the step for real")
    assert module.main(["--out", str(tmp_path / "gpu_nccl2")]) == 0
    assert capsys.readouterr().out == f"NOT AVAILABLE nccl2: {why}\n"
    assert not (tmp_path / "gpu_nccl2").exists()


def test_the_nccl2_job_is_the_generators_and_every_call_has_a_record() -> None:
    """The job the step runs is described to the generator call by call: its expected records
    exist for each (the step compares them with the trace's, key by key)."""
    from commtag.testing.nccl2 import records
    from commtag.vocab import NCCL2_FORMAT

    module = _module()
    expected = records(module.JOB, 0, NCCL2_FORMAT)
    # One record per call, two for the coalesced all_reduce of two tensors (§3).
    assert len(expected) == len(module.JOB) + 1
