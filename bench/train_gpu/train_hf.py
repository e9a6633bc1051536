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
              [--precision fp32|fp16|bf16] [--attn eager|sdpa] [--tf32]
              [--data FILE.csv --vocab vocab.txt] [--device cuda|cpu]

--data: the file's first (S + 1) * batch examples in file order (text and
label columns; the labels sorted, as txkernel numbers them), tokenized by
BertTokenizerFast from --vocab (lower-cased), truncated to --seq, each batch
padded to its longest by DataCollatorWithPadding with its attention mask:
what train_cpu --data runs, here as a transformers user writes it. Dropout
is BertConfig's (0.1, attention probabilities included).
--tf32: lets fp32 matmuls use TF32 (torch.backends.cuda.matmul.allow_tf32);
off by default, as txkernel's tf32 key. --device cpu: a dry run of this
script on the CPU (the bench's own check; no timing worth reading).

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
ap.add_argument("--tf32", action="store_true")
ap.add_argument("--data")
ap.add_argument("--vocab")
ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
a = ap.parse_args()
cuda = a.device == "cuda"
assert not cuda or torch.cuda.is_available(), "train_hf.py needs a GPU (--device cpu: a dry run)"
assert a.model in PRESETS, f"unknown model {a.model} (known: {', '.join(PRESETS)})"
assert bool(a.data) == bool(a.vocab), "--data and --vocab go together"
L, H, NH, I, V = PRESETS[a.model]
dev = torch.device(a.device)
torch.backends.cuda.matmul.allow_tf32 = a.tf32
torch.backends.cudnn.allow_tf32 = a.tf32
torch.manual_seed(1)
B, T = a.batch, a.seq
batches = None
num_labels = 2
if a.data:
    import csv
    from transformers import BertTokenizerFast, DataCollatorWithPadding
    with open(a.data, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    label_names = sorted({r["label"] for r in rows})
    num_labels = len(label_names)
    need = (a.steps + 1) * B
    assert len(rows) >= need, f"{a.data} has {len(rows)} examples, {a.steps + 1} steps of {B} need {need}"
    tok = BertTokenizerFast(vocab_file=a.vocab, do_lower_case=True)
    collate = DataCollatorWithPadding(tok)
    feats = [dict(tok(r["text"], truncation=True, max_length=T), labels=label_names.index(r["label"]))
             for r in rows[:need]]
    batches = [{k: v.to(dev) for k, v in collate(feats[i * B:(i + 1) * B]).items()} for i in range(a.steps + 1)]
cfg = BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, intermediate_size=I,
                 max_position_embeddings=512, num_labels=num_labels)
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
ids = ((1000 + (torch.arange(B * T) * 7919) % 20000) % V).reshape(B, T).to(dev)
mask = torch.ones(B, T, dtype=torch.long, device=dev)
labels = (torch.arange(B) % 2).to(dev)
dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)
if a.precision != "fp16" or not cuda:
    scaler = None
elif hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
    scaler = torch.amp.GradScaler("cuda")
else:
    scaler = torch.cuda.amp.GradScaler()
sync = torch.cuda.synchronize if cuda else (lambda: None)
if cuda:
    torch.cuda.reset_peak_memory_stats()
times, seq_lens, tokens = [], [], 0
for s in range(a.steps + 1):
    if batches:
        ids, mask, labels = batches[s]["input_ids"], batches[s]["attention_mask"], batches[s]["labels"]
    sync()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    with torch.autocast(a.device, dtype=dtype, enabled=dtype is not None):
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
    sync()
    if s:
        times.append(time.perf_counter() - t0)
        seq_lens.append(int(ids.shape[1]))
        tokens += int(mask.sum())
mean = sum(times) / len(times)
n_body = sum(p.numel() for n, p in m.named_parameters() if not n.startswith("bert.embeddings."))
print(json.dumps({"impl": "hf", "torch": torch.__version__, "transformers": transformers.__version__,
                  "device": torch.cuda.get_device_name() if cuda else "cpu", "model": a.model, "batch": B, "seq": T,
                  "tf32": a.tf32, "n_body": n_body, "seq_lens": seq_lens, "tokens": tokens,
                  "precision": a.precision, "attn": a.attn,
                  "attn_impl": getattr(m.config, "_attn_implementation", None), "steps": a.steps,
                  "min_ms": round(min(times) * 1e3, 2), "mean_ms": round(mean * 1e3, 2),
                  "samples_per_s": round(B / mean, 2), "loss": round(loss.item(), 5),
                  "alloc_peak": torch.cuda.max_memory_allocated() if cuda else 0,
                  "reserved_peak": torch.cuda.max_memory_reserved() if cuda else 0}))
