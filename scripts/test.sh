#!/usr/bin/env bash
# Set up .venv (idempotent), lint, and run the test suite (without the long behavioural runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check
.venv/bin/python -m pytest -m "not slow" "$@"
