"""A round trip with PyPI transformers, on both peer rows (tests/peers.py):
4.40 on Debian's torch 1.13, and 5.x on torch 2.x:

- a model transformers saved (safetensors, pytorch_model.bin, and shards
  with their index) gives the same logits in `txk predict` as in
  transformers (fp32, dropout off, within 1e-4). transformers 5 writes
  safetensors only: there the .bin is torch.save's of the state dict (torch
  2.x's writer) and the shards are safetensors shards;
- a model `txk train` fine-tuned and saved loads in transformers with no
  missing or unexpected keys, the label names in id2label, the same logits,
  and its tokenizer files load with AutoTokenizer and give txk's token ids
  (build/tok_dump drives the C tokenizer);
- `txk predict` on the dev set reports the training run's last eval
  (accuracy, macro F1, loss).
"""
import csv, json, os, subprocess, tempfile

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.peer  # on both rows: torch 1.13 and torch 2.x (tests/peers.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.path.join(ROOT, "build", "txk")
TOK = os.path.join(ROOT, "build", "tok_dump")
DATA = os.path.join(ROOT, "tests", "data")
VOCAB = os.path.join(DATA, "vocab_uncased.txt")
TF5 = int(transformers.__version__.split(".")[0]) >= 5


def txk(*args, cwd=ROOT):
    r = subprocess.run([TXK, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300)
    return r


def dev_rows(n):
    with open(os.path.join(DATA, "reviews_dev.csv"), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return rows[:n]


def hf_logits(folder, texts, max_len):
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        enc = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        return model(**enc).logits.numpy(), tok


def txk_predict(folder, input_csv, *extra):
    r = txk("predict", folder, "--input", input_csv, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def tmp():
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.mark.parametrize("form", ["safetensors", "bin", "sharded"])
def test_a_model_transformers_saved_predicts_the_same_logits(tmp, form):
    torch.manual_seed(0)
    labels = ["mixed", "neg", "pos"]
    cfg = transformers.BertConfig(vocab_size=sum(1 for _ in open(VOCAB, encoding="utf-8")), hidden_size=32,
                                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=128, num_labels=3,
                                  id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)},
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForSequenceClassification(cfg)
    folder = os.path.join(tmp, "hf_saved_" + form)
    # model.safetensors; pytorch_model.bin (torch.save's zip); or shards of
    # pytorch_model.bin (of model.safetensors with transformers 5) with their index
    if TF5 and form == "bin":
        model.config.save_pretrained(folder)
        torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
    elif TF5:
        model.save_pretrained(folder, **({"max_shard_size": "40KB"} if form == "sharded" else {}))
    else:
        model.save_pretrained(folder, safe_serialization=form == "safetensors",
                              **({"max_shard_size": "40KB"} if form == "sharded" else {}))
    weights = {"safetensors": "model.safetensors", "bin": "pytorch_model.bin",
               "sharded": "model.safetensors.index.json" if TF5 else "pytorch_model.bin.index.json"}[form]
    assert os.path.exists(os.path.join(folder, weights)), os.listdir(folder)
    transformers.BertTokenizer(VOCAB, do_lower_case=True, model_max_length=128).save_pretrained(folder)
    rows = dev_rows(24)
    inp = os.path.join(tmp, "dev24.csv")
    with open(inp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["id", "text", "label"])
        w.writeheader()
        w.writerows(rows)
    ref, _ = hf_logits(folder, [r["text"] for r in rows], 128)
    got = txk_predict(folder, inp)
    assert len(got["predictions"]) == len(rows)
    worst = max(abs(a - b) for p, want in zip(got["predictions"], ref) for a, b in zip(p["logits"], want))
    assert worst < 1e-4, worst
    # the label names came from its id2label
    assert {p["label"] for p in got["predictions"]} <= set(labels)


def test_a_model_txk_trained_loads_in_transformers(tmp):
    out = os.path.join(tmp, "txk_trained")
    r = txk("train", os.path.join("examples", "reviews_tiny.yaml"), f"output_dir={out}", "epochs=1",
            "max_examples=400", "--json")
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout)[-1]
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    # lists in transformers 4, sets in 5
    assert list(info["missing_keys"]) == [] and list(info["unexpected_keys"]) == []
    assert model.config.id2label == {0: "mixed", 1: "neg", 2: "pos"}

    # the dev set's metrics, again, from the saved model
    pred = txk_predict(out, os.path.join(DATA, "reviews_dev.csv"))
    assert pred["accuracy"] == pytest.approx(last["dev_acc"], abs=1e-6)
    assert pred["macro_f1"] == pytest.approx(last["dev_macro_f1"], abs=1e-6)
    assert pred["loss"] == pytest.approx(last["dev_loss"], abs=1e-5)

    # the same logits in transformers, on the same tokens
    rows = dev_rows(16)
    ref, tok = hf_logits(out, [r["text"] for r in rows], 128)
    worst = max(abs(a - b) for p, want in zip(pred["predictions"][:16], ref) for a, b in zip(p["logits"], want))
    assert worst < 1e-4, worst
    lines = "".join(json.dumps({"a": r["text"]}) + "\n" for r in rows)
    t = subprocess.run([TOK, os.path.join(out, "vocab.txt"), "-1", "128", "longest_first"], input=lines,
                       stdout=subprocess.PIPE, text=True, check=True)
    ours = [json.loads(l)["ids"] for l in t.stdout.splitlines()]
    theirs = [tok(r["text"], truncation=True, max_length=128)["input_ids"] for r in rows]
    assert ours == theirs
