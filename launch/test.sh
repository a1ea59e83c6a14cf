#!/usr/bin/env bash
# The test command: set up .venv if needed, lint and type-check, then run the whole suite.
#   bash launch/test.sh           everything CI runs (what .ci/run runs)
#   bash launch/test.sh --fast    lint and type-check, then the tests that start no process (-m "not slow and not soak")
# Other arguments go to pytest. Marker meanings are in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
py="${COMMTAG_VENV:-.venv}/bin/python"
"$py" -m ruff check .
"$py" -m mypy
if [ "${1:-}" = "--fast" ]; then
    shift
    exec "$py" -m pytest -q -m "not slow and not soak" "$@"
fi
exec "$py" -m pytest -q "$@"
