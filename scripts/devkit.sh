#!/usr/bin/env bash
# devkit.sh — packs what the GPU checks need into one compressed archive,
# .devkit.tar.xz (git-ignored), for a GPU machine that has CUDA, python3,
# torch and transformers but none of our C libraries, no jupyter_client and
# no package registry (the `device` machines here: Ubuntu, glibc 2.39,
# Python 3.12). scripts/devkit_run.sh unpacks it there into .devkit/.
#
#   bash scripts/devkit.sh
#     builds exactly what it packs (not `make all`: the ASan library and the
#     CPU test binaries are minutes of build the kit does not carry), then:
#     build/      libtk_cuda.so, gpu_tests/gpu_*, bench/train_cpu, txk
#     lib/        the shared libraries those binaries and libtxk.so need that
#                 are neither glibc's nor the compiler's runtime (jansson,
#                 yaml, utf8proc, curl's, OpenBLAS with gfortran and quadmath)
#     companion/  python/txkernel with its engine, libtxk.so, beside it
#     wheels/     the Colab kernel stack the companion is tested against
#                 (scripts/deps.sh's COLAB_PINS, less `wheel`) with every
#                 dependency, as wheels for each Python in DEVKIT_PYTHONS
#                 (default 3.12, the device machines' python3), plus pip's
#                 own wheel, which installs them there without a pip of its own
#
# The binaries are this machine's build (glibc here, nvcc here): they run on
# any x86-64 Linux with at least this glibc and a CUDA 13 driver. The wheels
# are held to the same glibc (manylinux_2_5 .. manylinux_2_<this glibc>), so
# the kit as a whole needs no more than its binaries do. pip matches a
# manylinux tag exactly, so every tag up to that glibc is named.
# libstdc++, libgcc_s and libgomp are left out on purpose: every machine
# with a host compiler for nvcc has them, and an older copy first on
# LD_LIBRARY_PATH would break the python (torch) processes the bench starts.
#
# The wheels are downloaded once (PyPI) into build/devkit/wheels/ and reused
# while the pins, the Pythons and the glibc stay the same. The archive plus
# the tracked files must stay under 60 MiB: a device call carries 64 MiB at
# most (name .devkit.tar.xz in its `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "devkit: $*" >&2; exit 1; }

pythons=${DEVKIT_PYTHONS:-3.12}
pins=$(sed -n 's/^COLAB_PINS="\(.*\)"$/\1/p' scripts/deps.sh | tr ' ' '\n' | grep -v '^wheel$' | paste -sd ' ')
[ -n "$pins" ] || die "scripts/deps.sh has no COLAB_PINS=\"...\" line (the companion's kernel stack to carry)"
glibc=$(ldd --version 2>/dev/null | sed -n '1s/.* \([0-9][0-9]*\.[0-9][0-9]*\)$/\1/p')
[ -n "$glibc" ] || die "cannot read this machine's glibc version from ldd --version"
pip_py=$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 ) || die "no python3 here to run pip download"

# ---- build what the kit carries
jobs=$(nproc 2>/dev/null || echo 1)
make --no-print-directory -j"$jobs" build/libtk_cuda.so build-gpu-tests build/bench/train_cpu build/txk \
    build/libtxk.so >/dev/null || die "make failed (run it without >/dev/null to see why)"
tests=$(ls build/gpu_tests/gpu_* 2>/dev/null | grep -vE '\.(d|o)$' || true)
missing=""
for f in build/libtk_cuda.so build/bench/train_cpu build/txk build/libtxk.so; do
    [ -f "$f" ] || missing="$missing $f"
done
[ -n "$tests" ] || missing="$missing build/gpu_tests/gpu_*"
[ -z "$missing" ] || die "not built:$missing (the cuda plugin and GPU tests need nvcc: PATH or /usr/local/cuda/bin)"

