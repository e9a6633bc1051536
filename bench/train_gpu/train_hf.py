#!/usr/bin/env python3
"""The HF side of the GPU training benchmark: transformers'
BertForSequenceClassification (random init from a BertConfig with the
preset's sizes, 2 labels) and the step a user's loop runs on the GPU:
zero_grad, forward, cross-entropy, backward, clip_grad_norm_(1.0),
AdamW(lr 2e-5, weight_decay 0.01, no decay on biases and LayerNorm
weights). fp16/bf16 use torch.autocast (fp32 master weights), fp16 with a
GradScaler — the mixed precision txkernel's precision key gives. Same
synthetic batch as train_cpu.c. Times --steps steps after one warm-up, with a
cuda synchronize before each clock read; peak memory is
torch.cuda.max_memory_allocated / max_memory_reserved over the whole run.

  train_hf.py [--model bert-base-uncased] [--batch 32] [--seq 128] [--steps S]
              [--precision fp32|fp16|bf16] [--attn eager|sdpa]

--attn eager is the attention txkernel's `attention: standard` computes
(scores, softmax, dropout, matmul, L x L probabilities kept); sdpa lets torch
pick a fused kernel (FlashAttention or memory-efficient), the counterpart of
`attention: fused`. Prints one JSON line.
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import transformers
from transformers import BertConfig, BertForSequenceClassification

# layers, hidden, heads, intermediate, vocab
PRESETS = {"bert-tiny": (2, 128, 2, 512, 30522), "bert-mini": (4, 256, 4, 1024, 30522),
           "bert-small": (4, 512, 8, 2048, 30522), "bert-medium": (8, 512, 8, 2048, 30522),
           "bert-base-uncased": (12, 768, 12, 3072, 30522), "bert-base-cased": (12, 768, 12, 3072, 28996),
           "bert-large-uncased": (24, 1024, 16, 4096, 30522)}

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="bert-base-uncased")
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
a = ap.parse_args()
assert torch.cuda.is_available(), "train_hf.py needs a GPU"
assert a.model in PRESETS, f"unknown model {a.model} (known: {', '.join(PRESETS)})"
L, H, NH, I, V = PRESETS[a.model]
dev = torch.device("cuda")
torch.manual_seed(1)
cfg = BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, intermediate_size=I,
                 max_position_embeddings=512, num_labels=2)
try:
    m = BertForSequenceClassification._from_config(cfg, attn_implementation=a.attn)
except (TypeError, ValueError, AttributeError):  # older transformers: no attn_implementation
    cfg._attn_implementation = a.attn
    m = BertForSequenceClassification(cfg)
m = m.to(dev).train()
no_decay = [p for n, p in m.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
decay = [p for n, p in m.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=2e-5, eps=1e-8)
B, T = a.batch, a.seq
ids = ((1000 + (torch.arange(B * T) * 7919) % 20000) % V).reshape(B, T).to(dev)
mask = torch.ones(B, T, dtype=torch.long, device=dev)
labels = (torch.arange(B) % 2).to(dev)
dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)
if a.precision != "fp16":
    scaler = None
elif hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
    scaler = torch.amp.GradScaler("cuda")
else:
    scaler = torch.cuda.amp.GradScaler()
torch.cuda.reset_peak_memory_stats()
times = []
for s in range(a.steps + 1):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
        logits = m(input_ids=ids, attention_mask=mask).logits
        loss = nn.functional.cross_entropy(logits.float(), labels)
    if scaler:
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    torch.cuda.synchronize()
    if s:
        times.append(time.perf_counter() - t0)
mean = sum(times) / len(times)
print(json.dumps({"impl": "hf", "torch": torch.__version__, "transformers": transformers.__version__,
                  "device": torch.cuda.get_device_name(), "model": a.model, "batch": B, "seq": T,
                  "precision": a.precision, "attn": a.attn,
                  "attn_impl": getattr(m.config, "_attn_implementation", None), "steps": a.steps,
                  "min_ms": round(min(times) * 1e3, 2), "mean_ms": round(mean * 1e3, 2),
                  "samples_per_s": round(B / mean, 2), "loss": round(loss.item(), 5),
                  "alloc_peak": torch.cuda.max_memory_allocated(), "reserved_peak": torch.cuda.max_memory_reserved()}))
