#!/usr/bin/env bash
# The GPU check, one command on a CUDA machine (at most 8 minutes: TOTAL_BUDGET): installs the engine from this tree
# and the wheels carried in .whl/ without dependencies or network, prints the GPU and the versions, then runs, each
# step time-boxed and the next one run whatever happened:
#   kernels  the Triton kernel tests (their CUDA cases)   pytest -m gpu_kernel tests/kernels/test_triton_*.py test_lora_kernels.py
#   cuda     the CUDA correctness tests                  pytest tests/cuda
#   bench    the throughput benchmark against HF         python -m benchmarks.gpu_throughput
#   fp8      the same for Whisper with a float8 KV cache  python -m benchmarks.gpu_throughput --kv-cache-dtype fp8
#   async    ours with asynchronous scheduling            python -m benchmarks.gpu_throughput --async-scheduling
#   ct2      Whisper against faster-whisper's CTranslate2 python -m benchmarks.gpu_throughput --engines ours,ct2
#   host     the host time per step, sync and async    python -m benchmarks.host_overhead --compare-async
#   prefill  xformers' prefill beside SDPA's             python -m benchmarks.gpu_prefill
#   other    every other test marked cuda                pytest -m "cuda and not gpu_kernel" (their folders)
#   sweep    the decode kernel's settings against SDPA   python -m benchmarks.gpu_decode_kernel
# STEPS picks some, in that order (default: all but sweep), e.g. STEPS="sweep bench" BENCH_ARGS="--profile".
# Everything is tee'd to $OUT/gpu_check.log; $OUT also gets the JUnit XML of the tests and gpu_throughput.json.
# Without a GPU it runs as a dry run: the kernel tests on CPU tensors (Triton's interpreter), the CUDA tests skipped,
# the benchmark with --tiny --device cpu. Usage: OUT=/tmp/gpuout bash scripts/gpu_check.sh
# TOTAL_BUDGET (seconds, default 480) bounds the whole run. Time boxes (seconds): KERNEL_TIMEOUT, CUDA_TIMEOUT,
# BENCH_TIMEOUT, FP8_TIMEOUT, ASYNC_TIMEOUT, CT2_TIMEOUT, HOST_TIMEOUT, PREFILL_TIMEOUT, OTHER_TIMEOUT,
# SWEEP_TIMEOUT; BENCH_ARGS adds benchmark flags.
set -uo pipefail

: "${OUT:?set OUT to the folder for the log and the results}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: >"$LOG"
export PYTHONUNBUFFERED=1
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON="$PWD/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi
declare -a SUMMARY=()

say() { echo "$@" | tee -a "$LOG"; }

# The whole check stays within TOTAL_BUDGET seconds (default 8 minutes): a step's time box is cut to what is left,
# and a step with under 20 s left is skipped.
DEADLINE=$(($(date +%s) + ${TOTAL_BUDGET:-480}))

# step NAME SECONDS COMMAND...: runs COMMAND under `timeout`, output tee'd to the log, and records its status
step() {
    local name=$1 seconds=$2 start status left
    shift 2
    left=$((DEADLINE - $(date +%s)))
    if ((left < 20)); then
        SUMMARY+=("$name: SKIPPED (${left} s of the total budget left)")
        say "=== $name: SKIPPED (${left} s of the total budget left)"
        return 0
    fi
    ((seconds > left)) && seconds=$left
    say ""
    say "=== $name (time box ${seconds} s): $*"
    start=$(date +%s)
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee -a "$LOG"
    status=${PIPESTATUS[0]}
    case $status in
        0) verdict=ok ;;
        5) verdict="no tests selected" ;;
        124 | 137) verdict="TIMED OUT" ;;
        *) verdict="FAILED (exit $status)" ;;
    esac
    SUMMARY+=("$name: $verdict, $(($(date +%s) - start)) s")
    say "=== $name: $verdict"
}

install_engine() {
    # editable install: seq2seq_engine.kernels and .models come from setup.py's package_dir mapping
    if (cd /tmp && "$PYTHON" -c "import seq2seq_engine.kernels, seq2seq_engine.models" 2>/dev/null); then
        say "seq2seq_engine already importable: $(cd /tmp && "$PYTHON" -c 'import seq2seq_engine; print(seq2seq_engine.__file__)')"
        return 0
    fi
    "$PYTHON" -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tee -a "$LOG"
    if (cd /tmp && "$PYTHON" -c "import seq2seq_engine.kernels, seq2seq_engine.models" 2>&1 | tee -a "$LOG"); then
        return 0
    fi
    # fallback: the mapped layout copied to a folder on PYTHONPATH (the tree's own seq2seq_engine/ must not shadow it)
    say "editable install failed: using a copy of the package layout in /tmp/seq2seq_engine_path"
    rm -rf /tmp/seq2seq_engine_path && mkdir -p /tmp/seq2seq_engine_path
    cp -r seq2seq_engine /tmp/seq2seq_engine_path/
    cp -r kernels /tmp/seq2seq_engine_path/seq2seq_engine/kernels
    cp -r models /tmp/seq2seq_engine_path/seq2seq_engine/models
    export PYTHONPATH="/tmp/seq2seq_engine_path${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1
}