# ---- the companion's wheels, once per (pins, Pythons, glibc)
wheels=build/devkit/wheels
key="pins: $pins; pythons: $pythons; glibc: $glibc"
if [ "$(cat "$wheels/.key" 2>/dev/null)" != "$key" ]; then
    rm -rf "$wheels"
    mkdir -p "$wheels"
    minor=${glibc#*.}
    plats="--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64"
    for n in $(seq 5 "$minor"); do plats="$plats --platform manylinux_2_${n}_x86_64"; done
    for v in $pythons; do
        echo "devkit: downloading $pins and their dependencies for Python $v (manylinux up to glibc $glibc)"
        # shellcheck disable=SC2086
        "$pip_py" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version "$v" \
            --implementation cp $plats -d "$wheels" $pins pip ||
            die "pip could not download wheels for Python $v (needs PyPI once; above is what it said)"
    done
    printf '%s\n' $pins > "$wheels/requirements.txt"
    printf '%s\n' $pythons > "$wheels/PYTHONS"
    echo "$key" > "$wheels/.key"
fi
# the set is complete: each Python resolves it from these files alone (a
# dry run; pip takes --python-version only with a --target, left empty)
dry=$(mktemp -d)
trap 'rm -rf "$dry"' EXIT
for v in $pythons; do
    out=$("$pip_py" -m pip install --dry-run --disable-pip-version-check --no-index --find-links "$wheels" \
        --only-binary=:all: --python-version "$v" --implementation cp --target "$dry" \
        -r "$wheels/requirements.txt" 2>&1) ||
        die "the wheels in $wheels do not resolve for Python $v without an index (rm -rf $wheels and run again): $out"
done

# ---- the kit
stage=build/devkit/kit
rm -rf "$stage"
mkdir -p "$stage/build/gpu_tests" "$stage/build/bench" "$stage/lib" "$stage/companion/txkernel" "$stage/wheels"
cp $tests "$stage/build/gpu_tests/"
cp build/libtk_cuda.so build/txk "$stage/build/"
cp build/bench/train_cpu "$stage/build/bench/"
cp python/txkernel/*.py build/libtxk.so "$stage/companion/txkernel/"
cp "$wheels"/*.whl "$wheels/requirements.txt" "$wheels/PYTHONS" "$stage/wheels/"
{ git rev-parse HEAD 2>/dev/null || echo unknown; } | tr -d '\n' > "$stage/COMMIT"
git diff --quiet HEAD 2>/dev/null || echo " with uncommitted changes" >> "$stage/COMMIT"

# Every library ldd resolves outside the CUDA toolkit, less the runtime that
# is everywhere. Copied under its soname (the name the loader asks for).
skip='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libutil|libresolv|libgcc_s|libstdc\+\+|libgomp)\.'
bins="$tests build/bench/train_cpu build/txk build/libtxk.so"
for b in $bins; do
    lacks=$(ldd "$b" | grep 'not found' | tr '\n' ' ' || true)
    [ -z "$lacks" ] || die "$b needs what this machine lacks: $lacks"
done
for b in $bins; do
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r soname path; do
    case "$path" in /usr/local/cuda*) continue ;; esac
    if printf '%s\n' "$soname" | grep -Eq "$skip"; then continue; fi
    cp -L "$path" "$stage/lib/$soname"
done

archive=.devkit.tar.xz
rm -f "$archive"
tar cJf "$archive" -C "$stage" .
raw=$(du -sb "$stage" | cut -f1)
bytes=$(du -sb "$archive" | cut -f1)
tree=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
echo "devkit: lib/ $(ls "$stage/lib" | tr '\n' ' ')"
echo "devkit: wheels/ $(ls "$stage/wheels" | grep -c '\.whl$') wheels for Python $pythons ($(du -sb "$stage/wheels" | cut -f1) bytes)"
echo "devkit: $archive $bytes bytes ($raw unpacked) + $tree bytes of tracked files = $((bytes + tree)) of at most $((60 << 20))"
echo "devkit: carry it with the tree (device run: carry [\"$archive\"]), then: bash scripts/devkit_run.sh info test"
if [ $((bytes + tree)) -gt $((60 << 20)) ]; then
    die "too large to carry: $((bytes + tree)) bytes > 60 MiB"
fi
