#!/usr/bin/env bash
# devkit_run.sh — the GPU checks from a carried kit (scripts/devkit.sh), run
# from the repository root on the GPU machine. Unpacks .devkit.tar.xz into
# .devkit/ (again whenever the archive is newer), checks that the kit holds
# what the steps need and that the machine has a GPU, naming whatever is
# missing, then runs the steps. Logs go to $OUT (the device tool's folder)
# or bench/out/.
#
#   bash scripts/devkit_run.sh [short] [info] [test] [bench] [attention] [techniques] [measure] [sanitize] [companion]
#     short       one short run (under 10 minutes on a card, issue 43): info, stopping when ldd
#                 finds a library "not found"; gpu_ops' attention tests and its fast-vs-reference
#                 tests; gpu_model's cuBLASLt decline counters (test_lt_declines); attn_gpu at
#                 p = 0 and 0.1, T = 128 and 512, fp16 and bf16; the step (default, standard,
#                 fused; CUPTI off) beside HF eager and sdpa at 32 x 512 fp16. Then, in a
#                 second call, `test bench` (the full suite and the bench)
#     info        GPU, driver, glibc, the kit's commit, and which libraries the plugin resolves
#     test        tests/gpu_cuda/run.sh (what `make test-gpu` runs), after `companion`
#     bench       bench/train_gpu/run.py: bert-base 32 x 128/512 fp16/bf16, 512 fp32 and
#                 a batch of real lengths: txkernel (default, standard, fused) vs HF (eager, sdpa), MFU
#     attention   bench/attn_gpu: fused attention's kernels (the card's pick, the
#                 sm75 path, the reference) at bert-base 32 x 128/512, fp16/bf16/fp32
#     techniques  bench/train_gpu/run.py --techniques --seq 512 (bert-base)
#     measure     bench/train_gpu/run.py --techniques --models bert-mini --seq 128
#     sanitize    compute-sanitizer on gpu_ops: memcheck over every op, racecheck
#                 and synccheck over the shared-memory kernels (attention,
#                 LayerNorm, softmax, cross-entropy, column sums, 8-bit AdamW)
#     companion   installs the kit's wheels (jupyter_client, ipykernel and what
#                 they need) with the kit's own pip into .devkit/site for the
#                 machine's python3 (the one with torch), and checks that it
#                 imports them and the companion; needs no GPU
#   (no argument: info test bench)
# BENCH_ARGS replaces bench's arguments, TECH_ARGS those of techniques, ATTN_ARGS attention's;
# PYTHON names another python than python3.
#
# gpu_txwatch is skipped (it says why) only when the kit has no wheel for
# this Python: the version is not among those the kit was packed for and pip
# finds no matching distribution. Any other install failure fails the step.
set -u -o pipefail
archive=${DEVKIT_ARCHIVE:-.devkit.tar.xz}
kit=${KIT:-.devkit}
out=${OUT:-bench/out}
steps=${*:-info test bench}
die() { echo "devkit_run: $*" >&2; exit 2; }

# ---- the kit
if [ -f "$archive" ]; then
    if [ ! -f "$kit/.unpacked" ] || [ "$archive" -nt "$kit/.unpacked" ]; then
        rm -rf "$kit"
        mkdir -p "$kit"
        tar xJf "$archive" -C "$kit" || die "cannot unpack $archive into $kit (a partial copy? run scripts/devkit.sh again)"
        touch "$kit/.unpacked"
    fi
elif [ ! -f "$kit/.unpacked" ]; then
    die "no $archive here and no unpacked $kit: run scripts/devkit.sh on the build machine" \
        "and carry $archive with the tree (device run: carry [\"$archive\"])"
fi
want="build/libtk_cuda.so build/txk build/bench/train_cpu build/bench/attn_gpu companion/txkernel/_engine.py companion/txkernel/libtxk.so
      wheels/requirements.txt wheels/PYTHONS"
