"""Tokenizer parity: the C WordPiece (build/tok_dump) against HF `tokenizers`
(BertWordPieceTokenizer: BertNormalizer + BertPreTokenizer + WordPiece + BERT
template) on the same vocab.txt, cased and uncased: ids, token_type_ids and
character offsets must be identical on every line of the project's corpora and
on the hard cases (accents, CJK, control characters, emoji, punctuation runs,
over-long words), single texts and pairs, with and without truncation."""
import csv, json, os, subprocess
import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import BertWordPieceTokenizer

pytestmark = pytest.mark.peer  # on both rows (tests/peers.py): HF tokenizers 0.19 and 0.2x

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
BUILD = os.environ.get("TK_BUILD", os.path.join(ROOT, "build"))
TOK_DUMP = os.path.join(BUILD, "tok_dump")
VOCABS = [("vocab_uncased.txt", 1), ("vocab_cased.txt", 0)]

def corpus_lines():
    lines = []
    for name in ["reviews_train.csv", "reviews_dev.csv", "fortunes.csv"]:
        with open(os.path.join(DATA, name), newline="", encoding="utf-8") as f:
            lines += [r["text"] for r in csv.DictReader(f)]
    for name in ["squad_train.json", "squad_dev.json"]:
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            for art in json.load(f)["data"]:
                for p in art["paragraphs"]:
                    lines.append(p["context"])
                    lines += [q["question"] for q in p["qas"]]
    return lines

def hard_cases():
    with open(os.path.join(DATA, "tokenizer_hard.jsonl"), encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]

def c_side(vocab, lower, records, max_len, strategy):
    inp = "".join(json.dumps(r) + "\n" for r in records)
    r = subprocess.run([TOK_DUMP, os.path.join(DATA, vocab), str(lower), str(max_len), strategy],
                       input=inp, capture_output=True, text=True, check=True)
    out = [json.loads(l) for l in r.stdout.splitlines()]
    assert len(out) == len(records)
    return out

def hf_side(vocab, lower, records, max_len, strategy):
    t = BertWordPieceTokenizer(os.path.join(DATA, vocab), lowercase=bool(lower))
    if max_len:
        t.enable_truncation(max_len, strategy=strategy)
    out = []
    for r in records:
        try:
            e = t.encode(r["a"], r.get("b"))
            out.append({"ids": e.ids, "type_ids": e.type_ids, "offsets": [list(o) for o in e.offsets]})
        except Exception as ex:  # HF refuses some truncations; so must C
            out.append({"error": str(ex)})
    return out

def compare(vocab, lower, records, max_len=0, strategy="longest_first"):
    if not os.access(TOK_DUMP, os.X_OK):
        pytest.fail(f"{TOK_DUMP} not built (make all builds it)")
    c = c_side(vocab, lower, records, max_len, strategy)
    h = hf_side(vocab, lower, records, max_len, strategy)
    bad = []
    for r, x, y in zip(records, c, h):
        if "error" in x or "error" in y:
            if ("error" in x) != ("error" in y):
                bad.append((r, x, y))
        elif x != y:
            bad.append((r, x, y))
    assert not bad, f"{len(bad)} of {len(records)} differ; first: {bad[0]!r}"[:3000]

@pytest.mark.parametrize("vocab,lower", VOCABS)
def test_corpus_lines(vocab, lower):
    compare(vocab, lower, [{"a": l} for l in corpus_lines()])

@pytest.mark.parametrize("vocab,lower", VOCABS)
def test_hard_cases(vocab, lower):
    compare(vocab, lower, hard_cases())

@pytest.mark.parametrize("vocab,lower", VOCABS)
@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second"])
@pytest.mark.parametrize("max_len", [16, 61])
def test_pairs_truncated(vocab, lower, strategy, max_len):
    lines = corpus_lines()[:1500:3] + [r["a"] for r in hard_cases()]
    recs = [{"a": a, "b": b} for a, b in zip(lines, lines[1:] + lines[:1])]
    compare(vocab, lower, recs, max_len, strategy)

@pytest.mark.parametrize("vocab,lower", VOCABS)
def test_single_truncated(vocab, lower):
    compare(vocab, lower, [{"a": l} for l in corpus_lines()[::7]], 24, "longest_first")

