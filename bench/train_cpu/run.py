#!/usr/bin/env python3
"""Runs train_cpu (txkernel) and train_torch.py (PyTorch) one after the other
for each model, same batch, sequence length, threads and step count, and
prints a table with the ratios: samples/s (txkernel / torch, above 1 = we are
faster) and peak memory (txkernel / torch, below 1 = we use less).

  run.py BUILD_DIR [--models bert-mini,bert-small] [--batch 16] [--seq 128] [--threads N] [--steps S]
  run.py BUILD_DIR --techniques [--models bert-mini] ...

--techniques: the speed cost of each memory-saving technique instead: the
txkernel step with each technique (and a few combinations) against the same
step without, with its peak allocated bytes.
"""
import argparse
import json
import os
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("--models", default="bert-mini,bert-small")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--techniques", action="store_true")
a = ap.parse_args()
env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(here))
from fresh import require_fresh  # noqa: E402

require_fresh(a.build, "train_cpu")


def one(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


MiB = 1 << 20
TECHNIQUES = [[], ["recompute=layers"], ["recompute=attention"], ["attention=fused"], ["precision=fp16"],
              ["precision=bf16"], ["optimizer=adamw8bit"], ["freeze_embeddings=true"], ["accumulate=4"],
              ["precision=fp16", "attention=fused"], ["precision=bf16", "recompute=layers", "attention=fused"],
              ["precision=fp16", "recompute=layers", "attention=fused", "optimizer=adamw8bit"]]
if a.techniques:
    print(f"speed cost of each technique: training step (fwd + bwd + clip + AdamW), batch {a.batch} x seq {a.seq}, "
          f"{a.threads} threads, mean of {a.steps} steps after a warm-up")
    for model in a.models.split(","):
        base = None
        print(f"{model:<11} {'technique':<58} {'step':>9} {'samples/s':>10} {'time':>6} {'peak alloc':>11} {'peak':>6}")
        for tech in TECHNIQUES:
            args = ["--model", model, "--batch", str(a.batch), "--seq", str(a.seq), "--threads", str(a.threads),
                    "--steps", str(a.steps)] + tech
            c = one([os.path.join(a.build, "bench", "train_cpu")] + args)
            base = base or c
            print(f"{'':<11} {' + '.join(tech) or 'none (fp32, standard attention, AdamW)':<58} {c['mean_ms']:>6.1f} ms "
                  f"{c['samples_per_s']:>10.1f} {c['mean_ms'] / base['mean_ms']:>5.2f}x "
                  f"{c['alloc_peak'] / MiB:>7.1f} MiB {c['alloc_peak'] / base['alloc_peak']:>5.2f}x")
    sys.exit(0)
print(f"training step (fwd + bwd + clip + AdamW), batch {a.batch} x seq {a.seq}, {a.threads} threads, "
      f"mean of {a.steps} steps after a warm-up")
print(f"{'model':<11} {'txkernel':>22} {'torch':>22} {'speed':>7}   {'peak txk (alloc/RSS)':>22} "
      f"{'peak torch RSS':>15} {'mem':>6}")
for model in a.models.split(","):
    args = ["--model", model, "--batch", str(a.batch), "--seq", str(a.seq), "--threads", str(a.threads),
            "--steps", str(a.steps)]
    c = one([os.path.join(a.build, "bench", "train_cpu")] + args)
    t = one([sys.executable, os.path.join(here, "train_torch.py")] + args)
    speed = c["samples_per_s"] / t["samples_per_s"]
    mem = c["rss_growth_peak"] / t["rss_growth_peak"] if t["rss_growth_peak"] else float("nan")
    print(f"{model:<11} {c['mean_ms']:>8.1f} ms {c['samples_per_s']:>6.1f} s/s "
          f"{t['mean_ms']:>8.1f} ms {t['samples_per_s']:>6.1f} s/s {speed:>6.2f}x   "
          f"{c['alloc_peak'] / MiB:>8.1f} / {c['rss_growth_peak'] / MiB:>7.1f} MiB {t['rss_growth_peak'] / MiB:>11.1f} MiB "
          f"{mem:>5.2f}x")
    print("  " + json.dumps(c))
    print("  " + json.dumps(t))
