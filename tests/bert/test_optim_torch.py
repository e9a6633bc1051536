"""Five AdamW steps with warmup/decay schedule and global-norm clipping agree
with torch.optim.AdamW + torch.nn.utils.clip_grad_norm_ + LambdaLR (the lambda
of HF's get_linear_schedule_with_warmup), within 1e-4 relative.

The C side is build/train_parity (tests/bert/train_parity_main.c); the loss is
sum_i 0.5 * s_i * ||p_i - t_i||^2, so each gradient depends on the weights of
the step, as in training. Cases cover: clipping active, clipping inactive,
warmup (first step at lr 0), constant schedule, no_decay parameters.
"""
import json
import math
import os
import subprocess

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.peer  # on both rows: torch 1.13 and torch 2.x (tests/peers.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
DRIVER = os.path.join(BUILD, "train_parity")

PARAMS = [  # name, shape, no_decay, loss scale
    ("bert.encoder.layer.0.attention.self.query.weight", (16, 8), 0, 1.0),
    ("bert.encoder.layer.0.attention.self.query.bias", (16,), 1, 3.0),
    ("bert.encoder.layer.0.output.LayerNorm.weight", (8,), 1, 0.5),
    ("classifier.weight", (3, 8), 0, 2.0),
]


def hf_lambda(warmup, total, constant):
    def f(step):
        if step < warmup:
            return step / max(1, warmup)
        if constant:
            return 1.0
        return max(0.0, (total - step) / max(1, total - warmup))
    return f


def run_case(tmp_path, steps, lr, warmup_ratio, schedule, max_norm, wd, target_mag):
    rng = np.random.default_rng(1234)
    init = [rng.normal(0, 0.5, s).astype(np.float32) for _, s, _, _ in PARAMS]
    targ = [rng.normal(0, target_mag, s).astype(np.float32) for _, s, _, _ in PARAMS]
    inp = tmp_path / "in.bin"
    out = tmp_path / "out.bin"
    np.concatenate([a.ravel() for a in init] + [a.ravel() for a in targ]).astype(np.float32).tofile(inp)
    spec = dict(steps=steps, lr=lr, warmup_ratio=warmup_ratio, schedule=schedule,
                max_grad_norm=max_norm, weight_decay=wd, beta1=0.9, beta2=0.999, eps=1e-8,
                optimizer="adamw", out=str(out),
                params=[dict(name=n, shape=list(s), no_decay=nd, scale=sc) for n, s, nd, sc in PARAMS])
    spec["in"] = str(inp)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    subprocess.run([DRIVER, str(tmp_path / "spec.json")], check=True, timeout=60)
    raw = np.fromfile(out, dtype=np.float32)

    # torch reference, in float64 to make it the exact side
    ps = [torch.nn.Parameter(torch.tensor(a, dtype=torch.float64)) for a in init]
    ts = [torch.tensor(a, dtype=torch.float64) for a in targ]
    groups = [
        {"params": [p for p, (_, _, nd, _) in zip(ps, PARAMS) if not nd], "weight_decay": wd},
        {"params": [p for p, (_, _, nd, _) in zip(ps, PARAMS) if nd], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    warmup = math.ceil(steps * warmup_ratio)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, hf_lambda(warmup, steps, schedule == "constant"))
    lrs, norms = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(0.5 * sc * ((p - t) ** 2).sum() for p, t, (_, _, _, sc) in zip(ps, ts, PARAMS))
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(ps, max_norm)))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()

    n = sum(int(np.prod(s)) for _, s, _, _ in PARAMS)
    got_p, got_lr, got_norm = raw[:n], raw[n:n + steps], raw[n + steps:n + 2 * steps]
    want_p = np.concatenate([p.detach().numpy().ravel() for p in ps])
    np.testing.assert_allclose(got_lr, lrs, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(got_norm, norms, rtol=1e-4)
    init_flat = np.concatenate([a.ravel() for a in init])
    # the weights moved (the test can fail), and they moved as torch's did
    assert np.abs(want_p - init_flat).max() > lr
    np.testing.assert_allclose(got_p, want_p, rtol=1e-4, atol=1e-6)
    return norms


@pytest.fixture(autouse=True)
def need_driver():
    if not os.path.exists(DRIVER):
        pytest.fail(f"{DRIVER} is missing: run `make {os.path.relpath(DRIVER, ROOT)}`")


def test_five_steps_clipped_with_warmup(tmp_path):
    norms = run_case(tmp_path, steps=5, lr=1e-2, warmup_ratio=0.2, schedule="linear",
                     max_norm=1.0, wd=0.01, target_mag=3.0)
    assert min(norms) > 1.0  # clipping was active on every step


def test_five_steps_unclipped_linear(tmp_path):
    norms = run_case(tmp_path, steps=5, lr=5e-2, warmup_ratio=0.0, schedule="linear",
                     max_norm=1000.0, wd=0.1, target_mag=1.0)
    assert max(norms) < 1000.0


def test_constant_schedule_with_warmup(tmp_path):
    run_case(tmp_path, steps=6, lr=2e-2, warmup_ratio=0.5, schedule="constant",
             max_norm=5.0, wd=0.01, target_mag=2.0)
