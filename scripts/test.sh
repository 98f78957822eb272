#!/usr/bin/env bash
# Set up .venv (idempotent) and run the test suite (without the long behavioural runs) and the linter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q -m "not slow" "$@"
.venv/bin/ruff check
