"""Data parallelism on the cpu (issue 27): `txk train` with world_size 2
starts two MPI ranks (mpirun) and, with dropout 0, ends with the same
weights, bit for bit, as world_size 1 with accumulate 2 on the same data
and seed, for zero 0, 1 and 2. Gradient clipping is on and binding
(max_grad_norm 0.05), so the sharded gradient norm of zero 1 and 2 is
checked too. The launcher says the global batch."""
import os, subprocess, tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TXK = os.path.join(ROOT, "build", "txk")

CONFIG = """model: bert-tiny
init: random
vocab: tests/data/vocab_uncased.txt
hidden: 32
heads: 2
intermediate: 64
train_file: tests/data/reviews_train.csv
dev_file: tests/data/reviews_dev.csv
text_col: text
label_col: label
max_examples: 96
max_len: 32
batching: dynamic
batch_size: 8
eval_batch_size: 64
epochs: 1
lr: 2e-3
max_grad_norm: 0.05
dropout: 0.0
seed: 5
threads: 1
device: cpu
"""


def env():
    e = dict(os.environ)
    e["OMP_WAIT_POLICY"] = "passive"
    return e


def run(cfg, out, *kv, timeout=120):
    p = subprocess.run([TXK, "train", cfg, "output_dir=" + out, "--no-plan", *kv], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def weights(out):
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def cfg():
    assert os.access(TXK, os.X_OK), "build/txk first"
    d = tempfile.mkdtemp(prefix="txk-dp-")
    path = os.path.join(d, "cfg.yaml")
    with open(path, "w") as f:
        f.write(CONFIG)
    return d, path


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_two_ranks_equal_accumulate_two(cfg, zero):
    d, path = cfg
    one = os.path.join(d, f"w1z{zero}")
    two = os.path.join(d, f"w2z{zero}")
    run(path, one, "accumulate=2", f"zero={zero}")
    p = run(path, two, "world_size=2", f"zero={zero}")
    assert "global batch 16" in p.stderr, p.stderr
    assert weights(one) == weights(two), f"zero {zero}: world_size 2 != accumulate 2"
    # the run moved the weights at all (a step that changed nothing would pass the equality)
    if zero == 0:
        untrained = os.path.join(d, "w0")
        run(path, untrained, "max_steps=1", "lr=1e-12")
        assert weights(untrained) != weights(one)
