"""%txpredict in the kernel: after a %%txtrain with an output_dir, the line
form on the dev file reports the run's last eval (accuracy, macro F1, dev
loss); the cell form predicts the texts of its body; a missing model and an
input with an unknown label are one error each, and the next cell runs."""
import json, os, sys, tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
import txk_util as u  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data")


def bundle_json(outs):
    """The last output's figures: application/json (--json), else txkernel's
    own application/vnd.txkernel.<what>+json."""
    js = []
    for o in outs:
        for k, v in (o["content"].get("data") or {}).items():
            if k == "application/json" or (k.startswith("application/vnd.txkernel.") and k.endswith("+json")):
                js.append(v)
    return js[-1] if js else None


@pytest.fixture(scope="module")
def kernel():
    km, kc = u.start()
    yield km, kc
    u.stop(km, kc)


def test_txpredict_after_txtrain(kernel):
    _, kc = kernel
    out = tempfile.mkdtemp()
    cfg = (f"model: bert-tiny\ninit: random\nhidden: 64\nlayers: 1\nheads: 2\nintermediate: 128\n"
           f"vocab: {DATA}/vocab_uncased.txt\ntrain_file: {DATA}/reviews_train.csv\n"
           f"dev_file: {DATA}/reviews_dev.csv\nmax_examples: 256\nmax_len: 64\nbatching: dynamic\n"
           f"batch_size: 32\neval_batch_size: 48\nepochs: 1\nlr: 2e-3\ndropout: 0\ndevice: cpu\noutput_dir: {out}\n")
    reply, outs = u.run_cell(kc, "%%txtrain\n" + cfg, timeout=300)
    assert reply["content"]["status"] == "ok", reply["content"]
    # the per-epoch table's JSON is the list of epochs
    hists = [o["content"]["data"]["application/vnd.txkernel.epochs+json"] for o in outs
             if isinstance((o["content"].get("data") or {}).get("application/vnd.txkernel.epochs+json"), list)]
    last = hists[-1][-1] if hists and hists[-1] else None
    assert last and last["dev_acc"] is not None

    reply, outs = u.run_cell(kc, f"%txpredict --input {DATA}/reviews_dev.csv --json", timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]
    p = bundle_json(outs)
    assert p["examples"] == 400
    assert p["accuracy"] == pytest.approx(last["dev_acc"], abs=1e-6)
    assert p["macro_f1"] == pytest.approx(last["dev_macro_f1"], abs=1e-6)
    assert p["loss"] == pytest.approx(last["dev_loss"], abs=1e-5)

    reply, outs = u.run_cell(kc, f"%%txpredict {out}\nThe kettle is great.\n\nAwful build, awful use.\n",
                             timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]
    text = "".join((o["content"].get("data") or {}).get("text/plain", "") for o in outs)
    assert "Predictions of" in text and "2 examples" in text
    p = bundle_json(outs)
    assert len(p["predictions"]) == 2
    for row in p["predictions"]:
        assert row["label"] in ("mixed", "neg", "pos")
        assert sum(row["probs"].values()) == pytest.approx(1.0, abs=1e-5)

    reply, outs = u.run_cell(kc, f"%txpredict /nonexistent --input {DATA}/reviews_dev.csv", timeout=60)
    errs = [o for o in outs if o["msg_type"] == "error"]
    assert len(errs) == 1 and "/nonexistent: no such folder" in errs[0]["content"]["evalue"]
    # a folder that is there but holds no model says that instead
    reply, outs = u.run_cell(kc, f"%txpredict {DATA} --input {DATA}/reviews_dev.csv", timeout=60)
    errs = [o for o in outs if o["msg_type"] == "error"]
    assert len(errs) == 1 and "not a trained model folder" in errs[0]["content"]["evalue"]

    bad = os.path.join(out, "bad.csv")
    with open(bad, "w") as f:
        f.write("text,label\nfine,pos\nodd,neutral\n")
    reply, outs = u.run_cell(kc, f"%txpredict --input {bad}", timeout=60)
    errs = [o for o in outs if o["msg_type"] == "error"]
    assert len(errs) == 1 and "bad.csv:3" in errs[0]["content"]["evalue"] and "neutral" in errs[0]["content"]["evalue"]

    reply, _ = u.run_cell(kc, "%txversion", timeout=30)
    assert reply["content"]["status"] == "ok"
