#!/usr/bin/env bash
# cuda_plugin.sh — checks of the cuda plugin that need no GPU (make test).
#
# The plugin must be built (CI compiles and links it), export its entry
# points, be self-contained (binaries dlopen it without exporting their own
# symbols), and link the CUDA libraries itself, while txk and txkernel must
# not (they start on machines without CUDA). The GPU test binaries must be
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
exports() { nm -D --defined-only "$so" | awk '{print $3}'; }

check "plugin built" test -f "$so"
for sym in tk_cuda_plugin_open tk_cuda_mem_totals_get tk_cuda_mem_reset_peak tk_cuda_scope_push \
           tk_cuda_scope_pop tk_cuda_scope_kernel_time tk_cuda_nccl_group_new tk_cuda_nccl_group_destroy \
           tk_cuda_nccl_rank tk_cuda_bind_buffers; do
    check "exports $sym" grep -qx "$sym" <(exports)
done
check "no undefined tk_ symbols (self-contained)" bash -c "! nm -D --undefined-only '$so' | grep -q ' tk_'"
check "only the entry points are exported" bash -c "[ \$(nm -D --defined-only '$so' | awk '{print \$3}' | grep -c '^tk_') -eq 10 ]"
check "plugin is NODELETE (survives dlclose)" bash -c "readelf -d '$so' | grep -q 'NODELETE'"
for lib in libcudart libcublas libcupti; do
    check "plugin links $lib" grep -q "^$lib\.so" <(needed "$so")
done
# cuBLASLt is on the link line but reached through libcublas (--as-needed
# drops the direct entry): it must be in the load closure.
check "plugin loads libcublasLt" bash -c "ldd '$so' | grep -q 'libcublasLt\.so'"

for bin in "$B/txk" "$B/txkernel"; do
    check "$(basename "$bin") built" test -x "$bin"
    check "$(basename "$bin") links no CUDA library" \
        bash -c "test -x '$bin' && ! readelf -d '$bin' | grep -Eq 'libcuda|libcublas|libcupti'"
done
for t in gpu_ops gpu_alloc gpu_model; do
    check "GPU test $t built" test -x "$B/gpu_tests/$t"
done
echo "$pass passed, $fail failed"
