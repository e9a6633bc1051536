"""transformers 5 folders and hub ids (issue 24), against the peer rows of
tests/peers.py (torch1: transformers 4.40, torch2: transformers 5.x), each
run as a subprocess (tests/bert/tx_peer.py) while pytest runs under .venv:

- a BERT folder transformers saved (5.x: tokenizer.json only, "dtype"),
  served by a hub on 127.0.0.1 (test_hub.Hub), downloads by hub id in
  `txk predict ORG/NAME`, predicts its logits and every class probability
  within 1e-4 of transformers, works offline from the HF cache and
  fine-tunes; that output_dir loads in both rows with no missing or
  unexpected keys, the same logits and the same AutoTokenizer ids;
- tokenizer ids read from tokenizer.json alone equal transformers 5's
  AutoTokenizer on the tokenizer test's corpora (cased, uncased, accents,
  CJK, words over the max word length), also with a normalizer that strips
  accents without lower-casing and a shorter max_input_chars_per_word.
Each test prints the peer versions it used."""
import csv, json, os, subprocess, sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import peers  # noqa: E402
from test_hub import COMMIT, Hub  # noqa: E402
from test_tokenizer_hf import corpus_lines, hard_cases  # noqa: E402

TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
TOK = os.path.join(ROOT, "build", "tok_dump")
DATA = os.path.join(ROOT, "tests", "data")
PEER = os.path.join(HERE, "tx_peer.py")
LABELS = ["mixed", "neg", "pos"]
# the rows installed here, oldest first; the last is today's (transformers 5)
ROWS = [(label, py) for label, py in peers.peer_rows() if os.access(py, os.X_OK)]


def peer_python(label):
    return dict(ROWS)[label]


def new_python():
    label, py = peers.peer_rows()[-1]
    if not os.access(py, os.X_OK):
        pytest.skip(f"the transformers 5 row ({label}: {py}) is not installed here; make test installs it")
    return py


