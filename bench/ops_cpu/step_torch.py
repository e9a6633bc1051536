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

import torch
import torch.nn as nn

DIMS = {"bert-tiny": (2, 128, 2, 512), "bert-mini": (4, 256, 4, 1024), "bert-small": (4, 512, 8, 2048),
        "bert-medium": (8, 512, 8, 2048), "bert-base-uncased": (12, 768, 12, 3072)}
ap = argparse.ArgumentParser()
ap.add_argument("--model", default="bert-mini")
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=5)
a = ap.parse_args()
torch.set_num_threads(a.threads)
L, H, NH, I = DIMS[a.model]


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
B, T = a.batch, a.seq
ids = (1000 + (torch.arange(B * T) * 7919) % 20000).reshape(B, T)
pad = torch.zeros(B, T, dtype=torch.bool)
labels = torch.arange(B) % 2
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
