"""A BERT recognised in a PyTorch memory snapshot from the sizes of its live
blocks (never from frame names), the batch x sequence its activation blocks
imply, the user's data read through the pipeline (`--data`), and each fix
planned on the planner (`txk mem --snapshot F --json`: `model`, `data`,
per-fix `plan`). The snapshots: one built here with bert-base-uncased's
parameter shapes (weights, gradients and AdamW's two states, fp32) and the
activations of a batch of 32 x 512 at an OOM on a T4; one written by txkernel
itself (`txk train --snapshot`, a bert-tiny run stopped by its capacity).
The two real files are decoders served by FlexGen (an OPT and a smaller
model): not BERTs, nothing planned."""
import json, os, pickle, subprocess, tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data")
REAL = os.path.join(ROOT, "tests", "data", "pytorch_snapshots")
MiB = 1 << 20


def bert_params(H=768, L=12, I=3072, V=30522, P=512):
    """HF BertForSequenceClassification's parameters: (name, elements)."""
    ps = [("bert.embeddings.word_embeddings.weight", V * H), ("bert.embeddings.position_embeddings.weight", P * H),
          ("bert.embeddings.token_type_embeddings.weight", 2 * H), ("bert.embeddings.LayerNorm.weight", H),
          ("bert.embeddings.LayerNorm.bias", H)]
    for l in range(L):
        p = f"bert.encoder.layer.{l}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            ps += [(p + m + ".weight", H * H), (p + m + ".bias", H)]
        ps += [(p + "attention.output.LayerNorm.weight", H), (p + "attention.output.LayerNorm.bias", H),
               (p + "intermediate.dense.weight", I * H), (p + "intermediate.dense.bias", I),
               (p + "output.dense.weight", H * I), (p + "output.dense.bias", H),
               (p + "output.LayerNorm.weight", H), (p + "output.LayerNorm.bias", H)]
    ps += [("bert.pooler.dense.weight", H * H), ("bert.pooler.dense.bias", H),
           ("classifier.weight", 2 * H), ("classifier.bias", 2)]
    return ps


def snapshot(elem=4, copies=4, B=32, T=512, H=768, I=3072, A=12, act_layers=4):
    """Every tensor its own block and segment (sizes rounded to 512 as the
    allocator does; requested_size exact); frames say nothing of the model."""
    frames = [{"filename": "??", "line": 0, "name": "malloc"}]
    segs, addr = [], 1 << 40

    def block(nbytes):
        nonlocal addr
        size = max(512, (nbytes + 511) // 512 * 512)
        segs.append({"device": 0, "address": addr, "total_size": size, "allocated_size": size, "active_size": size,
                     "requested_size": nbytes, "stream": 0, "segment_type": "large" if size > MiB else "small",
                     "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                     "blocks": [{"address": addr, "size": size, "requested_size": nbytes,
                                 "state": "active_allocated", "frames": frames}]})
        addr += size

    for _ in range(copies):
        for _, n in bert_params():
            block(n * elem)
    for _ in range(act_layers):  # the forward's kept activations, per layer
        for _ in range(6):
            block(B * T * H * elem)
        for _ in range(2):
            block(B * T * I * elem)
        for _ in range(2):
            block(B * A * T * T * elem)
    oom = {"action": "oom", "addr": 0, "size": B * A * T * T * elem, "stream": 0, "time_us": 1,
           "device_free": 20 * MiB, "frames": frames}
    return {"segments": segs, "device_traces": [[oom]]}


def write(obj):
    f = tempfile.NamedTemporaryFile("wb", suffix=".pickle", delete=False)
    f.write(pickle.dumps(obj, protocol=4))
    f.close()
    return f.name


