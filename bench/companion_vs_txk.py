#!/usr/bin/env python3
"""The companion against the kernel's own trainer: the same training config
run by `txk train` and by `%load_ext txkernel` + `%%txtrain` in an IPython
shell (a fresh Python process each run, the engine library of the same
build), alternately, in one run of this script; each side's samples/s is the
per-epoch table's (training rows over training seconds, evaluation not
counted), and the ratio is companion / txk (1.0 = as fast as the kernel).

  companion_vs_txk.py [--root .] [--build ROOT/build] [--models bert-tiny,bert-mini] [--steps 40]
                      [--runs 3] [--threads 0] [--python PY] [--import-torch]

--root: the checkout whose python/ (the companion) and build/ are run (another
checkout's, e.g. a "before" measurement). --python picks the companion's interpreter (default: this one; it needs
IPython). --import-torch imports torch before `%load_ext txkernel`, as a
notebook that starts with `import torch` does: torch then has loaded its
libgomp (the same soname as the engine's), with OpenMP's spin-wait policy,
before the engine is loaded. The environment is passed as it is: neither side
gets an OMP_WAIT_POLICY it did not ask for (txk sets its own)."""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ap.add_argument("--build")
ap.add_argument("--models", default="bert-tiny,bert-mini")
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--threads", type=int, default=0, help="the config's threads: (0 = every core)")
ap.add_argument("--python", default=sys.executable)
ap.add_argument("--import-torch", action="store_true")
a = ap.parse_args()
ROOT = os.path.abspath(a.root)
a.build = a.build or os.path.join(ROOT, "build")

CONFIG = """model: {model}
init: random
vocab: {root}/tests/data/vocab_uncased.txt
train_file: {root}/tests/data/reviews_train.csv
text_col: text
label_col: label
max_len: 128
batch_size: 32
max_steps: {steps}
epochs: 1
lr: 2e-3
dropout: 0.0
seed: 42
device: cpu
threads: {threads}
"""

# the companion's side: IPython's own shell, the extension as a user loads it
COMPANION = r"""
import sys
if {import_torch}:
    import torch
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_cell("%load_ext txkernel", store_history=False).raise_error()
ip.run_cell(open(sys.argv[1]).read(), store_history=False).raise_error()
"""


def samples_per_s(text, who):
    """The per-epoch table's samples/s (4th field from the end of its row:
    samples/s, seconds, peak allocated as 'N MiB')."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if (line.split()[:1] == ["epoch"] and "samples/s" in line and i + 2 < len(lines)
                and set(lines[i + 1].strip()) <= set("- ")):
            return float(lines[i + 2].split()[-4])
    sys.exit(f"companion_vs_txk: no per-epoch table in {who}'s output:\n{text[-2000:]}")


def run(cmd, env, who):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"companion_vs_txk: {who} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return samples_per_s(p.stdout, who)


txk = os.path.join(a.build, "txk")
lib = os.path.join(a.build, "libtxk.so")
for f in (txk, lib):
    if not os.path.exists(f):
        sys.exit(f"companion_vs_txk: {f} is missing (make {os.path.relpath(f, ROOT)})")
cenv = dict(os.environ, TXK_ENGINE_LIB=lib,
            PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python")] + os.environ.get("PYTHONPATH", "").split(os.pathsep)).rstrip(os.pathsep))
ver = subprocess.run([a.python, "-c", "import sys, IPython; print(sys.version.split()[0], 'IPython', IPython.__version__)"]
, capture_output=True, text=True, env=cenv).stdout.strip()
print(f"companion (%load_ext txkernel in IPython's shell, {a.python}: Python {ver}"
      f"{', torch imported first' if a.import_torch else ''}) vs txk train; batch 32 x max_len 128, "
      f"{a.steps} steps, threads {a.threads or 'all'} ({os.cpu_count()} cores), median of {a.runs} alternating runs; "
      f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
print(f"{'model':<10} {'txk train':>12} {'companion':>12} {'ratio':>7}   runs (txk / companion samples/s)")
worst = None
with tempfile.TemporaryDirectory() as tmp:
    for model in a.models.split(","):
        cfg = os.path.join(tmp, model + ".yaml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(model=model, root=ROOT, steps=a.steps, threads=a.threads))
        cell = os.path.join(tmp, model + ".cell")
        with open(cell, "w") as f:
            f.write("%%txtrain\n" + open(cfg).read())
        t, c = [], []
        for _ in range(a.runs):
            t.append(run([txk, "train", cfg], dict(os.environ), "txk train"))
            c.append(run([a.python, "-c", COMPANION.format(import_torch=a.import_torch), cell], cenv, "the companion"))
        mt, mc = statistics.median(t), statistics.median(c)
        worst = mc / mt if worst is None else min(worst, mc / mt)
        runs = ", ".join(f"{x:.1f}/{y:.1f}" for x, y in zip(t, c))
        print(f"{model:<10} {mt:>12.1f} {mc:>12.1f} {mc / mt:>6.2f}x   {runs}")
print(f"lowest ratio {worst:.2f}x (companion / txk train)")
