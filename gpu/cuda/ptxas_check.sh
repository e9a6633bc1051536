#!/bin/sh
# ptxas_check.sh LOG — the build check on attention.cu's kernels: reads what
# `nvcc -Xptxas -v` printed while compiling attention.cu (module.mk) and fails,
# naming the kernel and architecture, when a kernel spills (a stack frame or
# spill stores/loads) or uses more registers than its budget:
#   k_attn_mma_fwd, k_attn_mma_dq  168  three 128-thread blocks per SM (65536 registers)
#   k_attn_mma_dkv                 255  two blocks per SM (its dK and dV accumulators)
# The reference kernel (k_attn: f32, any head size) is reported, not held:
# its stack frame is the ABI calls of expf/logf's slow paths, and it is not
# the path a step's speed depends on.
# Prints one line per architecture with the largest count of each kernel.
log=${1:?usage: ptxas_check.sh PTXAS_LOG}
[ -s "$log" ] || { echo "ptxas_check: $log is empty (was attention.cu compiled with -Xptxas -v?)" >&2; exit 1; }
awk '
/Compiling entry function/ {
    fn = $0; sub(/.*function .\047?/, "", fn); sub(/\047.*/, "", fn)
    arch = $0; sub(/.*for \047/, "", arch); sub(/\047.*/, "", arch)
    kind = fn ~ /k_attn_mma_fwd/ ? "fwd" : fn ~ /k_attn_mma_dq/ ? "dq" : fn ~ /k_attn_mma_dkv/ ? "dkv" : fn ~ /k_attnILi/ ? "reference" : ""
    next
}
kind != "" && /bytes stack frame/ {
    split($0, w, " ")
    if (kind != "reference" && (w[1] + 0 > 0 || w[5] + 0 > 0 || w[9] + 0 > 0)) {
        printf "ptxas_check: %s (%s) spills:%s\n", fn, arch, $0; bad = 1; spills[arch]++
    }
    next
}
kind != "" && /Used [0-9]+ registers/ {
    r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r); r += 0
    budget = (kind == "fwd" || kind == "dq") ? 168 : 255
    if (kind != "reference" && r > budget) { printf "ptxas_check: %s (%s) uses %d registers, over its budget of %d\n", fn, arch, r, budget; bad = 1 }
    k = arch " " kind
    if (!(k in most) || r > most[k]) most[k] = r
    seen[arch] = 1; n++
    kind = ""
}
END {
    if (!n) { print "ptxas_check: no attention kernel in the log"; exit 1 }
    for (a in seen)
        printf "ptxas_check: %s most registers: fwd %d/168, dq %d/168, dkv %d/255 (reference %d); %d tensor-core kernels spill\n", a, most[a " fwd"], most[a " dq"], most[a " dkv"], most[a " reference"], spills[a]
    exit bad
}' "$log"
