#!/usr/bin/env bash
# Every benchmark in one command; prints the results as markdown.
#   bash launch/bench.sh           full run (3 scale sets of 1M events, 3 repetitions; ~10-15 min on 2 cores)
#   bash launch/bench.sh --quick   smoke run (8-rank set, 1 repetition, 2000 calls per variant)
# Scale sets and raw JSON results go to ${COMMTAG_BENCH_DIR:-/tmp/commtag-bench}.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then py=.venv/bin/python; fi
work=${COMMTAG_BENCH_DIR:-/tmp/commtag-bench}
mkdir -p "$work"
quick=()
if [ "${1:-}" = "--quick" ]; then quick=(--quick); fi

echo "## Runtime overhead per collective call"
echo
"$py" launch/bench_runtime.py "${quick[@]}" --json "$work/runtime.json"
echo
echo "## Merge throughput"
echo
"$py" launch/bench_merge.py "${quick[@]}" --workdir "$work" --json "$work/merge.json"
echo
echo "Reproduce: \`bash launch/bench.sh${quick:+ --quick}\` (raw results in $work/*.json)."
