#!/usr/bin/env python3
"""The torch side of train_cpu.c: the same BERT classifier (post-LN encoder
layers, GELU, pooler tanh, 2-label head, dropout 0.1) and the same training
step on the CPU: zero_grad, forward, cross-entropy, backward,
clip_grad_norm_(1.0), AdamW(lr 2e-5, weight_decay 0.01, no decay on biases and
LayerNorm weights). Same batch, threads and measure (min and mean of --steps
after one warm-up). Prints one JSON line; the peak memory is the process'
peak RSS growth over its RSS after `import torch`, before the model is built.

  train_torch.py [--model bert-mini] [--batch 16] [--seq 128] [--threads N] [--steps S]
"""
import argparse
import json
import time

import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_bert import DIMS, Bert, batch  # noqa: E402


def rss():
    cur = peak = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return cur, peak


ap = argparse.ArgumentParser()
ap.add_argument("--model", default="bert-mini")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=5)
a = ap.parse_args()
torch.set_num_threads(a.threads)
assert a.model in DIMS, f"unknown model {a.model} (known: {', '.join(DIMS)})"
rss0, _ = rss()


torch.manual_seed(1)
m = Bert(a.model).train()
decay = [p for n, p in m.named_parameters() if not (n.endswith("bias") or "norm" in n or n.startswith("ln."))]
no_decay = [p for n, p in m.named_parameters() if n.endswith("bias") or "norm" in n or n.startswith("ln.")]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=2e-5, eps=1e-8)
B, T = a.batch, a.seq
ids, pad, labels = batch(B, T)
times = []
for s in range(a.steps + 1):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    loss = nn.functional.cross_entropy(m(ids, pad), labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    if s:
        times.append(time.perf_counter() - t0)
_, hwm = rss()
mean = sum(times) / len(times)
print(json.dumps({"impl": "torch", "torch": torch.__version__, "model": a.model, "batch": B, "seq": T,
                  "threads": a.threads, "steps": a.steps, "min_ms": round(min(times) * 1e3, 2),
                  "mean_ms": round(mean * 1e3, 2), "samples_per_s": round(B / mean, 2), "loss": round(loss.item(), 5),
                  "rss_growth_peak": max(0, hwm - rss0)}))
