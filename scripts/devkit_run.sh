#!/usr/bin/env bash
# devkit_run.sh — the GPU checks from a carried .devkit (scripts/devkit.sh),
# run from the repository root on the GPU machine. Logs go to $OUT (the
# device tool's folder) or bench/out/.
#
#   bash scripts/devkit_run.sh [info] [test] [bench] [attention] [techniques] [measure] [sanitize]
#     info        GPU, driver, glibc, and which libraries the plugin resolves
#     test        tests/gpu_cuda/run.sh (what `make test-gpu` runs)
#     bench       bench/train_gpu/run.py: bert-base 32 x 128/512, fp32/fp16, vs HF
#     attention   bench/attn_gpu: fused attention's kernels (the card's pick, the
#                 sm75 path, the reference) at bert-base 32 x 128/512, fp16/bf16/fp32
#     techniques  bench/train_gpu/run.py --techniques --seq 512 (bert-base)
#     measure     bench/train_gpu/run.py --techniques --models bert-mini --seq 128
#     sanitize    compute-sanitizer on gpu_ops: memcheck over every op, racecheck
#                 and synccheck over the shared-memory kernels (attention,
#                 LayerNorm, softmax, cross-entropy, column sums, 8-bit AdamW)
#   (no argument: info test bench)
# BENCH_ARGS replaces bench's arguments, TECH_ARGS those of techniques, ATTN_ARGS attention's.
set -u -o pipefail
kit=${KIT:-.devkit}
out=${OUT:-bench/out}
mkdir -p "$out"
[ -f "$kit/build/bench/train_cpu" ] || { echo "devkit_run: no $kit (run scripts/devkit.sh here first)" >&2; exit 2; }
chmod +x "$kit"/build/gpu_tests/gpu_* "$kit"/build/bench/* "$kit/build/txk" # in case the copy lost the modes

# Our libraries first; then wherever CUDA keeps CUPTI and cuBLAS on this image.
ld="$(pwd)/$kit/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/extras/CUPTI/lib64; do [ -d "$d" ] && ld="$ld:$d"; done
export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TXK_CUDA_PLUGIN="$(pwd)/$kit/build/libtk_cuda.so"
export PYTHONUNBUFFERED=1
py=$(command -v python3)

# memcheck over all of gpu_ops, then racecheck and synccheck test by test.
sanitize_ops() {
    local cs=$1 ops=$2 bad=0 only tool
    "$cs" --tool memcheck --error-exitcode 9 "$ops" || bad=1
    for only in attention layernorm softmax xent bias_grad sumsq adamw8; do
        for tool in racecheck synccheck; do
            echo "--- $tool $only"
            TK_TEST_ONLY=$only "$cs" --tool $tool --error-exitcode 9 "$ops" || bad=1
        done
    done
    return $bad
}

# bench/train_gpu/run.py with the given arguments, logged to $out/$1.
run_bench() {
    local log=$1
    shift
    "$py" bench/train_gpu/run.py "$kit/build" "$@" 2>&1 | tee "$out/$log"
}

steps=${*:-info test bench}
rc=0
for s in $steps; do
    echo "=== $s ($(date -u +%FT%TZ))"
    case "$s" in
    info)
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
        ldd --version | head -n 1
        "$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' || true
        ldd "$TXK_CUDA_PLUGIN" | grep -E 'cublas|cupti|cudart|not found' | tee "$out/info.log"
        ldd "$kit/build/bench/train_cpu" | grep 'not found' && rc=1
        ;;
    test)
        bash tests/gpu_cuda/run.sh "$kit/build" 2>&1 | tee "$out/test-gpu.log" || rc=1
        ;;
    bench)
        # shellcheck disable=SC2086
        run_bench bench-train-gpu.log ${BENCH_ARGS:-} || rc=1
        ;;
    attention)
        # shellcheck disable=SC2086
        "$kit/build/bench/attn_gpu" ${ATTN_ARGS:-} 2>&1 | tee "$out/bench-attn-gpu.log" || rc=1
        ;;
    techniques)
        # shellcheck disable=SC2086
        run_bench bench-techniques.log ${TECH_ARGS:---techniques --seq 512} || rc=1
        ;;
    measure)
        run_bench bench-techniques-mini.log --techniques --models bert-mini --seq 128 || rc=1
        ;;
    sanitize)
        cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
        if [ -z "$cs" ]; then echo "devkit_run: compute-sanitizer not found"; rc=1; continue; fi
        sanitize_ops "$cs" "$kit/build/gpu_tests/gpu_ops" 2>&1 | tee "$out/sanitize.log" || rc=1
        ;;
    *)
        echo "devkit_run: unknown step '$s' (info, test, bench, attention, techniques, measure, sanitize)" >&2
        rc=2
        ;;
    esac
done
exit $rc
