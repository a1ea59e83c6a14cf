#!/usr/bin/env bash
# commtag as a user installs it into the environment that runs the job: the wheel built from a
# clean clone of HEAD (`pip wheel . --no-deps`), installed with pip into a fresh venv that
# already holds a torch, which pip must keep (no torch installed, the version unchanged).
# Then `commtag --help`, commtag.install() in a profiled 2-rank gloo job, and a merge of its
# traces that validates. Run outside the checkout, so nothing is imported from it.
#   bash launch/check_wheel.sh        the venv's torch: COMMTAG_WHEEL_TORCH (default torch==2.13.0)
# Exit status 0 when every step passed; the temporary folder is removed either way.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_wheel: FAILED: $*" >&2; exit 1; }

# A clone, not the working tree: a stale build/ or egg-info there would put files in the wheel
# that the package configuration leaves out.
git clone -q "$repo" "$work/src"
python3 -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/commtag-*.whl)
echo "built $(basename "$wheel")"
python3 -c "import sys, zipfile; sys.exit(any(n.startswith('commtag/testing/') for n in zipfile.ZipFile(sys.argv[1]).namelist()))" \
    "$wheel" || fail "the wheel holds commtag.testing (test helpers: a checkout's only)"

python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q "${COMMTAG_WHEEL_TORCH:-torch==2.13.0}"
torch_before=$("$py" -c "import torch; print(torch.__version__)")
"$py" -m pip install "$wheel" > "$work/install.log" 2>&1 || { cat "$work/install.log"; fail "pip install of the wheel"; }
installed=$(grep "^Successfully installed" "$work/install.log" || true)
echo "${installed:-nothing new installed}"
if grep -q -E "(^| )(torch|nvidia-[a-z0-9-]+|triton)-[0-9]" <<< "$installed"; then fail "pip installed a torch: $installed"; fi
torch_after=$("$py" -c "import torch; print(torch.__version__)")
[ "$torch_before" = "$torch_after" ] || fail "torch went from $torch_before to $torch_after"
echo "torch kept: $torch_after"

cd "$work"  # nothing of the checkout on sys.path from here on
"$work/venv/bin/commtag" --help > /dev/null || fail "commtag --help"
"$py" -c "import commtag, importlib.util as u; assert u.find_spec('commtag.testing') is None; print('commtag from', commtag.__file__)"
cat > "$work/job.py" <<'EOF'
"""A 2-rank gloo job with commtag installed, profiled: one trace and one sidecar per rank."""
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import commtag

commtag.install()
dist.init_process_group("gloo")
with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(sys.argv[1])):
    t = torch.ones(1024)
    dist.all_reduce(t)
    dist.broadcast(t, src=1)
    dist.barrier()
assert t[0].item() == 2.0
dist.destroy_process_group()
EOF
"$py" -m torch.distributed.run --standalone --nproc-per-node=2 job.py traces > job.log 2>&1 || { cat job.log; fail "the profiled job"; }
"$work/venv/bin/commtag" merge traces -o traces/merged.pftrace || fail "commtag merge"
"$work/venv/bin/commtag" validate traces/merged.pftrace || fail "commtag validate"
"$work/venv/bin/commtag" summary traces/merged.pftrace > summary.txt || fail "commtag summary"
sed -n 1,20p summary.txt
echo "check_wheel: passed (torch $torch_after)"
