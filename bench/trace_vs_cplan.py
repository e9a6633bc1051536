#!/usr/bin/env python3
"""The traced plan (issue 41) beside the C BERT plan (torchplan.c) of the
same step on a card: the seeds' SentimentClassifier (a BertModel wrapper,
the loss outside) and a BertForSequenceClassification traced, and the
latter's engine: pytorch YAML planned by `build/txk plan` (the hand-written
graph). Prints peak allocated, first step and peak reserved of each, and
the ratios.

    .venv-t2/bin/python bench/trace_vs_cplan.py --layers 12 --batch 16 --seq 512 --gpu t4 [--precision bf16]
"""
import argparse, json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import seed_model  # noqa: E402  (tests/seed_model.py: the seeds' SentimentClassifier)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--gpu", default="t4")
    p.add_argument("--precision", default="fp32")
    a = p.parse_args()
    os.environ.setdefault("TXK_ENGINE_LIB", os.path.join(ROOT, "build", "libtxk.so"))
    import torch
    from torch import nn
    from transformers import BertConfig, BertModel, BertForSequenceClassification
    from txkernel import torch_model, trace_plan
    cfg = BertConfig(num_hidden_layers=a.layers, vocab_size=28996, num_labels=3)

    SentimentClassifier = seed_model.define(nn, BertModel, cfg)
    ns = {"clf": SentimentClassifier(3), "hf": BertForSequenceClassification(cfg)}
    flags = f"--batch {a.batch} --seq {a.seq} --gpu {a.gpu} --precision {a.precision} --json".split()
    clf = trace_plan.plan(["--torch-model", "clf"] + flags, ns)["application/json"]
    hf = trace_plan.plan(["--torch-model", "hf", "--trace"] + flags, ns)["application/json"]
    yaml, _ = torch_model.config_yaml(torch_model.parse(["--torch-model", "hf"] + flags[:-1]), ns)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(yaml + f"gpu: {a.gpu}\n")
    try:
        c = json.loads(subprocess.run([os.path.join(ROOT, "build", "txk"), "plan", f.name, "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    finally:
        os.unlink(f.name)
    for k in ("peak_allocated", "first_step_peak_allocated", "peak_reserved"):
        print(f"{k}: traced SentimentClassifier {clf[k]}, traced BertForSequenceClassification {hf[k]}, "
              f"C plan {c[k]}: {clf[k] / c[k]:.4f} / {hf[k] / c[k]:.4f}")
    print(f"attention: traced {clf['attention']}, C plan {c['attention']}; torch {torch.__version__}")


if __name__ == "__main__":
    main()
