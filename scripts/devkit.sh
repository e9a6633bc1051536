#!/usr/bin/env bash
# devkit.sh — packs what the GPU checks need into .devkit/ (git-ignored), for
# a GPU machine that has CUDA, python3, torch and transformers but none of
# our C libraries and no package registry (the `device` machines here).
#
#   bash scripts/devkit.sh        builds (make all), then fills .devkit/:
#     .devkit/build/   libtk_cuda.so, gpu_tests/gpu_*, bench/train_cpu, bench/attn_gpu, txk
#     .devkit/lib/     the shared libraries those binaries need that are
#                      neither glibc's nor the compiler's runtime (jansson,
#                      yaml, utf8proc, OpenBLAS with gfortran and quadmath)
#
# Carry .devkit there and run scripts/devkit_run.sh from the repository root.
# The binaries are this machine's build (Debian 12, glibc 2.36, nvcc here):
# they run on any x86-64 Linux with glibc >= 2.36 and a CUDA 13 driver.
# libstdc++, libgcc_s and libgomp are left out on purpose: every machine
# with a host compiler for nvcc has them, and an older copy first on
# LD_LIBRARY_PATH would break the python (torch) processes the bench starts.
set -euo pipefail
cd "$(dirname "$0")/.."

make --no-print-directory all >/dev/null
kit=.devkit
rm -rf "$kit"
mkdir -p "$kit/build/gpu_tests" "$kit/build/bench" "$kit/lib"

bins=""
for f in build/gpu_tests/gpu_*; do
    case "$f" in *.d|*.o) continue ;; esac
    cp "$f" "$kit/build/gpu_tests/"
    bins="$bins $f"
done
cp build/libtk_cuda.so "$kit/build/"
cp build/bench/train_cpu build/bench/attn_gpu "$kit/build/bench/"
bins="$bins build/bench/train_cpu build/bench/attn_gpu"
# txk plans what tests/gpu_cuda/gpu_torchplan.py compares with torch's own CUDA figures
cp build/txk "$kit/build/"
bins="$bins build/txk"

# Every library ldd resolves outside the CUDA toolkit, less the runtime that
# is everywhere. Copied under its soname (the name the loader asks for).
skip='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libutil|libresolv|libgcc_s|libstdc\+\+|libgomp)\.'
for b in $bins; do
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r soname path; do
    case "$path" in /usr/local/cuda*) continue ;; esac
    if printf '%s\n' "$soname" | grep -Eq "$skip"; then continue; fi
    cp -L "$path" "$kit/lib/$soname"
done

bytes=$(du -sb "$kit" | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
echo "devkit: $(ls "$kit/lib" | tr '\n' ' ')"
echo "devkit: $((bytes >> 20)) MiB in $kit, $((tree >> 20)) MiB of tracked files (a device call carries 64 MiB at most)"
if [ $((bytes + tree)) -ge $((60 << 20)) ]; then
    echo "devkit: too large to carry" >&2
    exit 1
fi
