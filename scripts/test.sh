#!/usr/bin/env bash
# Sets up .venv (scripts/setup_env.sh), checks style (flake8, isort) and the import contracts (lint-imports), runs the
# kernel and int8 tests on an AVX2-only CPU stood in on this one, then the whole test suite (arguments: pytest's,
# instead of the AVX2 pass and the whole suite).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/python -m flake8
.venv/bin/python -m isort --check-only --diff .
bash scripts/lint_imports.sh
# The AVX2 stand-in (docs/platforms.md): the platform capped at AVX2, so our native kernels build for x86-64-v3
# (AVX2 + FMA) and oneDNN, MKL, fbgemm and ATen are capped at AVX2 too (set here as well, since pytest may load
# torch before the engine applies the cap), so the paths an AVX2-only CPU runs are tested on every machine. The
# Triton kernels (interpreted) and the tests that build fixed targets (x86-64-v2/v3, alderlake) do not depend on the
# cap: the whole suite runs them once.
if [ "$#" -eq 0 ]; then
    env SEQ2SEQ_ENGINE_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 \
        .venv/bin/python -m pytest -q -p no:cacheprovider tests/kernels tests/platforms tests/models/test_int8.py \
        tests/models/test_int8_whisper.py tests/models/test_packed_linear.py tests/models/test_packing_choice.py \
        --ignore-glob='tests/kernels/test_triton_*' --ignore=tests/kernels/test_portable_builds.py \
        --ignore=tests/kernels/test_linear_builds.py
fi
# pytest's "no tests" (exit 5) is a failure
run_pytest() {
    set +e
    .venv/bin/python -m pytest -q "$@"
    local status=$?
    set -e
    if [ "$status" -eq 5 ]; then
        echo "pytest collected no tests: failing" >&2
        return 1
    fi
    return "$status"
}
if [ "$#" -gt 0 ]; then
    run_pytest "$@"
    exit
fi
# Two pytest processes at a time (pytest-xdist, a test file each) where the tests only compute: the benchmark
# scripts' smoke runs (child processes of one thread each), the models, kernels, engine, file transcription and the
# layers below them. The tests of live audio, servers and the Ray cluster, whose timing and ports another process
# would disturb, run afterwards in one process.
# Transcription's files run in the first group except the live ones (test_live_*.py: real-time pacing).
TRANSCRIPTION=(tests/transcription/test_*.py)
LIVE=(tests/transcription/test_live_*.py)
SHARED=(tests/benchmarks tests/models tests/kernels tests/engine tests/sampling tests/core tests/attention tests/worker
        tests/inputs tests/tokenization tests/model_loader tests/platforms tests/docs tests/lora)
for file in "${TRANSCRIPTION[@]}"; do
    [[ " ${LIVE[*]} " == *" $file "* ]] || SHARED+=("$file")
done
SERIAL=("${LIVE[@]}" tests/audio tests/entrypoints tests/integrations tests/cuda tests/test_*.py)
for folder in tests/*/; do   # a new test folder must be put in one of the two lists
    folder=${folder%/}
    [[ $folder == tests/transcription ]] && continue   # split by file above
    if [[ $folder != tests/__* && " ${SHARED[*]} ${SERIAL[*]} " != *" $folder "* ]]; then
        echo "scripts/test.sh: $folder is in neither SHARED nor SERIAL" >&2
        exit 1
    fi
done
status=0
run_pytest -n 2 --dist loadfile "${SHARED[@]}" || status=$?
run_pytest "${SERIAL[@]}" || status=$?
exit "$status"
