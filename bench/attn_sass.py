#!/usr/bin/env python3
"""attn_sass.py — what the tensor-core attention kernels cost in machine code,
read from the built plugin (or an object) without a GPU.

  python3 bench/attn_sass.py [FILE] [--arch sm_80 sm_90] [--all]

FILE is build/libtk_cuda.so by default (an nvcc object of attention.cu works
too). For each architecture it disassembles FILE's SASS (cuobjdump -sass) and
prints, per attention kernel (forward, dQ, dK/dV; f16 and bf16; head size 64
and 16; sm75's m16n8k8 path), its static instruction count (NOPs left out),
its HMMA count, the MUFU.EX2 count, and the instructions of its main loop (the
body of the loop that walks key or query tiles: the kernel's widest
backward branch and its target). Then one line per
architecture: the tile triple (fwd + dQ + dK/dV at head size 64, f16, the
m16n8k16 path). Every kernel's loop body is exactly one 64 x 64 tile (the
kernels unroll it whole), so that line is the issue's "instructions per tile
triple" (sm_75: the m16n8k8 path, its only one): the proxy for speed until a card measures it (bench/RESULTS.md).

cuobjdump comes from $CUOBJDUMP, PATH, $CUDA_HOME/bin or /usr/local/cuda/bin,
or PyPI's nvidia-cuda-cuobjdump wheel (nvidia/cu13/bin/cuobjdump under any
sys.path entry or under --tools DIR, e.g. a `pip install --target DIR`).
nvdisasm (nvidia-cuda-nvdisasm) is not needed: cuobjdump -sass prints the
same instructions.
"""
import argparse, glob, os, re, shutil, subprocess, sys

KERNEL = re.compile(r"_Z\d+(k_attn_mma_(?:fwd|dq|dkv))ILi(\d)ELi(\d)ELi(\d+)EEv10tk_fm_args")
INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
DT = {"1": "f16", "2": "bf16"}


def find_tool(name, extra):
    env = os.environ.get(name.upper())
    if env:
        return env
    hit = shutil.which(name)
    if hit:
        return hit
    dirs = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin"), "/usr/local/cuda/bin"]
    for root in list(extra) + sys.path:
        dirs += glob.glob(os.path.join(root, "nvidia", "*", "bin")) + glob.glob(os.path.join(root, "nvidia", "cuda_*", "bin"))
    for d in dirs:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    sys.exit(f"attn_sass: {name} not found ($%s, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, nvidia/*/bin under "
             f"sys.path or --tools): pip install --target DIR nvidia-cuda-{name[:-4] if name.endswith('dump') else name}"
             f" and pass --tools DIR" % name.upper())


def functions(sass):
    """{mangled name: [(offset, opcode, operands), ...]} from cuobjdump -sass."""
    out, cur = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = INSN.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def loop_body(insns):
    """Instructions of the widest loop (a backward branch and its target):
    the walk over key or query tiles, which holds every other loop."""
    best = None
    for off, op, args in insns:
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", args)
            if m and int(m.group(1), 16) < off and (not best or off - int(m.group(1), 16) > best[1] - best[0]):
                best = (int(m.group(1), 16), off)
    if not best:
        return []
    return [x for x in insns if best[0] <= x[0] <= best[1] and x[1] != "NOP"]


def count(insns):
    real = [x for x in insns if x[1] != "NOP"]
    return {"insns": len(real), "hmma": sum(x[1].startswith("HMMA") for x in real),
            "ex2": sum(x[1] == "MUFU.EX2" for x in real), "loop": len(loop_body(insns)),
            "loop_hmma": sum(x[1].startswith("HMMA") for x in loop_body(insns))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", nargs="?", default="build/libtk_cuda.so")
    ap.add_argument("--arch", nargs="+", default=["sm_80", "sm_90"])
    ap.add_argument("--tools", action="append", default=[], help="a folder with nvidia/cu13/bin (pip --target)")
    ap.add_argument("--all", action="store_true", help="every dtype, head size and path, not only the f16 HS 64 rows")
    a = ap.parse_args()
    if not os.path.exists(a.file):
        sys.exit(f"attn_sass: {a.file}: no such file (build it: make build/libtk_cuda.so)")
    tool = find_tool("cuobjdump", a.tools)
    print(f"attn_sass: {a.file}, {tool}")
    rc = 0
    for arch in a.arch:
        r = subprocess.run([tool, "-sass", "-arch", arch, a.file], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"attn_sass: {tool} -sass -arch {arch} {a.file} failed: {r.stderr.strip()}")
        rows = {}
        for name, insns in functions(r.stdout).items():
            m = KERNEL.search(name)
            if m:
                kind, dt, k16, hs = m.groups()
                rows[(kind, DT.get(dt, dt), "m16n8k16" if k16 == "1" else "m16n8k8", int(hs))] = count(insns)
        if not rows:
            print(f"{arch}: no attention kernels in {a.file}")
            rc = 1
            continue
        print(f"\n{arch}\n| kernel | dtype | path | HS | instructions | HMMA | MUFU.EX2 | loop body | loop HMMA |")
        print("|---|---|---|---|---|---|---|---|---|")
        order = {"k_attn_mma_fwd": 0, "k_attn_mma_dq": 1, "k_attn_mma_dkv": 2}
        for key in sorted(rows, key=lambda k: (-k[3], k[2] != "m16n8k16", k[1], order[k[0]])):
            if not a.all and (key[1], key[2], key[3]) != ("f16", "m16n8k8" if arch == "sm_75" else "m16n8k16", 64):
                continue
            c = rows[key]
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {c['insns']} | {c['hmma']} | {c['ex2']} | "
                  f"{c['loop']} | {c['loop_hmma']} |")
        path = "m16n8k8" if arch == "sm_75" else "m16n8k16"  # sm_75's m16n8k16 kernels only trap
        trip = [rows.get((k, "f16", path, 64)) for k in order]
        if all(trip):
            print(f"{arch} tile triple (fwd + dQ + dK/dV loop bodies, HS 64 f16 {path}): {sum(c['loop'] for c in trip)} "
                  f"instructions, {sum(c['loop_hmma'] for c in trip)} HMMA; whole kernels "
                  f"{sum(c['insns'] for c in trip)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
