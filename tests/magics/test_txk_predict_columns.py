"""txk predict on a trained folder (issue 34): the label column the model
was trained with gives metrics without --label, and -o writes the input's
id column (a column named id or ID, or --id COL), not the row index."""
import csv
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data")


def txk(*args):
    r = subprocess.run([TXK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300)
    return r.returncode, r.stdout, r.stderr


def renamed(src, dst, n):
    """The first n rows of a reviews file with its columns named as a user's:
    ID, review, sentiment."""
    with open(src, newline="") as f, open(dst, "w", newline="") as g:
        rows = list(csv.DictReader(f))[:n]
        w = csv.writer(g)
        w.writerow(["ID", "review", "sentiment"])
        for r in rows:
            w.writerow([f"r{r['id']}", r["text"], r["label"]])


def test_predict_uses_the_runs_columns_and_the_id(tmp_path):
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    renamed(os.path.join(DATA, "reviews_train.csv"), train, 64)
    renamed(os.path.join(DATA, "reviews_dev.csv"), dev, 24)
    out = tmp_path / "run"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model: bert-tiny\ninit: random\nvocab: {DATA}/vocab_cased.txt\ntrain_file: {train}\n"
                   f"text_col: review\nlabel_col: sentiment\nmax_len: 32\nbatch_size: 16\nmax_steps: 2\nthreads: 1\n"
                   f"device: cpu\noutput_dir: {out}\n")
    rc, _, err = txk("train", str(cfg))
    assert rc == 0, err
    # no --text, no --label: the run's review and sentiment columns, so there are metrics
    rc, o, err = txk("predict", str(out), "--input", str(dev), "--json")
    assert rc == 0, err
    p = json.loads(o)
    assert p["examples"] == 24 and p["accuracy"] is not None, p
    preds = tmp_path / "preds.csv"
    rc, _, err = txk("predict", str(out), "--input", str(dev), "-o", str(preds))
    assert rc == 0 and "(each with its ID)" in err, err
    rows = list(csv.reader(open(preds)))
    assert rows[0][:3] == ["ID", "label", "score"] and [r[0] for r in rows[1:4]] == ["r0", "r1", "r2"], rows[:4]
    # --id names another column; an unknown one is an error listing the columns
    rc, _, err = txk("predict", str(out), "--input", str(dev), "--id", "review", "-o", str(tmp_path / "p2.jsonl"))
    assert rc == 0, err
    first = json.loads(open(tmp_path / "p2.jsonl").readline())
    assert first["review"] and "label" in first
    rc, _, err = txk("predict", str(out), "--input", str(dev), "--id", "nope", "-o", str(tmp_path / "p3.csv"))
    assert rc == 2 and "--id nope" in err and "sentiment" in err, err
