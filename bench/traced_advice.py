"""%txadvise on a traced model (issue 41, point 6): how long the advice
takes when each candidate is its own traced step, with the companion's
trace budget (python/txkernel/trace_plan.py TRACE_BUDGET_S) or another.

Runs in IPython in this process (the Colab row's Python has torch 2.x):
    TXK_ENGINE_LIB=build/libtxk.so .venv-colab/bin/python bench/traced_advice.py \\
        [--layers 4] [--batch 64] [--seq 512] [--gpu t4] [--budget 20]
Prints the %txplan and %txadvise seconds (first advice: traces; second:
the traces kept, replays only), the advice's own line on what it traced,
and the ranked candidates."""
import argparse
import os
import sys
import time
import warnings

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--gpu", default="t4")
ap.add_argument("--budget", type=float, default=None, help="seconds (default: the companion's)")
a = ap.parse_args()
if a.budget is not None:
    os.environ["TXK_TRACE_BUDGET_S"] = str(a.budget)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import seed_model  # noqa: E402  (tests/seed_model.py: the seeds' SentimentClassifier)
warnings.simplefilter("ignore")
from IPython.testing.globalipapp import get_ipython  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

ip = get_ipython()
ip.run_line_magic("load_ext", "txkernel")
r = ip.run_cell(f"""
import torch
from torch import nn
from transformers import BertConfig, BertModel
torch.manual_seed(0)
cfg = BertConfig(num_hidden_layers={a.layers}, vocab_size=28996, num_labels=3)
""" + seed_model.SOURCE + f"""
clf = SentimentClassifier(3)
""")
assert r.success, r.error_in_exec
t0 = time.perf_counter()
res = ip.run_line_magic("txplan", f"--torch-model clf --batch {a.batch} --seq {a.seq} --gpu {a.gpu} --json")
print(f"%txplan: {time.perf_counter() - t0:.1f} s, peak reserved {res.data['application/json']['peak_reserved']}")
for run in ("first (traces)", "again (traces kept)"):
    t0 = time.perf_counter()
    with capture_output() as cap:
        res = ip.run_line_magic("txadvise", "--json")
    dt = time.perf_counter() - t0
    j = (res._repr_mimebundle_()[0] if res is not None else cap.outputs[-1].data)["application/json"]
    print(f"%txadvise {run}: {dt:.1f} s")
print(j["planned_by"])
for i, c in enumerate(j["candidates"], 1):
    print(f"  {i:2d} {c['label']:<40s} peak {c['peak']:>12d} fits {c['fits_margin']}")
