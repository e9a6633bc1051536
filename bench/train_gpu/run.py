#!/usr/bin/env python3
"""GPU training benchmark: txkernel's cuda backend (build/bench/train_cpu
--device cuda) against HF transformers' BertForSequenceClassification on the
same GPU, same model sizes, batch, sequence length and precision, one after
the other in one run. Prints samples/s and peak memory with the ratios
(txkernel / HF: speed above 1 = we are faster, memory below 1 = we use less).
HF runs twice per row: eager attention (what `attention: standard`
computes) and sdpa (torch's fused kernels, the counterpart of
`attention: fused`); txkernel runs standard and fused.

  run.py BUILD_DIR [--models bert-base-uncased] [--batch 32] [--seq 128,512]
                   [--precisions fp32,fp16] [--steps 20]
  run.py BUILD_DIR --techniques [--models bert-base-uncased] ...
  --no-cupti: txkernel without CUPTI tracing (its device-peak column is then
  empty); run with and without to see what the tracing costs.

--techniques: the speed cost on cuda of each memory-saving technique
(issue 5), the txkernel step with each against the same step without, with
the allocator's and CUPTI's peaks.

Memory columns: txkernel's allocator peak reserved (what PyTorch's
max_memory_reserved measures) and, on the txkernel side, CUPTI's device
peak (allocator segments + the cuBLAS workspace + anything a library took).
"""
import argparse
import json
import os
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("--models", default="bert-base-uncased")
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", default="128,512")
ap.add_argument("--precisions", default="fp32,fp16")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--techniques", action="store_true")
ap.add_argument("--no-cupti", action="store_true",
                help="time txkernel with CUPTI tracing off (TXK_CUPTI=0): the cost of the tracing")
a = ap.parse_args()
if a.no_cupti:
    os.environ["TXK_CUPTI"] = "0"
here = os.path.dirname(os.path.abspath(__file__))
txk = os.path.join(a.build, "bench", "train_cpu")
MiB = 1 << 20


def one(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][:120]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def ours(model, B, T, extra):
    return one([txk, "--device", "cuda", "--model", model, "--batch", str(B), "--seq", str(T),
                "--steps", str(a.steps)] + extra)


def hf(model, B, T, prec, attn):
    return one([sys.executable, os.path.join(here, "train_hf.py"), "--model", model, "--batch", str(B),
                "--seq", str(T), "--steps", str(a.steps), "--precision", prec, "--attn", attn])


def cell(r):
    if "error" in r:
        return f"{'error':>9} {'':>9}"
    return f"{r['samples_per_s']:>9.1f} {r['reserved_peak'] / MiB:>7.0f}Mi"


TECHNIQUES = [[], ["recompute=layers"], ["recompute=attention"], ["attention=fused"], ["precision=fp16"],
              ["precision=bf16"], ["optimizer=adamw8bit"], ["freeze_embeddings=true"], ["accumulate=4"],
              ["precision=fp16", "attention=fused"], ["precision=bf16", "recompute=layers", "attention=fused"],
              ["precision=fp16", "recompute=layers", "attention=fused", "optimizer=adamw8bit"]]

if a.techniques:
    for model in a.models.split(","):
        for T in [int(x) for x in a.seq.split(",")]:
            print(f"speed cost of each technique on cuda: {model}, batch {a.batch} x seq {T}, "
                  f"mean of {a.steps} steps after a warm-up")
            print(f"{'technique':<58} {'step':>9} {'samples/s':>10} {'time':>6} {'reserved':>10} {'peak':>6} "
                  f"{'CUPTI peak':>11}")
            base = None
            for tech in TECHNIQUES:
                r = ours(model, a.batch, T, tech)
                name = " + ".join(tech) or "none (fp32, standard attention, AdamW)"
                if "error" in r:
                    print(f"{name:<58} {r['error']}")
                    continue
                base = base or r
                print(f"{name:<58} {r['mean_ms']:>6.1f} ms {r['samples_per_s']:>10.1f} "
                      f"{r['mean_ms'] / base['mean_ms']:>5.2f}x {r['reserved_peak'] / MiB:>7.0f}Mi "
                      f"{r['reserved_peak'] / base['reserved_peak']:>5.2f}x "
                      + (f"{r['device_peak'] / MiB:>8.0f}Mi" if r.get("cupti_active") else f"{'-':>10}"))
            print()
    sys.exit(0)

print(f"training step on the GPU (fwd + bwd + clip + AdamW), batch {a.batch}, mean of {a.steps} steps after a "
      f"warm-up; samples/s and peak reserved (MiB)")
hdr = (f"{'model':<18} {'seq':>4} {'prec':>5} | {'txk std':>19} | {'txk fused':>19} | {'HF eager':>19} | "
       f"{'HF sdpa':>19} | {'std/eager':>9} {'mem':>5} | {'fused/sdpa':>10} {'mem':>5}")
print(hdr)
for model in a.models.split(","):
    for T in [int(x) for x in a.seq.split(",")]:
        for prec in a.precisions.split(","):
            pk = [] if prec == "fp32" else [f"precision={prec}"]
            s = ours(model, a.batch, T, pk)
            f = ours(model, a.batch, T, pk + ["attention=fused"])
            he = hf(model, a.batch, T, prec, "eager")
            hs = hf(model, a.batch, T, prec, "sdpa")

            def ratio(x, y, key):
                return f"{x[key] / y[key]:.2f}x" if "error" not in x and "error" not in y else "-"

            def mem(x, y):
                return f"{x['reserved_peak'] / y['reserved_peak']:.2f}" if "error" not in x and "error" not in y else "-"
            print(f"{model:<18} {T:>4} {prec:>5} | {cell(s)} | {cell(f)} | {cell(he)} | {cell(hs)} | "
                  f"{ratio(s, he, 'samples_per_s'):>9} {mem(s, he):>5} | {ratio(f, hs, 'samples_per_s'):>10} "
                  f"{mem(f, hs):>5}")
            for r in (s, f, he, hs):
                if "error" in r:
                    print("    error:", r["error"])
vers = hs if "error" not in hs else he
if "error" not in vers:
    print(f"device {vers['device']}; torch {vers['torch']}, transformers {vers['transformers']}")
