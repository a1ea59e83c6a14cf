#!/usr/bin/env bash
# The test command: set up .venv if needed, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
exec "${COMMTAG_VENV:-.venv}/bin/python" -m pytest -q "$@"