def peer(python, *args):
    r = subprocess.run([python, PEER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    print(f"peer {os.path.relpath(python, ROOT)}: transformers {out['transformers']}")
    return out


def txk(env, *args):
    r = subprocess.run([TXK, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300)
    return r.returncode, r.stdout, r.stderr


def files_of(folder):
    return {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    d = tmp_path_factory.mktemp("dev")
    with open(os.path.join(DATA, "reviews_dev.csv"), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:16]
    with open(d / "dev.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["id", "text", "label"])
        w.writeheader()
        w.writerows(rows)
    (d / "texts.json").write_text(json.dumps([r["text"] for r in rows]))
    return str(d / "dev.csv"), str(d / "texts.json")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny model saved by each row's transformers, served by one hub."""
    base = tmp_path_factory.mktemp("saved")
    folders = {}
    for label, py in ROWS:
        d = str(base / label)
        out = peer(py, "save", d, os.path.join(DATA, "vocab_uncased.txt"), "1")
        if out["transformers"] >= "5":
            # what issue 24 is about: no vocab.txt, "dtype" for "torch_dtype"
            assert "vocab.txt" not in out["files"] and "tokenizer.json" in out["files"], out
            assert "dtype" in json.load(open(os.path.join(d, "config.json")))
        folders[label] = d
    hub = Hub({f"tx-{label}/tiny-bert": files_of(d) for label, d in folders.items()})
    yield folders, hub
    hub.srv.shutdown()


def hub_env(hub, cache):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    e.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache), HF_HOME=str(cache) + "-home", NO_PROXY="127.0.0.1",
             no_proxy="127.0.0.1")
    return e


def worst(preds, ref):
    """Largest |logit - logit| and |probability - probability| over every class of every row."""
    dl = max(abs(a - b) for p, r in zip(preds, ref["logits"]) for a, b in zip(p["logits"], r))
    dp = max(abs(p["probs"][LABELS[i]] - r[i]) for p, r in zip(preds, ref["probs"]) for i in range(len(LABELS)))
    return dl, dp


@pytest.mark.parametrize("label", [r[0] for r in ROWS])
def test_predict_by_hub_id_equals_transformers_and_works_offline(label, saved, dev, tmp_path):
    folders, hub = saved
    py = peer_python(label)
    repo = f"tx-{label}/tiny-bert"
    inp, texts = dev
    ref = peer(py, "logits", folders[label], texts, "128")
    assert ref["missing"] == [] and ref["unexpected"] == []
    env = hub_env(hub, tmp_path / "cache")
    hub.log.clear()
    rc, out, err = txk(env, "predict", repo, "--input", inp, "--json")
    assert rc == 0, err
    got = json.loads(out)["predictions"]
    assert len(got) == len(ref["logits"])
    dl, dp = worst(got, ref)
    print(f"{label}: by hub id, worst |logit| diff {dl:.2e}, worst |probability| diff {dp:.2e}")
    assert dl < 1e-4 and dp < 1e-4
    # only the files the repo has were asked for
    asked = {p.rsplit("/", 1)[1] for m, p, _ in hub.log if "/resolve/" in p}
    assert asked <= set(folders_files := os.listdir(folders[label])), (asked, folders_files)
    assert ("vocab.txt" in asked) == ("vocab.txt" in folders_files)
    # offline, from the HF cache alone: the same predictions, no request
    hub.log.clear()
    rc, out2, err = txk(dict(env, HF_HUB_OFFLINE="1"), "predict", repo, "--input", inp, "--json")
    assert rc == 0 and hub.log == [], err
    assert json.loads(out2)["predictions"] == got
    # a cache that lacks the repo says so, naming it
    rc, _, err = txk(dict(env, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "empty")), "predict", repo,
                     "--input", inp)
    assert rc != 0 and repo in err and "not in the HF cache" in err, err


def test_fine_tune_by_hub_id_then_output_dir_loads_in_both_rows(saved, dev, tmp_path):
    """The transformers 5 repo fine-tunes by hub id (from the cache,
    offline); the output_dir it leaves loads in every row with no missing or
    unexpected keys, the same logits as txk predict and the same
    AutoTokenizer ids as txk's tokenizer (from tokenizer.json and from
    vocab.txt alike)."""
    new_python()
    folders, hub = saved
    inp, texts = dev
    repo = f"tx-{peers.peer_rows()[-1][0]}/tiny-bert"
    env = hub_env(hub, tmp_path / "cache")
    out_dir = tmp_path / "out"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"model: {repo}\ntrain_file: {DATA}/reviews_train.csv\ndev_file: {DATA}/reviews_dev.csv\n"
                   f"max_examples: 64\nmax_len: 64\nbatch_size: 16\nepochs: 1\ndevice: cpu\nthreads: 1\n"
                   f"output_dir: {out_dir}\n")
    # the plan fetches only the small files, never the weights
    hub.log.clear()
    rc, out, err = txk(env, "plan", str(cfg))
    assert rc == 0, err
    assert {p.rsplit("/", 1)[1] for m, p, _ in hub.log if "/resolve/" in p} == {"config.json", "tokenizer.json",
                                                                                 "tokenizer_config.json"}
    assert not any(p.startswith("/lfs/") for _, p, _ in hub.log)
    # advice too, from what the plan fetched; offline with a cache that lacks the repo it says so
    hub.log.clear()
    rc, out, err = txk(dict(env, HF_HUB_OFFLINE="1"), "advise", str(cfg), "--gpu", "t4", "--json")
    assert rc in (0, 3) and hub.log == [], err
    rc, out, err = txk(dict(env, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "empty")), "plan", str(cfg))
    assert rc != 0 and repo in err and "not in the HF cache" in err and "HF_HUB_OFFLINE=1" in err, err
    rc, out, err = txk(env, "train", str(cfg))
    assert rc == 0, err
    assert "weights: loaded" in out + err and "tokenizer.json" in out + err, out + err
    # offline from the cache, the same run again
    rc, out, err = txk(dict(env, HF_HUB_OFFLINE="1"), "train", str(cfg), "max_steps=1")
    assert rc == 0 and "from the HF cache" in out + err, out + err
    saved_files = set(os.listdir(out_dir))
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json"} <= saved_files
    rc, out, err = txk(env, "predict", str(out_dir), "--input", inp, "--json")
    assert rc == 0, err
    ours = json.loads(out)["predictions"]
    lines = "".join(json.dumps({"a": t}) + "\n" for t in json.load(open(texts)))
    c_ids = {}
    for f in ("tokenizer.json", "vocab.txt"):
        r = subprocess.run([TOK, str(out_dir / f), "-1", "128", "longest_first"], input=lines, stdout=subprocess.PIPE,
                           text=True, check=True)
        c_ids[f] = [json.loads(l)["ids"] for l in r.stdout.splitlines()]
    assert c_ids["tokenizer.json"] == c_ids["vocab.txt"]
    refs = {}
    for label, py in ROWS:
        ref = peer(py, "logits", str(out_dir), texts, "128")
        assert ref["missing"] == [] and ref["unexpected"] == [], (label, ref["missing"], ref["unexpected"])
        assert ref["id2label"] == {"0": "mixed", "1": "neg", "2": "pos"}
        dl, dp = worst(ours, ref)
        print(f"output_dir in transformers {ref['transformers']}: worst |logit| diff {dl:.2e}, "
              f"worst |probability| diff {dp:.2e}")
        assert dl < 1e-4 and dp < 1e-4
        assert ref["ids"] == c_ids["tokenizer.json"], label
        refs[label] = ref
    assert len({json.dumps(r["ids"]) for r in refs.values()}) == 1