def mem(path, *extra, ok=True):
    r = subprocess.run([TXK, "mem", "--snapshot", path, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def mem_json(path, *extra):
    return json.loads(mem(path, "--json", *extra).stdout)


def plan_peak(yaml):
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(yaml)
    f.close()
    r = subprocess.run([TXK, "plan", f.name, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    os.unlink(f.name)
    assert r.stdout, r.stderr
    return json.loads(r.stdout)["peak_reserved"]


def fix(j, fid):
    return next(f for f in j["fixes"] if f["id"] == fid)


# the snapshot's run kept the T x T scores its shape was read from: planned with standard attention
# the snapshot is a PyTorch run's: its plan is engine: pytorch's, eager attention
# (the file kept the T x T scores)
BASE_YAML = "model: bert-base-uncased\ninit: random\nnum_labels: 2\ngpu: t4\nengine: pytorch\nattn_implementation: eager\n"


def test_bert_base_recognised_shape_inferred_and_fixes_planned():
    path = write(snapshot())
    j = mem_json(path, "--gpu", "t4", "--data", os.path.join(DATA, "reviews_train.csv"))
    m = j["model"]
    assert m["preset"] == "bert-base-uncased" and m["recognised_from"] == "the live blocks' sizes", m
    assert (m["hidden"], m["layers"], m["heads"], m["intermediate"], m["vocab"], m["max_position"]) == \
        (768, 12, 12, 3072, 30522, 512), m
    assert m["dtype"] == "fp32" and m["copies"] == 4, m
    # the recognised bytes are the bert.* parameters (the 2-class head is too small to tell), four times
    assert m["param_bytes"] == 4 * 4 * sum(n for name, n in bert_params() if name.startswith("bert.")), m
    assert (m["batch"], m["seq"], m["shape_from"]) == (32, 512, "the activation blocks' sizes"), m
    # the current setting's plan is txk plan's of that config with engine: pytorch
    current = plan_peak(BASE_YAML + "batch_size: 32\nmax_len: 512\n")
    assert m["plan"]["peak"] == current and m["plan"]["fits"] is False, m["plan"]
    assert m["plan"]["capacity_from"].startswith("the t4 profile"), m["plan"]
    # each fix planned: the same peaks txk plan gives for the changed config
    expect = {"precision": "precision: fp16\nbatch_size: 32\nmax_len: 512\n",
              "checkpointing": "recompute: layers\nbatch_size: 32\nmax_len: 512\n",
              "batch": "batch_size: 16\naccumulate: 2\nmax_len: 512\n",
              "max_length": "batch_size: 32\nmax_len: 176\n"}
    for fid, yaml in expect.items():
        f = fix(j, fid)
        assert "plan" in f, f
        assert f["plan"]["peak"] == plan_peak(BASE_YAML + yaml) < current, (fid, f["plan"])
    # the data: the pipeline's lengths, as txk data reports them
    d = json.loads(subprocess.run([TXK, "data", os.path.join(DATA, "reviews_train.csv"), "--json"],
                                  stdout=subprocess.PIPE, text=True).stdout)
    assert (j["data"]["p95"], j["data"]["p99"], j["data"]["max"]) == (d["p95"], d["p99"], d["max"]), (j["data"], d)
    assert j["data"]["max_length"] == 176  # p99 172 rounded up to 8
    ml = fix(j, "max_length")
    assert "max_length=176" in ml["code"] and "DataCollatorWithPadding" in ml["code"], ml
    assert "Planned:" in ml["text"] and "less at the peak than at 512 tokens" in ml["text"], ml
    # the text shows the same
    out = mem(path, "--gpu", "t4").stdout
    assert "BERT = bert-base-uncased" in out and "batch 32 x sequence 512" in out and "planned (" in out, out
    os.unlink(path)


def test_16bit_weights_with_model_and_shape_given():
    """model.half(), weights only (inference), and no activations: the sizes
    tell 16-bit and one copy; --model names it; --batch/--seq give the shape.
    The file's trace ends in an OOM, so a plan of 8 x 128 that fits 8 GiB
    disagrees with it: withheld, with the reason."""
    path = write(snapshot(elem=2, copies=1, act_layers=0))
    j = mem_json(path)
    assert j["model"]["dtype"] == "fp16/bf16" and j["model"]["copies"] == 1 and j["model"]["batch"] is None, j["model"]
    assert "plan" not in j["model"]
    out = mem(path).stdout
    assert "give --batch N --seq N to plan the fixes" in out, out
    j = mem_json(path, "--model", "bert-base-uncased", "--batch", "8", "--seq", "128", "--capacity", "8GiB")
    m = j["model"]
    assert m["recognised_from"] == "--model bert-base-uncased" and m["shape_from"] == "--batch/--seq", m
    assert (m["batch"], m["seq"], m["dtype"]) == (8, 128, "fp16/bf16") and m["family"] == "bert", m
    assert "plan" not in m and m["plan_withheld"]["engine"] == "pytorch", m
    assert "ran out of memory; the plan fits" in m["plan_withheld"]["reason"], m
    os.unlink(path)


def test_txkernels_own_oom_snapshot_is_recognised_by_size():
    """txk train --snapshot of bert-tiny (init: random) run into its capacity:
    the frames name txkernel's owners, but recognition reads sizes only."""
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    cfg.write(f"model: bert-tiny\ninit: random\nvocab: {DATA}/vocab_uncased.txt\n"
              f"train_file: {DATA}/reviews_train.csv\ndev_split: 0\ntext_col: text\nlabel_col: label\n"
              f"max_len: 128\nbatching: fixed\nbatch_size: 32\nmax_steps: 2\ncapacity: 100MiB\ndevice: cpu\n")
    cfg.close()
    snap = tempfile.mktemp(suffix=".pickle")
    r = subprocess.run([TXK, "train", cfg.name, "--no-plan", "--snapshot", snap], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    assert os.path.exists(snap), r.stderr
    j = mem_json(snap)
    assert j["oom"] is not None, j["oom"]
    m = j["model"]
    assert m["preset"] == "bert-tiny" and (m["hidden"], m["layers"], m["intermediate"]) == (128, 2, 512), m
    assert (m["batch"], m["seq"]) == (32, 128), m
    # planned at that shape against what the process had, it does not fit either
    assert m["plan"]["capacity_from"] == "reserved + device free at the OOM" and m["plan"]["fits"] is False, m
    os.unlink(snap)
    os.unlink(cfg.name)


def test_bad_model_data_and_shape_are_one_line_errors(tmp_path):
    path = write(snapshot(act_layers=0))
    r = mem(path, "--data", str(tmp_path / "missing.csv"), ok=False)
    assert r.returncode != 0 and "missing.csv" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    bad = tmp_path / "cols.csv"
    bad.write_text("review,label\ngood,1\n")
    r = mem(path, "--data", str(bad), ok=False)
    assert "cols.csv" in r.stderr and "no column 'text'" in r.stderr, r.stderr
    r = mem(path, "--model", str(tmp_path / "nomodel"), ok=False)
    assert r.returncode != 0 and "nomodel" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = mem(path, "--batch", "8", ok=False)
    assert r.returncode != 0 and "--batch and --seq" in r.stderr, r.stderr
    os.unlink(path)


@pytest.mark.parametrize("name", ["llm_oom.pickle", "llm_inference.pickle"])
def test_real_snapshots(name):
    """llm_oom is FlexGen serving an OPT-class decoder: 4096 x 4096 blocks 4
    to a layer, 4096 x 16384 ones 2 to a layer over the 28 layers loaded,
    vocab 50272, one copy, and learned positions of 2050 rows (OPT's offset
    of 2): an OPT, not a BERT, so nothing is planned. llm_inference is the
    same server with a smaller model: not a BERT either."""
    path = os.path.join(REAL, name)
    assert os.path.exists(path), f"{path} is missing: the real snapshots live in the repository"
    m = mem_json(path)["model"]
    assert m["family"] != "bert" and m["planned"] is False and "plan" not in m and m["why"], m
    if name == "llm_oom.pickle":
        assert m["family"] == "opt" and (m["hidden"], m["layers"], m["intermediate"], m["vocab"]) == \
            (4096, 28, 16384, 50272) and m["copies"] == 1 and m["max_position"] == 2050, m
