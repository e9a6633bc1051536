#!/usr/bin/env bash
# cuda_plugin.sh — checks of the cuda plugin that need no GPU (make test).
#
# The plugin must be built (CI compiles and links it), export its entry
# points, be self-contained (binaries dlopen it without exporting their own
# symbols), carry the CUDA runtime (cudart static) and need no CUDA library
# at load time: cuBLAS, cuBLASLt and CUPTI are opened at run time from CUDA
# 13 or 12 (gpu/cuda/cuda_dynload.c; tests/wheel/test_cuda_libs.py loads
# them), so every call into them goes through cuda_dynload.c's forwarders.
# txk and txkernel must not link CUDA either (they start on machines without
# CUDA). The GPU test binaries must be
# built, so they cannot rot; they only run under `make test-gpu`.
# Last line: "N passed, N failed".
set -u
B=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
pass=0
fail=0
check() { # check NAME COMMAND...
    local name=$1; shift
    if "$@" >/dev/null 2>&1; then pass=$((pass + 1)); echo "ok   $name"
    else fail=$((fail + 1)); echo "FAIL $name"; fi
}
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
    echo "nvcc not found: the cuda plugin is not built on this machine; nothing to check"
    echo "0 passed, 0 failed"
    exit 0
fi
so=$B/libtk_cuda.so
needed() { readelf -d "$1" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'; }
export -f needed
exports() { nm -D --defined-only "$so" | awk '{print $3}'; }

check "plugin built" test -f "$so"
for sym in tk_cuda_plugin_open tk_cuda_mem_totals_get tk_cuda_mem_reset_peak tk_cuda_scope_push \
           tk_cuda_scope_pop tk_cuda_scope_kernel_time tk_cuda_nccl_group_new tk_cuda_nccl_group_destroy \
           tk_cuda_nccl_rank tk_cuda_bind_buffers tk_cuda_set_reference tk_cuda_libs_probe; do
    check "exports $sym" grep -qx "$sym" <(exports)
done
check "no undefined tk_ symbols (self-contained)" bash -c "! nm -D --undefined-only '$so' | grep -q ' tk_'"
check "only the entry points are exported" bash -c "[ \$(nm -D --defined-only '$so' | awk '{print \$3}' | grep -c '^tk_') -eq 12 ]"
check "plugin is NODELETE (survives dlclose)" bash -c "readelf -d '$so' | grep -q 'NODELETE'"
for lib in libcudart libcublas libcupti libcuda libnvidia; do
    check "plugin needs no $lib at load time" bash -c "! needed '$so' | grep -q '^$lib'"
done
check "plugin carries the CUDA runtime (no undefined cuda* symbol)" \
    bash -c "! nm -D --undefined-only '$so' | grep -Eq ' (cuda|__cuda)'"
check "every cuBLAS/cuBLASLt/CUPTI call goes through cuda_dynload.c" \
    bash -c "! nm -D --undefined-only '$so' | grep -Eq ' (cublas|cupti)'"
check "plugin exports no CUDA library symbol (cannot interpose torch's)" \
    bash -c "! nm -D --defined-only '$so' | grep -Eq ' (cublas|cupti|cuda)'"

for bin in "$B/txk" "$B/txkernel"; do
    check "$(basename "$bin") built" test -x "$bin"
    check "$(basename "$bin") links no CUDA library" \
        bash -c "test -x '$bin' && ! readelf -d '$bin' | grep -Eq 'libcuda|libcublas|libcupti'"
done
for t in gpu_ops gpu_alloc gpu_model; do
    check "GPU test $t built" test -x "$B/gpu_tests/$t"
done
echo "$pass passed, $fail failed"
