#!/usr/bin/env python3
"""The PyTorch side of the per-example memory slope (bench/torch_peers/run.py):
HF transformers' BertForSequenceClassification, built from a config with
random weights (nothing downloaded), one training step (forward, loss,
backward) on the CPU, with PyTorch's own allocator events recorded by
torch.profiler.profile(profile_memory=True).

Each allocation and free is rounded up to a multiple of 512 bytes (below 512:
512), as PyTorch's CUDA caching allocator rounds its requests, so the peak is
the allocated bytes the same step would count on a GPU (less what differs on
one: the CPU's attention dropout mask is a float where CUDA keeps bytes; here
attention dropout is 0, so there is none). The peak counts from the start of
the step: weights and gradients (allocated by a first step's backward, kept by
zero_grad(set_to_none=False)) are live before it and cancel in the slope.

  mem_torch.py --seq 512 --batches 2,4 [--model bert-base-cased] [--attn sdpa|eager] [--threads N]

Prints one JSON line: versions, the attention implementation used, and per
batch the peak (rounded and as requested) over the step; the slope per added
example between the first and the last batch.
"""
import argparse
import json
import time

import torch
import transformers
from torch.profiler import ProfilerActivity, profile

# bert-base-cased's shape (its config.json); the vocabulary only sizes the
# embeddings, which are weights: they cancel in the slope
DIMS = {"bert-base-cased": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                intermediate_size=3072, vocab_size=28996, max_position_embeddings=512)}

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="bert-base-cased", choices=sorted(DIMS))
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--batches", default="2,4")
ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)

cfg = transformers.BertConfig(**DIMS[a.model], num_labels=2, hidden_dropout_prob=0.1,
                              attention_probs_dropout_prob=0.0, attn_implementation=a.attn)
model = transformers.BertForSequenceClassification(cfg).train()
used = getattr(model.config, "_attn_implementation", "eager")
for p in model.parameters():  # the gradients a first step would leave, kept across steps
    p.grad = torch.zeros_like(p)


def round512(n):
    n = abs(n)
    return 0 if n == 0 else max(512, (n + 511) // 512 * 512)


def allocations(prof):
    """(time ns, signed bytes) of every CPU allocation and free in the profile, in order."""
    from torch._C._profiler import _EventType
    out = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and str(e.extra_fields.device) == "cpu":
            out.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    out.sort(key=lambda x: x[0])
    return out


def step_peak(B):
    g = torch.Generator().manual_seed(B)
    ids = torch.randint(1000, cfg.vocab_size, (B, a.seq), generator=g)
    mask = torch.ones(B, a.seq, dtype=torch.long)
    labels = torch.zeros(B, dtype=torch.long)
    t0 = time.time()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model.zero_grad(set_to_none=False)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        del out
    secs = time.time() - t0
    cur = cur_req = peak = peak_req = 0
    ev = allocations(prof)
    for _, n in ev:
        cur += round512(n) if n > 0 else -round512(n)
        cur_req += n
        peak = max(peak, cur)
        peak_req = max(peak_req, cur_req)
    return {"batch": B, "peak_allocated": peak, "peak_requested": peak_req, "events": len(ev),
            "seconds": round(secs, 1)}


rows = [step_peak(int(b)) for b in a.batches.split(",")]
first, last = rows[0], rows[-1]
dB = last["batch"] - first["batch"]
print(json.dumps({"impl": "torch", "torch": torch.__version__, "transformers": transformers.__version__,
                  "model": a.model, "seq": a.seq, "attn_implementation": used, "attention_dropout": 0.0,
                  "rows": rows, "slope": (last["peak_allocated"] - first["peak_allocated"]) / dB,
                  "slope_requested": (last["peak_requested"] - first["peak_requested"]) / dB}))
