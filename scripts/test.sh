#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest, e.g. -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/python -m pytest -q "$@"
