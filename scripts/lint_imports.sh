#!/usr/bin/env bash
# Checks the import contracts of setup.cfg ([importlinter]) with lint-imports. kernels/ and models/ are installed as
# seq2seq_engine.kernels and seq2seq_engine.models (setup.py's package_dir), a mapping import-linter does not follow,
# so it reads a copy of the package laid out as installed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
lint_imports=lint-imports
[ -x .venv/bin/lint-imports ] && lint_imports="$repo/.venv/bin/lint-imports"
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
cp -R seq2seq_engine "$tree/seq2seq_engine"
cp -R kernels "$tree/seq2seq_engine/kernels"
cp -R models "$tree/seq2seq_engine/models"
cd "$tree"
"$lint_imports" "$repo/setup.cfg" --no-cache --no-logo "$@"