def tokenizer_records():
    long_words = ["a" * 99, "b" * 100, "c" * 101, "Supercalifragilistic" * 8, "x" * 13 + " short words " + "y" * 12]
    return (hard_cases() + [{"a": w} for w in long_words] +
            [{"a": "Café naïve RÉSUMÉ Ångström", "b": "中文字符 and 日本語 mixed, 한국어 too"}] +
            [{"a": l} for l in corpus_lines()])


VARIANT_RECORDS = 600  # a variant is checked on the hard cases and the first corpus lines


CASES = [("vocab_uncased.txt", True, ""), ("vocab_cased.txt", False, ""), ("vocab_cased.txt", False, "strip_accents"),
         ("vocab_uncased.txt", True, "max_word_12")]


@pytest.fixture(scope="module")
def tok_cases(tmp_path_factory):
    """Every case's tokenizer saved by transformers 5 and its ids, in one peer run."""
    py = new_python()
    d = tmp_path_factory.mktemp("tok")
    recs = tokenizer_records()
    (d / "recs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    spec = [{"dir": str(d / f"case{i}"), "vocab": os.path.join(DATA, v), "lower": lc, "variant": var,
             "n": VARIANT_RECORDS if var else len(recs)} for i, (v, lc, var) in enumerate(CASES)]
    (d / "spec.json").write_text(json.dumps(spec))
    out = peer(py, "tokcases", str(d / "spec.json"), str(d / "recs.jsonl"))
    return recs, spec, out["cases"]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{v[6:-4]}{'-' + x if x else ''}" for v, _, x in CASES])
def test_tokenizer_json_alone_gives_transformers5_ids(case, tok_cases):
    recs, spec, cases = tok_cases
    got = cases[case]
    recs = recs[:spec[case]["n"]]
    # transformers 5 saves no vocab.txt: the C side reads tokenizer.json alone
    assert got["files"] == ["tokenizer.json", "tokenizer_config.json"], got["files"]
    r = subprocess.run([TOK, os.path.join(spec[case]["dir"], "tokenizer.json"), "-1", "0", "longest_first"],
                       input="".join(json.dumps(x) + "\n" for x in recs), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    assert r.returncode == 0, r.stderr
    ours = [json.loads(l).get("ids") for l in r.stdout.splitlines()]
    assert len(ours) == len(recs)
    # HF tokenizers reading the same file
    bad = [(x, a, b) for x, a, b in zip(recs, ours, got["file_ids"]) if a != b]
    assert not bad, bad[0]
    # transformers 5's AutoTokenizer: the same, except that 5.24 rebuilds the WordPiece model with
    # max_input_chars_per_word 100 whatever the file says, so there only words of 13-100 characters differ
    bad = [(x, a, b) for x, a, b in zip(recs, ours, got["ids"]) if a != b]
    print(f"{CASES[case]}: {len(recs)} texts, {len(bad)} differ from AutoTokenizer")
    if not CASES[case][2].startswith("max_word_"):
        assert not bad, bad[0]
    else:
        assert bad and all(a.count(1) > b.count(1) for _, a, b in bad)


def test_txpredict_magic_and_snapshot_model_take_a_hub_id(saved, dev, tmp_path):
    """%txpredict ORG/NAME in the kernel gives what txk predict ORG/NAME
    gives; the snapshot reader's --model ORG/NAME fetches config.json and
    the tokenizer, never the weights."""
    from jupyter_client.manager import KernelManager
    sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "magics"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "advisor"))
    import txk_util as u
    from test_snapshot_bert import snapshot, write
    from test_txpredict import bundle_json
    folders, hub = saved
    label = ROWS[-1][0]
    repo = f"tx-{label}/tiny-bert"
    inp, _ = dev
    env = hub_env(hub, tmp_path / "cache")
    hub.log.clear()
    rc, out, err = txk(env, "mem", "--snapshot", write(snapshot()), "--model", repo, "--data", inp, "--json")
    assert rc == 0, err
    m = json.loads(out)["model"]
    assert m["recognised_from"] == f"--model {repo}" and m["hidden"] == 32 and m["layers"] == 2, m
    assert not any(p.startswith("/lfs/") or p.endswith(".safetensors") for _, p, _ in hub.log), hub.log
    rc, out, err = txk(env, "predict", repo, "--input", inp, "--json")
    assert rc == 0, err
    want = json.loads(out)["predictions"]
    km = KernelManager(kernel_name=u.dev_kernel_name())
    km.start_kernel(env=env, cwd=ROOT)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=30)
        reply, outs = u.run_cell(kc, f"%txpredict {repo} --input {inp} --json", timeout=120)
    finally:
        u.stop(km, kc)
    assert reply["content"]["status"] == "ok", outs
    assert bundle_json(outs)["predictions"] == want
