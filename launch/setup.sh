#!/usr/bin/env bash
# Creates .venv (once) with the project and its test extras installed.
# torch is installed first and pinned, so nothing can pull a newer CUDA build:
# on the CPU machines of this project `pip install torch==2.13.0` takes the
# local CPU wheel; elsewhere set COMMTAG_TORCH to the torch you want.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${COMMTAG_VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
py="$venv/bin/python"
if ! "$py" -c "import torch" 2>/dev/null; then
    "$py" -m pip install -q "${COMMTAG_TORCH:-torch==2.13.0}"
fi
torch_version=$("$py" -c "import torch; print(torch.__version__.split('+')[0])")
"$py" -m pip install -q -e ".[test]" "torch==${torch_version}"
# HTA (a real consumer of our per-rank JSON in the tests): its own requirements pull
# jupyterlab, so it comes without them; its runtime imports are in the test extra.
"$py" -m pip install -q --no-deps "HolisticTraceAnalysis==0.5.0"
# traceinsight, HTA's successor, installs the same module `hta`: it goes beside the venv's
# site-packages (tests put it first on PYTHONPATH in a subprocess), also without its requirements.
"$py" -m pip install -q --no-deps --upgrade --target "$venv/traceinsight" "traceinsight==0.6.1"
