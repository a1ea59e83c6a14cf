#!/usr/bin/env bash
# The main job: set up .venv if needed, run the 4-rank gloo demo under torchrun,
# merge every rank's trace and sidecar into traces/merged.pftrace, print a summary.
#   bash launch/demo.sh [OUT_DIR]      (default: traces)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-traces}
bash launch/setup.sh
py="${COMMTAG_VENV:-.venv}/bin/python"
# A previous run's files would be refused as a different run: clear only the demo's own.
rm -f "$out"/rank*.pt.trace.json.gz "$out"/rank*.commtag.json
"$py" -m torch.distributed.run --standalone --nproc-per-node=4 launch/demo.py --out "$out"
"$py" -m commtag.merge "$out" -o "$out/merged.pftrace" --align collectives
"$py" -m commtag validate "$out/merged.pftrace"
"$py" -m commtag summary "$out/merged.pftrace" --plot "$out/summary.png"
echo
echo "Open $out/merged.pftrace in https://ui.perfetto.dev (Open trace file)."
