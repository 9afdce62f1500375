#!/usr/bin/env bash
# Set up (if needed) and run the test suite, one pytest process a core (pytest-xdist; a test file stays in one
# process, so its module fixtures are built once). Extra arguments go to pytest, e.g. -m "not slow", or -n 0 for
# one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/python -m pytest -q -n auto --dist loadfile "$@"
