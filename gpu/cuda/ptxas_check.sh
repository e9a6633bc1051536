#!/bin/sh
# ptxas_check.sh LOG — the build check on attention.cu's kernels: reads what
# `nvcc -Xptxas -v` printed while compiling attention.cu (module.mk) and fails,
# naming the kernel and architecture, when a kernel spills (a stack frame or
# spill stores/loads) or uses more registers than its budget:
#   k_attn_mma_fwd, k_attn_mma_dq  168  three 128-thread blocks per SM (65536 registers)
#   k_attn_mma_dq on sm_100, 120   255  two (ptxas spilled it at 168 there; FM_DQ_BLOCKS)
#   k_attn_mma_dkv                 255  two blocks per SM (its dK and dV accumulators)
# Held are the kernels a card runs: on sm_75 the m16n8k8 ones (ILi1ELi0:
# K16 = 0), from sm_80 the m16n8k16 ones. Reported, not held: the m16n8k8
# kernels compiled for sm_80 and newer (TXK_ATTN_KERNEL=sm75, the GPU
# suite's check of T4's path on a newer card, where a spill costs a test
# some time), and the reference kernel (k_attn: f32, any head size), whose
# stack frame is the ABI calls of expf/logf's slow paths.
# Prints one line per architecture with the largest count of each kernel.
log=${1:?usage: ptxas_check.sh PTXAS_LOG}
[ -s "$log" ] || { echo "ptxas_check: $log is empty (was attention.cu compiled with -Xptxas -v?)" >&2; exit 1; }
awk '
/Compiling entry function/ {
    fn = $0; sub(/.*function .\047?/, "", fn); sub(/\047.*/, "", fn)
    arch = $0; sub(/.*for \047/, "", arch); sub(/\047.*/, "", arch)
    kind = fn ~ /k_attn_mma_fwd/ ? "fwd" : fn ~ /k_attn_mma_dq/ ? "dq" : fn ~ /k_attn_mma_dkv/ ? "dkv" : fn ~ /k_attnILi/ ? "reference" : ""
    k8 = fn ~ /k_attn_mma_[a-z]*ILi[0-9]ELi0E/
    held = kind != "" && kind != "reference" && (arch == "sm_75" ? k8 : !k8)
    next
}
kind != "" && /bytes stack frame/ {
    split($0, w, " ")
    if (w[1] + 0 > 0 || w[5] + 0 > 0 || w[9] + 0 > 0) {
        printf "ptxas_check: %s (%s) spills:%s%s\n", fn, arch, $0, held ? "" : " (reported, not held)"
        if (held) { bad = 1; spills[arch]++ }
    }
    next
}
kind != "" && /Used [0-9]+ registers/ {
    r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r); r += 0
    budget = (kind == "fwd" || (kind == "dq" && arch != "sm_100" && arch != "sm_120")) ? 168 : 255
    if (held && r > budget) { printf "ptxas_check: %s (%s) uses %d registers, over its budget of %d\n", fn, arch, r, budget; bad = 1 }
    k = arch " " kind
    if ((held || kind == "reference") && (!(k in most) || r > most[k])) most[k] = r
    seen[arch] = 1; n++
    kind = ""
}
END {
    if (!n) { print "ptxas_check: no attention kernel in the log"; exit 1 }
    for (a in seen)
        printf "ptxas_check: %s most registers of the held kernels: fwd %d/168, dq %d/%d, dkv %d/255 (reference %d); %d of them spill\n", a, most[a " fwd"], most[a " dq"], a == "sm_100" || a == "sm_120" ? 255 : 168, most[a " dkv"], most[a " reference"], spills[a]
    exit bad
}' "$log"
