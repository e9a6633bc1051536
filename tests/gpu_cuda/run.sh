#!/usr/bin/env bash
# run.sh BUILD — runs every GPU test binary in BUILD/gpu_tests against the
# plugin BUILD/libtk_cuda.so and prints one closing line "N passed, N failed"
# (the sum of the binaries' own lines; a binary that crashes or prints no
# closing line counts as one failure). Exit status 1 when anything failed.
# A binary still running after GPU_TEST_TIMEOUT seconds (300) is stopped and
# counts as a failure, so a hung kernel costs one binary, not the whole run.
# Then gpu_txwatch.py: the real torch named as a holder, and %%txwatch in the
# python3 kernel against a real CUDA OOM.
set -u
build=${1:-build}
export TXK_CUDA_PLUGIN="$(cd "$build" && pwd)/libtk_cuda.so"
passed=0
failed=0
for t in "$build"/gpu_tests/gpu_*; do
    case "$t" in *.d|*.o) continue ;; esac
    [ -x "$t" ] || continue
    start=$(date +%s)
    out=$(timeout "${GPU_TEST_TIMEOUT:-300}" "$t" 2>&1)
    rc=$?
    if [ "$rc" -eq 124 ]; then out="$out
$(basename "$t"): stopped after ${GPU_TEST_TIMEOUT:-300} s"; fi
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then
        p=0; f=1
    else
        p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    fi
    echo "$(basename "$t"): $p passed, $f failed ($(( $(date +%s) - start ))s)"
    if [ "$f" -ne 0 ]; then printf '%s\n' "$out" | tail -n 40 | sed 's/^/    /'; fi
    passed=$((passed + p))
    failed=$((failed + f))
done
# %%txwatch against the real torch's OOM (skips, saying why, without a CUDA torch)
py=${TXK_COMPANION_PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
out=$(timeout "${GPU_TEST_TIMEOUT:-300}" "$py" tests/gpu_cuda/gpu_txwatch.py 2>&1)
line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
if [ -z "$line" ]; then p=0; f=1; else p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}; fi
echo "gpu_txwatch: $p passed, $f failed"
if [ "$f" -ne 0 ] || [ "$p" -eq 0 ]; then printf '%s\n' "$out" | tail -n 40 | sed 's/^/    /'; fi
passed=$((passed + p))
failed=$((failed + f))
# engine: pytorch against torch.cuda.max_memory_allocated() of the same step (issue 26)
out=$(timeout "${GPU_TEST_TIMEOUT:-300}" "$py" tests/gpu_cuda/gpu_torchplan.py "$build" 2>&1)
line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
if [ -z "$line" ]; then p=0; f=1; else p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}; fi
echo "gpu_torchplan: $p passed, $f failed"
printf '%s\n' "$out" | grep -v -E '^[0-9]+ passed' | sed 's/^/    /'
passed=$((passed + p))
failed=$((failed + f))
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
