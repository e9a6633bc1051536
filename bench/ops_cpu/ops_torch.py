#!/usr/bin/env python3
"""The same ops as ops_cpu.c, in PyTorch on the CPU, same shapes, same
threads, same measure (minimum wall time of --reps runs after a warm-up).
Backwards are timed as the autograd kernels torch itself runs for them.

  ops_torch.py [--hidden H] [--batch B] [--seq T] [--threads N] [--reps R]
"""
import argparse
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--hidden", type=int, default=256)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--reps", type=int, default=10)
a = ap.parse_args()
torch.set_num_threads(a.threads)
H, B, T = a.hidden, a.batch, a.seq
I, NH, HS, N = 4 * H, H // 64, 64, B * T


def bench(name, fn, flops=0.0):
    fn()
    best = 1e30
    for _ in range(a.reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    if flops:
        print(f"{name:16s} {best * 1e3:9.3f} ms {flops / best * 1e-9:8.1f} GFLOP/s")
    else:
        print(f"{name:16s} {best * 1e3:9.3f} ms")


print(f"# torch {torch.__version__}: hidden {H}, batch {B} x {T}, {a.threads} thread(s), min of {a.reps}")
x, w, bias = torch.rand(N, H) * 2 - 1, torch.rand(I, H) * 2 - 1, torch.rand(I)
y, dy = torch.rand(N, I) * 2 - 1, torch.rand(N, I) * 2 - 1
q, k = torch.rand(B * NH, T, HS), torch.rand(B * NH, T, HS)
s = torch.rand(B, NH, T, T)
ext = torch.zeros(B, 1, 1, T)
fl, fa = 2.0 * N * H * I, 2.0 * B * NH * T * T * HS
with torch.no_grad():
    bench("linear_fwd", lambda: F.linear(x, w, bias), fl)
    bench("linear_dx", lambda: dy @ w, fl)
    bench("linear_dw", lambda: w.add_(dy.t() @ x), fl)
    bench("attn_qk", lambda: torch.bmm(q, k.transpose(1, 2)), fa)
    bench("gelu_fwd", lambda: F.gelu(y))
    bench("gelu_bwd", lambda: torch.ops.aten.gelu_backward(dy, y))
    sp = torch.softmax(s * 0.125 + ext, -1)
    bench("softmax_fwd", lambda: torch.softmax(s * 0.125 + ext, -1))
    bench("softmax_bwd", lambda: torch.ops.aten._softmax_backward_data(s, sp, -1, torch.float32) * 0.125)
    lw, lb = torch.rand(H), torch.rand(H)
    out, mean, rstd = torch.ops.aten.native_layer_norm(x, [H], lw, lb, 1e-12)
    bench("layernorm_fwd", lambda: torch.ops.aten.native_layer_norm(x, [H], lw, lb, 1e-12))
    bench("layernorm_bwd", lambda: torch.ops.aten.native_layer_norm_backward(
        out, x, [H], mean, rstd, lw, lb, [True, True, True]))
    bench("dropout_fwd", lambda: torch.ops.aten.native_dropout(sp, 0.1, True))
    bench("add", lambda: y + dy)
    bench("bias_grad", lambda: dy.sum(0))
p = torch.rand(11000000)
p.grad = torch.rand(11000000)
opt = torch.optim.AdamW([p], lr=1e-3, foreach=False)
bench("adamw_11M", opt.step)
