"""What the test modules share: the public traces, the gloo runs many of them read, the markers' rules.

Markers (registered in pyproject.toml):

- ``slow``: the test starts processes (gloo worlds, torchrun, the CLI in a subprocess) or runs
  long. CI runs it; ``bash launch/test.sh --fast`` leaves it out. In such a run a test without the
  marker that starts a process fails and says so, so the fast subset stays fast. A test parametrized with a
  public trace of LARGE_TRACE_BYTES or more is marked slow here (those take seconds each).
- ``soak``: extra seeds and long repeats beyond what CI runs; deselected by default
  (``pytest -m soak`` runs them).
- ``gpu``: needs a CUDA GPU; skipped where none is visible.

Hypothesis: the profile named by ``COMMTAG_HYPOTHESIS_PROFILE`` is loaded: ``ci`` (derandomized,
so a CI failure repeats; ``.ci/run`` sets it) or ``dev`` (the default: random, so local runs keep
finding new cases).
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import pytest
from hypothesis import settings

from commtag.testing import PUBLIC_TRACES

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev")
settings.load_profile(os.environ.get("COMMTAG_HYPOTHESIS_PROFILE", "dev"))

#: A public trace this large (compressed) takes seconds to merge or stream: its test cases are slow.
LARGE_TRACE_BYTES = 500_000
#: The world size of the shared ``gloo_run``.
GLOO_RUN_WORLD = 4


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The seeds of tests/test_truth.py that this commit picked (they move with each commit),
    said at the end of every run, -q included, so a failing CI run names what it ran."""
    from truth_world import moving_seeds

    terminalreporter.write_line(f"truth seeds of this commit: {', '.join(map(str, moving_seeds()))}")


@pytest.fixture(scope="session")
def public_traces() -> Path:
    """tests/data/public: real traces other projects wrote (see its PROVENANCE.md)."""
    return PUBLIC_TRACES


@pytest.fixture(scope="session")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real 4-rank gloo run, commtag installed and profiled: the world, even/odd pairs and
    the pair (0, 1); sync, async and p2p calls (``gloo_world.profiled_groups_job``). Its
    directory of traces and sidecars is shared and read-only: copy it before changing a file."""
    from gloo_world import profiled_groups_job, run_world  # torch: only when a test asks

    out = tmp_path_factory.mktemp("gloo_run")
    run_world(profiled_groups_job, GLOO_RUN_WORLD, str(out))
    return out


@pytest.fixture(scope="session")
def sleep_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real 4-rank gloo run in which one rank sleeps before a chosen all_reduce
    (``sleep_world``): the analysis, summary and HTA tests read it. Read-only, like ``gloo_run``."""
    from sleep_world import run_sleep_world  # torch: only when a test asks

    return run_sleep_world(tmp_path_factory.mktemp("sleep_run") / "traces")


# ---------------------------------------------------------------------------
# Markers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(_large_public_trace(value) for value in getattr(item, "callspec", None) and item.callspec.params.values()
               or ()):
            item.add_marker(pytest.mark.slow)
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda_visible():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


def _large_public_trace(value: object) -> bool:
    """A parameter naming a public trace (a path, or a path relative to the folder) of LARGE_TRACE_BYTES or more."""
    if not isinstance(value, (str, Path)):
        return False
    path = PUBLIC_TRACES / value
    try:
        return path.resolve().is_relative_to(PUBLIC_TRACES.resolve()) and path.stat().st_size >= LARGE_TRACE_BYTES
    except (OSError, ValueError):  # not a path on this system (a NUL byte, a name too long)
        return False


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


#: The test now running when it may not start processes, else None.
_forbidden_in: Optional[str] = None


@contextmanager
def processes_refused(nodeid: str) -> Iterator[None]:
    """Inside, starting a process (subprocess, multiprocessing, torch's spawn) raises, naming ``nodeid``."""
    global _forbidden_in
    _forbidden_in = nodeid
    try:
        yield
    finally:
        _forbidden_in = None


def _refuse_processes(start):
    def guarded(*args, **kwargs):
        if _forbidden_in is not None:
            raise RuntimeError(f"{_forbidden_in} starts a process but is not marked slow "
                               "(@pytest.mark.slow: launch/test.sh --fast must start none)")
        return start(*args, **kwargs)
    return guarded


subprocess.Popen._execute_child = _refuse_processes(subprocess.Popen._execute_child)
multiprocessing.process.BaseProcess.start = _refuse_processes(multiprocessing.process.BaseProcess.start)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _guarded(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _guarded(item)


def _guarded(item: pytest.Item) -> Iterator[None]:
    """In a run that leaves slow tests out (``-m "not slow"``: launch/test.sh --fast), the setup and
    call of each test may not start a process (session fixtures are set up inside the first test
    that asks for them, so they count for it). Full runs are not policed: an unmarked test there
    costs time, not correctness."""
    if "not slow" in (item.config.getoption("markexpr") or "") and not item.get_closest_marker("slow"):
        with processes_refused(item.nodeid):
            yield
    else:
        yield
