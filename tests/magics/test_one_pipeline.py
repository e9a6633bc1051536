"""One data pipeline under every command (issue 18): the same config through
`txk plan`, `txk train`, `%%txplan` and `%%txtrain` is built by the same
function, so each reports the same data digest (an FNV-1a fingerprint of
every batch's shape, token ids, token types, mask and labels, train and dev)
and the same label count; the plan of a config with a train_file is of the
model the run builds."""
import json, os, re, subprocess, sys, tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
import txk_util as u  # noqa: E402

TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data")

# dynamic padding and a dev split: batch boundaries and the split both
# depend on the pipeline's choices, so a second copy would show
CFG = {"model": "bert-tiny", "init": "random", "hidden": 32, "layers": 1, "heads": 2, "intermediate": 64,
       "vocab": os.path.join(DATA, "vocab_uncased.txt"),
       "train_file": os.path.join(DATA, "reviews_train.csv"), "text_col": "text", "label_col": "label",
       "dev_split": 0.2, "max_examples": 96, "max_len": 48, "batching": "dynamic", "batch_size": 8,
       "eval_batch_size": 12, "max_steps": 2, "device": "cpu", "seed": 3}
YAML = "".join(f"{k}: {json.dumps(v) if isinstance(v, str) else v}\n" for k, v in CFG.items())
DIGEST = re.compile(r"digest ([0-9a-f]{16})")


def txk(*args):
    return subprocess.run([TXK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120, cwd=ROOT)


@pytest.fixture(scope="module")
def cfg_file():
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(YAML)
    yield f.name
    os.unlink(f.name)


def test_plan_of_a_config_with_data_has_the_runs_label_count():
    r = txk("plan", os.path.join("examples", "reviews_tiny.yaml"), "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    # bert-tiny with a 3-class head: 4,386,178 would be the 2-label head
    assert plan["n_params"] == 4386307
    assert plan["data"]["num_labels"] == 3
    # and what `txk train` builds for it, said by the trainer itself
    t = txk("train", os.path.join("examples", "reviews_tiny.yaml"), "max_steps=1", "max_examples=64")
    assert t.returncode == 0, t.stderr
    assert "model: 4386307 parameters" in t.stderr


def test_same_data_through_plan_train_and_the_magics(cfg_file):
    p = txk("plan", cfg_file, "--json")
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    digest = plan["data"]["digest"]
    assert plan["data"]["num_labels"] == 3
    assert plan["data"]["examples"] == 96          # max_examples of the 80% split
    assert plan["data"]["dev_examples"] == 400      # 20% of the file's 2000

    t = txk("train", cfg_file)
    assert t.returncode == 0, t.stderr
    assert DIGEST.findall(t.stderr) == [digest], t.stderr

    km, kc = u.start()
    try:
        reply, outs = u.run_cell(kc, "%%txplan --json\n" + YAML, timeout=120)
        assert reply["content"]["status"] == "ok"
        js = [o["content"]["data"]["application/json"] for o in outs
              if "application/json" in (o["content"].get("data") or {})]
        assert js and js[-1]["data"]["digest"] == digest
        assert js[-1]["n_params"] == plan["n_params"]

        reply, outs = u.run_cell(kc, "%%txtrain\n" + YAML, timeout=120)
        assert reply["content"]["status"] == "ok"
        text = "".join(o["content"].get("text", "") for o in outs if o["msg_type"] == "stream")
        assert DIGEST.findall(text) == [digest], text
    finally:
        u.stop(km, kc)
    # another seed is another split: the digest is not a constant
    q = txk("plan", cfg_file, "seed=4", "--json")
    assert json.loads(q.stdout)["data"]["digest"] != digest
