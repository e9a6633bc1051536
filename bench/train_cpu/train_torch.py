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

import torch
import torch.nn as nn


def rss():
    cur = peak = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return cur, peak


DIMS = {"bert-tiny": (2, 128, 2, 512), "bert-mini": (4, 256, 4, 1024), "bert-small": (4, 512, 8, 2048),
        "bert-medium": (8, 512, 8, 2048), "bert-base-uncased": (12, 768, 12, 3072)}
ap = argparse.ArgumentParser()
ap.add_argument("--model", default="bert-mini")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=5)
a = ap.parse_args()
torch.set_num_threads(a.threads)
L, H, NH, I = DIMS[a.model]
rss0, _ = rss()


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.word, self.pos, self.typ = nn.Embedding(30522, H), nn.Embedding(512, H), nn.Embedding(2, H)
        self.ln = nn.LayerNorm(H, eps=1e-12)
        self.drop = nn.Dropout(0.1)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(H, NH, I, 0.1, activation="gelu", batch_first=True,
                                                               layer_norm_eps=1e-12) for _ in range(L))
        self.pool, self.cls = nn.Linear(H, H), nn.Linear(H, 2)

    def forward(self, ids, pad):
        T = ids.shape[1]
        x = self.word(ids) + self.pos(torch.arange(T))[None] + self.typ(torch.zeros_like(ids))
        x = self.drop(self.ln(x))
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=pad)
        return self.cls(self.drop(torch.tanh(self.pool(x[:, 0]))))


torch.manual_seed(1)
m = Bert().train()
decay = [p for n, p in m.named_parameters() if not (n.endswith("bias") or "norm" in n or n.startswith("ln."))]
no_decay = [p for n, p in m.named_parameters() if n.endswith("bias") or "norm" in n or n.startswith("ln.")]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=2e-5, eps=1e-8)
B, T = a.batch, a.seq
ids = (1000 + (torch.arange(B * T) * 7919) % 20000).reshape(B, T)
pad = torch.zeros(B, T, dtype=torch.bool)
labels = torch.arange(B) % 2
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