def hf_squad_features(vocab, lower, path, max_len, stride):
    """HF run_qa.py prepare_train_features, on `tokenizers` directly, with one
    deliberate difference: run_qa's start walk runs past the context into the
    final [SEP] (whose offsets are (0, 0)), so an answer that ends a window
    gets start = the [SEP] and start > end; we stop the walk at the context's
    last token, which labels that answer (start = end = its token)."""
    t = BertWordPieceTokenizer(os.path.join(DATA, vocab), lowercase=bool(lower))
    t.enable_truncation(max_len, stride=stride, strategy="only_second")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)["data"]
    feats, ex = [], 0
    for art in data:
        for p in art["paragraphs"]:
            for qa in p["qas"]:
                enc = t.encode(qa["question"].lstrip(), p["context"])
                a = qa["answers"][0]
                s_char, e_char = a["answer_start"], a["answer_start"] + len(a["text"])
                for w in [enc] + list(enc.overflowing):
                    seq, offs = w.sequence_ids, w.offsets
                    ts = 0
                    while seq[ts] != 1:
                        ts += 1
                    te = len(w.ids) - 1
                    while seq[te] != 1:
                        te -= 1
                    if not (offs[ts][0] <= s_char and offs[te][1] >= e_char):
                        sp = ep = 0
                    else:
                        last = te
                        while ts <= last and offs[ts][0] <= s_char:
                            ts += 1
                        sp = ts - 1
                        while offs[te][1] >= e_char:
                            te -= 1
                        ep = te + 1
                    feats.append({"example": ex, "start": sp, "end": ep, "ids": w.ids, "type_ids": w.type_ids})
                ex += 1
    return feats

@pytest.mark.parametrize("vocab,lower", VOCABS)
@pytest.mark.parametrize("max_len,stride", [(64, 16), (128, 32)])
def test_squad_features(vocab, lower, max_len, stride):
    path = os.path.join(DATA, "squad_dev.json")
    r = subprocess.run([TOK_DUMP, "--squad", os.path.join(DATA, vocab), str(lower), path, str(max_len), str(stride)],
                       capture_output=True, text=True, check=True)
    c = [json.loads(l) for l in r.stdout.splitlines()]
    h = hf_squad_features(vocab, lower, path, max_len, stride)
    assert len(c) == len(h)
    bad = [(x, y) for x, y in zip(c, h) if x != y]
    assert not bad, f"{len(bad)} of {len(c)} features differ; first: {bad[0]!r}"[:3000]

def fortunes_lines():
    """Every fortune of Debian's fortunes packages (real English text with
    odd punctuation and some Latin-1 era characters); [] when not installed."""
    out = []
    root = "/usr/share/games/fortunes"
    for p in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        fp = os.path.join(root, p)
        if "." in p or not os.path.isfile(fp):
            continue
        with open(fp, "rb") as f:
            raw = f.read()
        try:
            txt = raw.decode("utf-8")
        except UnicodeDecodeError:
            txt = raw.decode("latin-1")
        out += [t for t in txt.split("\n%\n") if t.strip()]
    return out

@pytest.mark.parametrize("vocab,lower", VOCABS)
def test_fortunes(vocab, lower):
    lines = fortunes_lines()
    if not lines:
        pytest.skip("fortunes packages not installed")
    compare(vocab, lower, [{"a": l} for l in lines])

@pytest.mark.parametrize("lower", [1, 0])
def test_vocab_from_hard_cases(lower, tmp_path):
    """A vocabulary learned (by tk_vocab_build) from the hard cases themselves,
    so accented, CJK, emoji and other non-ASCII pieces are in it and the
    greedy match runs over them instead of ending in [UNK]."""
    src = tmp_path / "texts.txt"
    hard = [r["a"] for r in hard_cases() if "b" not in r]
    src.write_text("\n".join(h.replace("\n", " ") for h in hard) + "\n" + "\n".join(corpus_lines()[:300]) + "\n",
                   encoding="utf-8")
    out = tmp_path / "vocab.txt"
    subprocess.run([TOK_DUMP, "--vocab", str(out), "1200", str(lower), str(src)], check=True)
    name = os.path.relpath(out, DATA)
    unk = 0
    c = c_side(name, lower, hard_cases(), 0, "longest_first")
    for x in c:
        unk += x["ids"].count(1)
    compare(name, lower, hard_cases())
    compare(name, lower, hard_cases(), 20, "longest_first")
    assert unk < 20  # the learned vocabulary covers nearly every hard case
