#!/usr/bin/env bash
# Sets up .venv (scripts/setup_env.sh), checks style (flake8, isort) and runs the whole test suite; pytest's
# "no tests" (exit 5) is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/python -m flake8
.venv/bin/python -m isort --check-only --diff .
set +e
.venv/bin/python -m pytest -q "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    exit 1
fi
exit "$status"
