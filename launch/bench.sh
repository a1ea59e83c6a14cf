#!/usr/bin/env bash
# Every benchmark in one command; prints the results as markdown.
#   bash launch/bench.sh           full run (3 scale sets of 1M events and one 8-rank set of 3M events,
#                                  3 repetitions; ~25 min on 2 cores)
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
echo "### One-time cost per collective at CUDA-graph capture"
echo
# Exit 2: no GPU here, and it says so; 1: the run failed, which fails this script.
"$py" launch/bench_capture.py "${quick[@]}" --json "$work/capture.json" || [ $? -eq 2 ]
echo
echo "## Merge throughput"
echo
"$py" launch/bench_merge.py "${quick[@]}" --workdir "$work" --json "$work/merge.json"
echo
if [ ${#quick[@]} -eq 0 ]; then
  # Larger ranks (72 MB of JSON each): the floor's cost grows faster than the rank, the merge's does not.
  echo "### Larger ranks: 8 ranks, 3 M events"
  echo
  "$py" launch/bench_merge.py --sets 8 --events 3000000 --workdir "$work/3m" --json "$work/merge-3m.json"
  echo
fi
echo "Reproduce: \`bash launch/bench.sh${quick:+ --quick}\` (raw results in $work/*.json)."