install_carried_wheels() {
    # wheels carried in .whl/ (ignored by git, docs/gpu.md) whose package this Python cannot import: installed
    # without dependencies or network into a folder put first on PYTHONPATH
    local wheel name site=/tmp/seq2seq_engine_wheels
    for wheel in .whl/*.whl; do
        [[ -e $wheel ]] || continue
        name=$(basename "$wheel" | cut -d- -f1)
        if "$PYTHON" -c "import $name" 2>/dev/null; then
            say "$name already importable: $wheel not installed"
            continue
        fi
        if "$PYTHON" -m pip install -q --no-deps --no-index --target "$site" "$wheel" 2>&1 | tee -a "$LOG"; then
            export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
            say "installed $wheel into $site"
        fi
    done
}

say "=== gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
install_engine
install_carried_wheels
if command -v nvidia-smi >/dev/null; then nvidia-smi 2>&1 | tee -a "$LOG"; fi
"$PYTHON" - <<'EOF' 2>&1 | tee -a "$LOG"
import platform
import torch, transformers, triton
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton.__version__}, transformers {transformers.__version__}")
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, {props.total_memory / 2**30:.1f} GiB, compute capability {props.major}.{props.minor}")
    from seq2seq_engine.platforms.cuda import probe_xformers
    print("xformers prefill: %s (%s)" % probe_xformers())
    import ctypes
    for soname in ("libcublas.so.12", "libcudnn.so.9"):   # what CTranslate2's CUDA build loads (the ct2 step)
        try:
            ctypes.CDLL(soname)
            print(f"{soname}: found")
        except OSError:
            print(f"{soname}: not on the library path (the ct2 step then looks in torch's nvidia wheels)")
EOF
if "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    GPU=1
    say "CUDA GPU found: full sizes"
    BENCH_DEFAULT=(--out "$OUT/gpu_throughput.json")
else
    GPU=0
    say "no CUDA GPU: dry run (kernel tests on CPU tensors, CUDA tests skip, benchmark --tiny --device cpu)"
    BENCH_DEFAULT=(--tiny --device cpu --out "$OUT/gpu_throughput.json")
fi

PYTEST=("$PYTHON" -m pytest -q -p no:cacheprovider)
# on a GPU only the compiled (CUDA) cases: the interpreted ones run on the CPU in CI
KERNEL_FILTER=()
if [[ $GPU == 1 ]]; then KERNEL_FILTER=(-k "not cpu"); fi
STEPS=" ${STEPS:-kernels cuda bench fp8 async ct2 host prefill other} "
wants() { [[ $STEPS == *" $1 "* ]]; }
wants kernels && step "kernel tests" "${KERNEL_TIMEOUT:-120}" "${PYTEST[@]}" -m gpu_kernel "${KERNEL_FILTER[@]}" \
    --junitxml="$OUT/kernel_tests.xml" tests/kernels/test_triton_*.py tests/kernels/test_lora_kernels.py
wants cuda && step "cuda tests" "${CUDA_TIMEOUT:-150}" "${PYTEST[@]}" --junitxml="$OUT/cuda_tests.xml" tests/cuda
# shellcheck disable=SC2086  # BENCH_ARGS: extra flags, split on spaces
wants bench && step "gpu throughput" "${BENCH_TIMEOUT:-150}" "$PYTHON" -m benchmarks.gpu_throughput "${BENCH_DEFAULT[@]}" ${BENCH_ARGS:-}
# our engine with a float8 KV cache against HF (Whisper: the cross reads are most of a decode step's traffic)
if [[ $GPU == 1 ]]; then
    wants fp8 && step "gpu throughput, fp8 KV cache" "${FP8_TIMEOUT:-120}" "$PYTHON" -m benchmarks.gpu_throughput \
        --workloads whisper --kv-cache-dtype fp8 --rounds 1 --out "$OUT/gpu_throughput_fp8.json"
fi
# our engine scheduling each decode step before the previous one's tokens reach the host (HF's times: the bench step)
wants async && step "gpu throughput, async scheduling" "${ASYNC_TIMEOUT:-120}" "$PYTHON" -m benchmarks.gpu_throughput \
    "${BENCH_DEFAULT[@]/gpu_throughput.json/gpu_throughput_async.json}" --async-scheduling --engines ours --rounds 1
# Whisper against faster-whisper's engine (CTranslate2 Whisper.generate on the batch, the same weights converted): on
# a GPU it needs CTranslate2's CUDA build with libcublas.so.12 and libcudnn.so.9, said in the log when missing
wants ct2 && step "gpu throughput, faster-whisper peer" "${CT2_TIMEOUT:-150}" "$PYTHON" -m benchmarks.gpu_throughput \
    "${BENCH_DEFAULT[@]/gpu_throughput.json/gpu_throughput_ct2.json}" --workloads whisper --engines ours,ct2 --rounds 1
# the host's share of a step on the tiny models (this machine's CPU), without and with asynchronous scheduling
wants host && step "host time per step" "${HOST_TIMEOUT:-90}" "$PYTHON" -m benchmarks.host_overhead --rounds 1 \
    --compare-async
# the folders that hold tests marked cuda outside tests/cuda (others need packages the GPU image lacks)
wants other && step "other cuda tests" "${OTHER_TIMEOUT:-40}" "${PYTEST[@]}" -m "cuda and not gpu_kernel" \
    --junitxml="$OUT/other_cuda_tests.xml" tests/attention tests/platforms tests/worker tests/kernels
if [[ $GPU == 1 ]]; then
    wants prefill && step "prefill attention, xformers and SDPA" "${PREFILL_TIMEOUT:-40}" "$PYTHON" -m benchmarks.gpu_prefill \
        --out "$OUT/gpu_prefill.json"
    wants sweep && step "decode kernel sweep" "${SWEEP_TIMEOUT:-120}" "$PYTHON" -m benchmarks.gpu_decode_kernel \
        --out "$OUT/decode_kernel.json"
fi

say ""
say "=== summary (GPU=$GPU)"
for line in "${SUMMARY[@]}"; do say "  $line"; done
# the benchmark's table again, so that the end of the output holds it
grep -E '^\|(---| workload | whisper | bart )' "$LOG" | tee -a "$LOG"
