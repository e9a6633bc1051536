"""A pretrained BERT nobody here wrote: AntiBERTy (PyPI `antiberty==0.1.3`,
MIT licence, Jeffrey Ruffolo), an 8-layer, 512-wide BERT trained on antibody
sequences, whose wheel ships `trained_models/AntiBERTy_md_smooth/
pytorch_model.bin` (104 MB, torch.save's zip format) with its config.json and
vocab.txt. txk reads that file in C as it is:

- through a classification head with the same weights on both sides, the
  pooled logits equal transformers' within 1e-4 (the encoder, the pooler and
  the head all take part); on both peer rows (tests/peers.py): transformers
  4.40 on torch 1.13 and 5.x on torch 2.x, where the head's shard is that
  torch's torch.save;
- a short fine-tune on project-made sequences runs, and reports the
  checkpoint's unused heads (cls.*) and the newly initialised classifier.
"""
import csv, importlib.util, json, os, random, shutil, subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.path.join(ROOT, "build", "txk")

spec = importlib.util.find_spec("antiberty")
if spec is None:
    pytest.skip("antiberty==0.1.3 is not installed (scripts/deps.sh installs it)", allow_module_level=True)
PKG = os.path.join(spec.submodule_search_locations[0], "trained_models")
CKPT = os.path.join(PKG, "AntiBERTy_md_smooth")


def sequences(n, seed):
    """Heavy-chain-like strings, space-separated residues as AntiBERTy reads
    them; label 1 when the CDR3-like motif 'C A R' occurs."""
    rng = random.Random(seed)
    aa = "ACDEFGHIKLMNPQRSTVWY"
    rows = []
    for i in range(n):
        s = [rng.choice(aa) for _ in range(rng.randint(20, 40))]
        if i % 2:
            k = rng.randint(0, len(s) - 3)
            s[k:k + 3] = ["C", "A", "R"]
        text = " ".join(s)
        rows.append({"text": text, "label": "motif" if "C A R" in text else "none"})
    return rows


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["text", "label"])
        w.writeheader()
        w.writerows(rows)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The package's own files, as a model folder (the weights linked, not copied)."""
    d = tmp_path_factory.mktemp("antiberty")
    os.symlink(os.path.join(CKPT, "pytorch_model.bin"), d / "pytorch_model.bin")
    shutil.copy(os.path.join(CKPT, "config.json"), d / "config.json")
    shutil.copy(os.path.join(PKG, "vocab.txt"), d / "vocab.txt")
    return d


@pytest.mark.peer  # transformers 4.40 on torch 1.13, and 5.x on torch 2.x (tests/peers.py)
def test_pooled_logits_equal_transformers(folder, tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification.from_pretrained(str(folder), num_labels=2).eval()
    # the same classifier for txk, as transformers shards a big .bin: the
    # package's file as shard 1 (linked, not copied), the head as shard 2
    g = tmp_path / "with_head"
    g.mkdir()
    os.symlink(os.path.join(CKPT, "pytorch_model.bin"), g / "pytorch_model-00001-of-00002.bin")
    torch.save({"classifier.weight": hf.classifier.weight.detach().clone(),
                "classifier.bias": hf.classifier.bias.detach().clone()}, str(g / "pytorch_model-00002-of-00002.bin"))
    cfg = json.load(open(folder / "config.json"))
    cfg.update(architectures=["BertForSequenceClassification"], id2label={"0": "none", "1": "motif"},
               label2id={"none": 0, "motif": 1})
    json.dump(cfg, open(g / "config.json", "w"))
    shutil.copy(folder / "vocab.txt", g / "vocab.txt")
    keys = [k for k in hf.state_dict() if not k.startswith("classifier")]
    weight_map = {k: "pytorch_model-00001-of-00002.bin" for k in keys}
    weight_map.update({"classifier.weight": "pytorch_model-00002-of-00002.bin",
                       "classifier.bias": "pytorch_model-00002-of-00002.bin"})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(g / "pytorch_model.bin.index.json", "w"))

    rows = sequences(12, 1)
    inp = tmp_path / "seqs.csv"
    write_csv(inp, rows)
    tok = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=False)
    with torch.no_grad():
        enc = tok([r["text"] for r in rows], padding=True, truncation=True, max_length=128, return_tensors="pt")
        ref = hf(**enc).logits.numpy()
    r = subprocess.run([TXK, "predict", str(g), "--input", str(inp), "--json", "max_len=128"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["predictions"]
    worst = max(abs(a - b) for p, want in zip(got, ref) for a, b in zip(p["logits"], want))
    assert worst < 1e-4, worst


def test_a_short_finetune_runs(folder, tmp_path):
    # txk alone (no peer takes part): the same on every row, so it runs once
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    write_csv(train, sequences(48, 2))
    write_csv(dev, sequences(16, 3))
    cfg = tmp_path / "ab.yaml"
    cfg.write_text(f"model: {folder}\ntrain_file: {train}\ndev_file: {dev}\nmax_len: 48\nbatch_size: 16\n"
                   f"epochs: 1\nlr: 5e-5\ndevice: cpu\noutput_dir: {tmp_path / 'out'}\n")
    r = subprocess.run([TXK, "train", str(cfg), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "weights: loaded" in r.stderr
    assert "newly initialised (not in the checkpoint): classifier.weight, classifier.bias" in r.stderr
    assert "cls.predictions.* (7 tensors)" in r.stderr, r.stderr
    hist = json.loads(r.stdout)
    assert len(hist) == 1 and hist[0]["train_loss"] == hist[0]["train_loss"]  # finite, not NaN
    assert os.path.exists(tmp_path / "out" / "model.safetensors")
