#!/usr/bin/env python3
"""The torch side of step_cpu.c: the same BERT classifier (post-LN encoder
layers, GELU, pooler tanh, 2-label head, dropout 0.1), forward + backward per
step on the CPU, same batch, threads and measure (min and mean of --steps
after one warm-up). transformers is not installed, so the layers are written
with torch.nn (nn.TransformerEncoderLayer computes BERT's layer).

  step_torch.py [--model bert-mini] [--batch B] [--seq T] [--threads N] [--steps S]
"""
import argparse
import time

import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_bert import DIMS, Bert, batch  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="bert-mini")
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=5)
a = ap.parse_args()
torch.set_num_threads(a.threads)
assert a.model in DIMS, f"unknown model {a.model} (known: {', '.join(DIMS)})"


torch.manual_seed(1)
m = Bert(a.model).train()
B, T = a.batch, a.seq
ids, pad, labels = batch(B, T)
times = []
for s in range(a.steps + 1):
    t0 = time.perf_counter()
    m.zero_grad(set_to_none=False)
    loss = nn.functional.cross_entropy(m(ids, pad), labels)
    loss.backward()
    if s:
        times.append(time.perf_counter() - t0)
best = min(times)
print(f"torch {a.model} fwd+bwd B={B} T={T} threads={a.threads}: min {best * 1e3:.1f} ms, "
      f"mean {sum(times) / len(times) * 1e3:.1f} ms, {B / best:.1f} seq/s (loss {loss.item():.4f})")
