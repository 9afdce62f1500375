#!/usr/bin/env bash
# Create .venv and install revnmt into it, editable (idempotent). Usage: bash scripts/setup.sh [dev]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
extra=""
[ "${1:-}" = dev ] && extra="[dev]"
# torch first and pinned: an unpinned resolve would pull the CUDA build (gigabytes).
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra}"
