#!/usr/bin/env python3
"""The GEMMs of a BERT training step on the CPU: txkernel's (tk_op_gemm over
OpenBLAS) beside PyTorch's matmul, same shapes, threads and repetitions,
interleaved, median of --runs; GFLOP/s and the ratio txkernel / torch.

The shapes are bert-small's (hidden 512, intermediate 2048) at batch 16 x 128
(2048 rows): Q/K/V/output (512 -> 512), FFN up (512 -> 2048), FFN down
(2048 -> 512). With them it prints what they bound: the step's GEMM work
(forward and backward of every linear layer and the attention products),
the time txkernel's GEMMs alone need for it, and so the most txkernel /
torch a whole step could reach against a given torch step time.

  run.py BUILD_DIR [--torch PY] [--threads 2] [--reps 20] [--runs 3] [--torch-step-s S]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("--torch", default=os.path.join(ROOT, ".venv-t2", "bin", "python"))
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--torch-step-s", type=float, default=None, help="a torch step time to bound the ratio against")
a = ap.parse_args()
env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
sys.path.insert(0, os.path.dirname(HERE))
from fresh import require_fresh  # noqa: E402

exe = require_fresh(a.build, "gemm_cpu")

SHAPES = [(2048, 512, 512), (2048, 512, 2048), (2048, 2048, 512)]


def one(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


rate = {}
print(f"GEMM C = A B^T, fp32, {a.threads} threads, {a.reps} reps after 3 warm-ups, median of {a.runs} runs (GFLOP/s)")
print(f"{'M x K x N':<18} {'txkernel':>9} {'torch':>9} {'txk/torch':>10}   runs")
for m, k, n in SHAPES:
    args = [str(m), str(k), str(n), "--threads", str(a.threads), "--reps", str(a.reps)]
    tx, to = [], []
    version = ""
    for _ in range(a.runs):
        tx.append(one([exe] + args)["gflops"])
        t = one([a.torch, os.path.join(HERE, "gemm_torch.py")] + args)
        to.append(t["gflops"])
        version = t["torch"]
    rate[(m, k, n)] = statistics.median(tx)
    print(f"{m}x{k}x{n:<10} {statistics.median(tx):>9.1f} {statistics.median(to):>9.1f} "
          f"{statistics.median(tx) / statistics.median(to):>9.2f}x   txk {tx}; torch {to}")
print(f"(torch {version})")

# bert-small, batch 16 x 128: per layer Q, K, V, output (2048x512x512 each),
# FFN up and down; attention scores and P V: 16 x 8 heads of 128x64x128 each
L, rows, H, I, heads, T, hs = 4, 2048, 512, 2048, 16 * 8, 128, 64
lin = L * 3 * 2.0 * (4 * rows * H * H + 2 * rows * H * I)  # forward + two backward GEMMs
att = L * 3 * 2.0 * (2 * heads * T * T * hs)
t_lin = L * 3 * 2.0 * (4 * rows * H * H / rate[(2048, 512, 512)] + rows * H * I / rate[(2048, 512, 2048)]
                       + rows * I * H / rate[(2048, 2048, 512)]) / 1e9
t_att = att / rate[(2048, 512, 512)] / 1e9  # at the linear layers' rate: a bound, the small products run slower
print(f"bert-small 16 x 128 step: {lin / 1e9:.1f} GFLOP in linear layers + {att / 1e9:.1f} in attention; "
      f"txkernel's GEMMs alone need at least {t_lin + t_att:.2f} s")
if a.torch_step_s:
    print(f"against a torch step of {a.torch_step_s:.2f} s, txkernel / torch can be at most "
          f"{a.torch_step_s / (t_lin + t_att):.2f}x")