for src in tests/gpu_cuda/gpu_*.c; do want="$want build/gpu_tests/$(basename "$src" .c)"; done
missing=""
for f in $want; do [ -f "$kit/$f" ] || missing="$missing $f"; done
pipwhl=$(ls -d "$kit"/wheels/pip-*.whl 2>/dev/null | head -n 1)
[ -n "$pipwhl" ] || missing="$missing wheels/pip-*.whl"
[ -z "$missing" ] || die "the kit in $kit lacks:$missing (packed from an older tree? run scripts/devkit.sh again)"
chmod +x "$kit"/build/gpu_tests/gpu_* "$kit"/build/bench/* "$kit/build/txk" # in case the copy lost the modes
kit=$(cd "$kit" && pwd) # absolute from here on: the paths below are handed to other processes
pipwhl=$kit/wheels/$(basename "$pipwhl")

py=${PYTHON:-$(command -v python3)} || die "no python3 on PATH (set PYTHON)"
mkdir -p "$out"

# ---- the GPU, for every step but companion
for s in $steps; do
    [ "$s" = companion ] && continue
    if ! command -v nvidia-smi >/dev/null; then
        die "no NVIDIA GPU here: nvidia-smi is not on PATH (the steps '$steps' need a GPU)"
    fi
    gpus=$(nvidia-smi -L 2>&1)
    printf '%s\n' "$gpus" | grep -q '^GPU [0-9]' ||
        die "no NVIDIA GPU here: nvidia-smi -L lists none (${gpus:-no output}); the steps '$steps' need one"
    break
done

# Our libraries first; then wherever CUDA keeps CUPTI and cuBLAS on this image.
ld="$kit/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/extras/CUPTI/lib64; do [ -d "$d" ] && ld="$ld:$d"; done
export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TXK_CUDA_PLUGIN="$kit/build/libtk_cuda.so"
export PYTHONUNBUFFERED=1

# The companion's kernel stack into $kit/site for $py (pip --target: the
# python's own environment is left as it is; run.sh puts the site on
# PYTHONPATH for gpu_txwatch alone). 0 when installed or when this Python
# has no wheel in the kit (TXK_COMPANION_SKIP then says why), else 1.
companion() {
    local site="$kit/site" pyv log
    pyv=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || { echo "devkit_run: $py does not run"; return 1; }
    export TXK_COMPANION_PYTHON="$py"
    export TXK_COMPANION_PYTHONPATH="$site:$kit/companion"
    [ -f "$site/.installed-$pyv" ] && return 0
    rm -rf "$site"
    if log=$("$py" "$pipwhl/pip" install -q --disable-pip-version-check --no-index --no-compile --only-binary=:all: \
            --find-links "$kit/wheels" --target "$site" -r "$kit/wheels/requirements.txt" 2>&1); then
        touch "$site/.installed-$pyv"
    elif ! grep -qx "$pyv" "$kit/wheels/PYTHONS" && grep -qi 'no matching distribution' <<<"$log"; then
        export TXK_COMPANION_SKIP="the kit has no wheels for Python $pyv ($py): it was packed for Python \
$(tr '\n' ' ' < "$kit/wheels/PYTHONS")(DEVKIT_PYTHONS=$pyv bash scripts/devkit.sh packs them); pip: \
$(grep -i -m 1 'no matching distribution' <<<"$log")"
        echo "devkit_run: $TXK_COMPANION_SKIP"
        return 0
    else
        printf 'devkit_run: installing the kit wheels for Python %s (%s) failed:\n%s\n' "$pyv" "$py" "$log"
        return 1
    fi
    PYTHONPATH="$TXK_COMPANION_PYTHONPATH" "$py" -c 'import importlib.metadata as m, txkernel, jupyter_client, ipykernel
print("devkit_run: companion", txkernel.version(), "from", txkernel.__file__, "with",
      *[f"{p} {m.version(p)}" for p in ("ipykernel", "jupyter_client", "ipython", "pyzmq")])' ||
        { echo "devkit_run: the kit's site does not import (above)"; rm -f "$site/.installed-$pyv"; return 1; }
}

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

# The short step (above); 1 when a check failed, 2 when ldd finds a library
# missing (nothing else runs then).
short_step() {
    local bad=0 f t=${GPU_TEST_TIMEOUT:-300}
    echo "--- info"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    ldd --version | head -n 1
    echo "kit: commit $(cat "$kit/COMMIT" 2>/dev/null || echo unknown)"
    for f in "$TXK_CUDA_PLUGIN" "$kit/build/bench/train_cpu" "$kit/build/bench/attn_gpu" \
             "$kit/build/gpu_tests/gpu_ops" "$kit/build/gpu_tests/gpu_model"; do
        if ldd "$f" 2>&1 | grep 'not found'; then
            echo "devkit_run: short: ldd $f: a library is not found (above): stopping"
            return 2
        fi
    done
    ldd "$TXK_CUDA_PLUGIN" | grep -E 'cublas|cupti|cudart'
    echo "--- gpu_ops: attention"
    TK_TEST_ONLY=attention timeout "$t" "$kit/build/gpu_tests/gpu_ops" || bad=1
    echo "--- gpu_ops: fast vs reference"
    TK_TEST_ONLY=fast_vs_reference timeout "$t" "$kit/build/gpu_tests/gpu_ops" || bad=1
    echo "--- gpu_model: cuBLASLt declines"
    TK_TEST_ONLY=lt_declines timeout "$t" "$kit/build/gpu_tests/gpu_model" || bad=1
    echo "--- attn_gpu"
    timeout "$t" "$kit/build/bench/attn_gpu" --seq 128,512 --dtypes fp16,bf16 --p 0,0.1 --reps 10 || bad=1
    echo "--- the step at 32 x 512 fp16, CUPTI off"
    "$py" bench/train_gpu/run.py "$kit/build" --rows 512xfp16 --no-cupti || bad=1
    return $bad
}

# bench/train_gpu/run.py with the given arguments, logged to $out/$1.
run_bench() {
    local log=$1
    shift
    "$py" bench/train_gpu/run.py "$kit/build" "$@" 2>&1 | tee "$out/$log"
}

rc=0
for s in $steps; do
    echo "=== $s ($(date -u +%FT%TZ))"
    case "$s" in
    short)
        short_step 2>&1 | tee "$out/short.log"
        s_rc=${PIPESTATUS[0]}
        [ "$s_rc" = 0 ] || rc=1
        [ "$s_rc" = 2 ] && break
        ;;
    info)
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
        ldd --version | head -n 1
        echo "kit: commit $(cat "$kit/COMMIT" 2>/dev/null || echo unknown)"
        "$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' || true
        ldd "$TXK_CUDA_PLUGIN" | grep -E 'cublas|cupti|cudart|not found' | tee "$out/info.log"
        ldd "$kit/build/bench/train_cpu" | grep 'not found' && rc=1
        ;;
    companion)
        companion 2>&1 | tee "$out/companion.log" || rc=1
        ;;
    test)
        companion || rc=1
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
        echo "devkit_run: unknown step '$s' (short, info, test, bench, attention, techniques, measure, sanitize, companion)" >&2
        rc=2
        ;;
    esac
done
exit $rc
