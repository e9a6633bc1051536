#!/usr/bin/env bash
# run.sh BUILD — runs every GPU test binary in BUILD/gpu_tests against the
# plugin BUILD/libtk_cuda.so, then gpu_txwatch.py (the real torch named as a
# holder, and %%txwatch in the python3 kernel against a real CUDA OOM) and
# gpu_torchplan.py (engine: pytorch against torch's own CUDA peaks), and
# prints one closing line "N passed, N failed, N skipped" (the sum of their
# own closing lines, "N passed, N failed" with an optional ", N skipped").
# A test that crashes, prints no closing line, exits non-zero with nothing
# failed, or reports nothing at all (0 passed, 0 failed, 0 skipped) counts
# as one failure. Exit status 1 when anything failed.
#
# Skips are what the tests themselves report, each saying why, and only:
# gpu_data_parallel on a machine with one GPU, gpu_txwatch when the kit has
# no wheel for the machine's Python (scripts/devkit_run.sh), a gpu_torchplan
# bf16 row on a card without bf16. A skip never hides a failure.
#
# A test still running after GPU_TEST_TIMEOUT seconds (300) is stopped and
# counts as a failure, so a hung kernel costs one test, not the whole run.
# The python tests run with TXK_COMPANION_PYTHON (default .venv/bin/python,
# else python3); gpu_txwatch alone with TXK_COMPANION_PYTHONPATH put first
# on PYTHONPATH (devkit_run.sh points it at the kit's jupyter_client,
# ipykernel and companion).
set -u
build=${1:-build}
export TXK_CUDA_PLUGIN="$(cd "$build" && pwd)/libtk_cuda.so"
passed=0
failed=0
skipped=0

# tally NAME SECONDS ALWAYS_SHOW -- COMMAND...: runs it under the timeout,
# adds its closing line to the totals and prints one line for it, with the
# end of its output when it failed or skipped (or ALWAYS_SHOW is 1).
tally() {
    local name=$1 show=$2 start out rc line p f s
    shift 3
    start=$(date +%s)
    out=$(timeout "${GPU_TEST_TIMEOUT:-300}" "$@" 2>&1)
    rc=$?
    if [ "$rc" -eq 124 ]; then out="$out
$name: stopped after ${GPU_TEST_TIMEOUT:-300} s"; fi
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' | tail -n 1)
    if [ -z "$line" ]; then
        p=0; f=1; s=0
    else
        p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
        case "$line" in *skipped) s=${line##*failed, }; s=${s%% skipped} ;; *) s=0 ;; esac
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
        if [ $((p + f + s)) -eq 0 ]; then f=1; out="$out
$name: ran nothing"; fi
    fi
    echo "$name: $p passed, $f failed, $s skipped ($(( $(date +%s) - start ))s)"
    if [ "$show" = 1 ]; then
        printf '%s\n' "$out" | grep -v -E '^[0-9]+ passed' | sed 's/^/    /'
    elif [ "$f" -ne 0 ] || [ "$s" -ne 0 ]; then
        printf '%s\n' "$out" | tail -n 40 | sed 's/^/    /'
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
}

for t in "$build"/gpu_tests/gpu_*; do
    case "$t" in *.d|*.o) continue ;; esac
    [ -x "$t" ] || continue
    tally "$(basename "$t")" 0 -- "$t"
done
py=${TXK_COMPANION_PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
# %%txwatch against the real torch's OOM
tally gpu_txwatch 0 -- env PYTHONPATH="${TXK_COMPANION_PYTHONPATH:-}${TXK_COMPANION_PYTHONPATH:+${PYTHONPATH:+:}}${PYTHONPATH:-}" \
    "$py" tests/gpu_cuda/gpu_txwatch.py
# engine: pytorch against torch.cuda.max_memory_allocated() of the same step (issues 26, 33)
tally gpu_torchplan 1 -- "$py" tests/gpu_cuda/gpu_torchplan.py "$build"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
