"""The merge's start-up: what it imports depends on the input at hand.

pydantic alone costs about a tenth of a second, which counts against the
merge's time budget, so a merge of traces without sidecars must not load it,
and ``import commtag`` must stay cheap. A sidecar, when present, is still
fully validated (the sidecar and reliability tests cover that).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commtag.testing import PUBLIC_TRACES

TRACE = PUBLIC_TRACES / "single-rank-scale" / "hta_a100_rank0_of16.json.gz"

_HEAVY = ("pydantic", "tqdm", "torch", "matplotlib", "numpy")

_PROBE = """
import sys
from commtag.cli import main
code = main(sys.argv[1:])
loaded = sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))
print('LOADED', ','.join(loaded))
sys.exit(code)
"""


def _merge_loads(tmp_path: Path, inputs: Path) -> set[str]:
    out = tmp_path / "merged.pftrace"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.replace("HEAVY", repr(_HEAVY)), "merge", str(inputs), "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED"))
    return set(filter(None, line.split(" ", 1)[1].split(",")))


@pytest.mark.slow
def test_import_commtag_leaves_pydantic_and_torch_unloaded() -> None:
    code = "import sys, commtag; print(sorted({m.split('.')[0] for m in sys.modules} & set(%r)))" % (_HEAVY,)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "[]"


def test_models_still_reachable_from_the_package() -> None:
    import commtag
    from commtag.schema import CollectiveAnnotation, Sidecar

    assert commtag.Sidecar is Sidecar
    assert commtag.CollectiveAnnotation is CollectiveAnnotation


@pytest.mark.slow
def test_merge_without_sidecar_loads_nothing_heavy(tmp_path: Path) -> None:
    inputs = tmp_path / "traces"
    inputs.mkdir()
    shutil.copy(TRACE, inputs / TRACE.name)
    assert _merge_loads(tmp_path, inputs) == set()


_PROTOS = "perfetto.protos.perfetto.trace.perfetto_trace_pb2"
_PROTOS_PROBE = """
import sys
from commtag.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print('PROTOS', MODULE in sys.modules)
sys.exit(code)
""".replace("MODULE", repr(_PROTOS))


@pytest.mark.slow
def test_the_generated_protos_are_loaded_only_where_the_trace_is_written(tmp_path: Path) -> None:
    """The merge writes its cold packets (header, descriptors, counters, interned data) through
    Perfetto's generated protos, whose module costs a process 0.05-0.14 s and ~10 MB: the merge
    loads it, while --help and a summary of a trace directory, which write no packet, do not."""
    inputs = tmp_path / "traces"
    inputs.mkdir()
    shutil.copy(TRACE, inputs / TRACE.name)
    loaded = {}
    for name, args in (("help", ["merge", "--help"]), ("summary", ["summary", str(inputs)]),
                       ("merge", ["merge", str(inputs), "-o", str(tmp_path / "merged.pftrace")])):
        proc = subprocess.run([sys.executable, "-c", _PROTOS_PROBE, *args], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        loaded[name] = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROTOS")) == "PROTOS True"
    assert loaded == {"help": False, "summary": False, "merge": True}


_REPORT_PROBE = """
import sys
from commtag.cli import main
code = main(sys.argv[1:])
print('REPORT', sorted(m for m in sys.modules if m.startswith('commtag.report')))
sys.exit(code)
"""


@pytest.mark.slow
def test_a_merge_without_dumps_loads_no_report(tmp_path: Path) -> None:
    """The summary's modules (tables, figures, the Flight Recorder report) are the merge's only
    where dumps lie beside the traces: a plain merge never loads them."""
    inputs = tmp_path / "traces"
    inputs.mkdir()
    shutil.copy(TRACE, inputs / TRACE.name)
    proc = subprocess.run([sys.executable, "-c", _REPORT_PROBE, "merge", str(inputs), "-o", str(tmp_path / "m.pftrace")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT")) == "REPORT []"
