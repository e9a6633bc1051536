#!/usr/bin/env bash
# devkit_run.sh — the GPU checks from a carried kit (scripts/devkit.sh), run
# from the repository root on the GPU machine. Unpacks .devkit.tar.xz into
# .devkit/ (again whenever the archive is newer), checks that the kit holds
# what the steps need and that the machine has a GPU, naming whatever is
# missing, then runs the steps. Logs go to $OUT (the device tool's folder)
# or bench/out/.
#
#   bash scripts/devkit_run.sh [info] [test] [bench] [techniques] [measure] [sanitize] [companion]
#     info        GPU, driver, glibc, the kit's commit, and which libraries the plugin resolves
#     test        tests/gpu_cuda/run.sh (what `make test-gpu` runs), after `companion`
#     bench       bench/train_gpu/run.py: bert-base 32 x 128/512 fp16/bf16, 512 fp32 and
#                 a batch of real lengths: txkernel (default, standard, fused) vs HF (eager, sdpa), MFU
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
# BENCH_ARGS replaces bench's arguments, TECH_ARGS those of techniques;
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
want="build/libtk_cuda.so build/txk build/bench/train_cpu companion/txkernel/_engine.py companion/txkernel/libtxk.so
      wheels/requirements.txt wheels/PYTHONS"
for src in tests/gpu_cuda/gpu_*.c; do want="$want build/gpu_tests/$(basename "$src" .c)"; done
missing=""
for f in $want; do [ -f "$kit/$f" ] || missing="$missing $f"; done
pipwhl=$(ls -d "$kit"/wheels/pip-*.whl 2>/dev/null | head -n 1)
[ -n "$pipwhl" ] || missing="$missing wheels/pip-*.whl"
[ -z "$missing" ] || die "the kit in $kit lacks:$missing (packed from an older tree? run scripts/devkit.sh again)"
chmod +x "$kit"/build/gpu_tests/gpu_* "$kit/build/bench/train_cpu" "$kit/build/txk" # in case the copy lost the modes
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
        echo "devkit_run: unknown step '$s' (info, test, bench, techniques, measure, sanitize, companion)" >&2
        rc=2
        ;;
    esac
done
exit $rc
