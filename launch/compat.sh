#!/usr/bin/env bash
# The compatibility run: for each torch version (default: every one from the oldest that
# pyproject.toml allows to the newest), a venv of its own with that torch from the package
# registry, then the runtime, merge and analysis tests and the demo under it.
#   bash launch/compat.sh [VERSION ...]        e.g. bash launch/compat.sh 2.11 2.15
# The registry's torch is a CUDA build (a few GB with its nvidia packages; it runs on CPU),
# so the venvs live outside the repository and are reused:
#   ${COMMTAG_COMPAT_CACHE:-~/.cache/commtag-compat}/torch-X.Y
# Not part of CI (too heavy). Results: a table on stdout and in $cache/results.md, logs
# under $cache/logs/. Exit status: 0 when every version passed. The tests import this
# checkout: leave it unchanged while the run goes (or run it from a clone of its own).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.11 2.12 2.13 2.14 2.15)
cache=${COMMTAG_COMPAT_CACHE:-$HOME/.cache/commtag-compat}
test_timeout=${COMMTAG_COMPAT_TEST_TIMEOUT:-14400}
logs="$cache/logs"
mkdir -p "$logs"
# The suites that exercise torch itself: the runtime patches, the profiler traces the merge
# reads, the analysis of real gloo worlds.
suites=(tests/test_runtime_*.py tests/test_capture_*.py tests/test_cpu_op_collectives.py
        tests/test_gloo_world.py tests/test_merge_*.py tests/test_summary_gloo.py
        tests/test_analyze*.py tests/test_compat_traces.py tests/test_torch_graph_annotations.py
        tests/test_hangs_*.py)

own_constraints() {  # $1: version; prints the path of the version's own pip constraint file
    # A machine's pip configuration may name a constraint file that caps torch below the
    # version asked for; every install for this version (the venv's, and the demo's setup.sh)
    # uses a constraint file of its own instead (PIP_CONSTRAINT overrides the configured one;
    # the machine's file is left as it is).
    local constraints="$cache/constraints-torch-$1.txt"
    echo "torch==$1.*" > "$constraints"
    echo "$constraints"
}

build_venv() {  # $1: version, $2: venv path
    # setup.sh installs torch first (pinned to this minor version), then commtag editable
    # from this checkout with torch pinned again, so nothing moves torch.
    COMMTAG_VENV="$2" COMMTAG_TORCH="torch==$1.*" bash launch/setup.sh
}

failed=0
results="$cache/results.md"
# This run's rows, apart from those of another run going on at the same time (on other versions).
rows=$(mktemp "$cache/results.XXXXXX")
{
    echo "| torch | tests (passed / failed / errors / skipped) | demo | its traces merged: every event accounted |"
    echo "| --- | --- | --- | --- |"
} > "$rows"
for v in "${versions[@]}"; do
    venv="$cache/torch-$v"
    log="$logs/torch-$v"
    PIP_CONSTRAINT=$(own_constraints "$v")
    export PIP_CONSTRAINT
    echo "== torch $v: $venv"
    if ! build_venv "$v" "$venv" > "$log.setup.log" 2>&1; then
        echo "| $v | venv could not be built (see $log.setup.log) | - | - |" >> "$rows"
        failed=1
        continue
    fi
    py="$venv/bin/python"
    full=$("$py" -c "import torch; print(torch.__version__)")
    # One pytest at a time; PYTHONPATH makes this checkout win over whatever the venv has.
    # The suites ran past an hour on this project's 2 shared cores (2026-11-27): the bound,
    # COMMTAG_COMPAT_TEST_TIMEOUT seconds, is for a hang; a run it stops is marked so.
    PYTHONPATH=$repo timeout "$test_timeout" "$py" -m pytest -q -p no:cacheprovider "${suites[@]}" \
        > "$log.tests.log" 2>&1
    tests_rc=$?
    counts=$("$py" - "$log.tests.log" <<'EOF'
import re, sys
tail = open(sys.argv[1], errors="replace").read().splitlines()[-1:] or [""]
counts = {k: 0 for k in ("passed", "failed", "error", "skipped")}
found = re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail[0])
for n, word in found:
    counts["error" if word.startswith("error") else word] += int(n)
print(" / ".join(str(counts[k]) for k in ("passed", "failed", "error", "skipped")) if found
      else "no pytest summary")
EOF
)
    [ $tests_rc -ne 124 ] || counts="stopped after ${test_timeout} s ($counts)"
    # The demo: a 4-rank gloo job profiled by this torch, merged, validated, summarized;
    # its traces are kept for the test that merges every version's traces.
    out="$cache/traces/torch-$v"
    rm -rf "$out" "$cache/traces/small-torch-$v"
    if COMMTAG_VENV="$venv" PYTHONPATH=$repo timeout 1200 bash launch/demo.sh "$out" \
            > "$log.demo.log" 2>&1; then
        demo=ok
    else
        demo="FAILED (see $log.demo.log)"
        failed=1
    fi
    # The merge's per-rank account of the demo's traces (written by this torch's profiler):
    # every event read is written or left out under a reason.
    accounted=$("$py" - "$log.demo.log" <<'EOF'
import re, sys
text = open(sys.argv[1], errors="replace").read()
ranks = re.findall(r"rank (\d+): (\d+) events read, (\d+) written(?:, \d+ launch flows drawn)?(?:; left out: (.*))?", text)
read = sum(int(r[1]) for r in ranks)
written = sum(int(r[2]) for r in ranks)
left = sum(int(n) for r in ranks for n in re.findall(r"(?:^|, )(\d+) ", r[3] or ""))
summary = f"{len(ranks)} ranks, {read} read = {written} written + {left} left out"
print(("yes: " if read == written + left else "NO: ") + summary if ranks else "no account printed")
EOF
)
    # A small 2-rank job's traces as this torch writes them; those of a torch newer than CI's
    # belong under tests/data/torch-traces/ (see its PROVENANCE.md).
    PYTHONPATH=$repo timeout 600 "$py" launch/compat_traces.py "$cache/traces/small-torch-$v" \
        > "$log.small.log" 2>&1 || { demo="$demo; launch/compat_traces.py FAILED"; failed=1; }
    # Graphed traces through this torch's own annotating exporter (2.15+) or post-processor
    # (2.14): tests/data/torch-traces/graphs-torch-* came from here (see its PROVENANCE.md).
    if "$py" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch.cuda.graph_annotations') is None)" 2>/dev/null; then
        rm -rf "$cache/traces/graphs-torch-$v"
        PYTHONPATH=$repo timeout 600 "$py" launch/torch_graph_traces.py "$cache/traces/graphs-torch-$v" \
            > "$log.graphs.log" 2>&1 || { demo="$demo; launch/torch_graph_traces.py FAILED"; failed=1; }
    fi
    [ $tests_rc -eq 0 ] || failed=1
    echo "| $full | $counts | $demo | $accounted |" >> "$rows"
    tail -n 1 "$log.tests.log"
    tail -n 1 "$rows"
    echo "demo: $demo"
done
{
    echo "compat run of $(date -u +%Y-%m-%d) at $(git rev-parse --short HEAD), $(python3 --version)"
    echo
    cat "$rows"
} > "$results"
rm -f "$rows"
echo
cat "$results"
exit $failed
