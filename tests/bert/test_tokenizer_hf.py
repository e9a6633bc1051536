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
