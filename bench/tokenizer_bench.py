#!/usr/bin/env python3
"""Tokenizer throughput: txkernel's C WordPiece (build/tok_dump --bench, one
thread) against HF `tokenizers` on the same vocab.txt and text, in one run.

Text: every line of the project's corpora (reviews, SQuAD contexts and
questions, fortunes), repeated to about 20 MB. Each side tokenizes each line
(no special tokens for C; HF adds [CLS]/[SEP], which costs it almost nothing).
HF is timed twice: encode() per line (one thread) and encode_batch() (its
Rayon thread pool, all cores). Prints one line per measurement and a markdown
table for bench/RESULTS.md.

Usage: tokenizer_bench.py [--build DIR] [--mb N]
"""
import csv, json, os, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")

def lines():
    out = []
    for name in ["reviews_train.csv", "reviews_dev.csv", "fortunes.csv"]:
        with open(os.path.join(DATA, name), newline="", encoding="utf-8") as f:
            out += [r["text"].replace("\n", " ").replace("\r", " ") for r in csv.DictReader(f)]
    for name in ["squad_train.json", "squad_dev.json"]:
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            for a in json.load(f)["data"]:
                for p in a["paragraphs"]:
                    out.append(p["context"])
                    out += [q["question"] for q in p["qas"]]
    return out

def main():
    args = sys.argv[1:]
    build = args[args.index("--build") + 1] if "--build" in args else os.path.join(ROOT, "build")
    mb = float(args[args.index("--mb") + 1]) if "--mb" in args else 20.0
    from tokenizers import BertWordPieceTokenizer
    import tokenizers
    base = lines()
    size = sum(len(l.encode()) + 1 for l in base)
    reps = max(1, int(mb * 1e6 / size))
    text = base * reps
    nbytes = size * reps
    rows = []
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write("\n".join(base) + "\n")
        path = f.name
    try:
        for vocab, lower in [("vocab_uncased.txt", 1), ("vocab_cased.txt", 0)]:
            vp = os.path.join(DATA, vocab)
            r = subprocess.run([os.path.join(build, "tok_dump"), "--bench", vp, str(lower), path, str(reps)],
                               capture_output=True, text=True, check=True)
            c = json.loads(r.stdout)
            tok = BertWordPieceTokenizer(vp, lowercase=bool(lower))
            t0 = time.perf_counter()
            n1 = sum(len(tok.encode(l, add_special_tokens=False).ids) for l in text)
            t1 = time.perf_counter()
            encs = tok.encode_batch(text, add_special_tokens=False)
            t2 = time.perf_counter()
            n2 = sum(len(e.ids) for e in encs)
            assert n1 == n2 == c["tokens"], (n1, n2, c["tokens"])
            hf1, hf2 = nbytes / 1e6 / (t1 - t0), nbytes / 1e6 / (t2 - t1)
            rows.append((vocab, c["mb_per_s"], hf1, hf2, c["tokens"]))
            print(f"{vocab}: {nbytes/1e6:.1f} MB, {c['tokens']} tokens; C {c['mb_per_s']:.1f} MB/s (1 thread); "
                  f"HF encode {hf1:.1f} MB/s; HF encode_batch {hf2:.1f} MB/s ({os.cpu_count()} cpus); "
                  f"C/HF-encode {c['mb_per_s']/hf1:.2f}x, C/HF-batch {c['mb_per_s']/hf2:.2f}x")
    finally:
        os.unlink(path)
    print(f"\n(tokenizers {tokenizers.__version__}, {nbytes/1e6:.1f} MB of text)")
    print("| vocab | C MB/s (1 thread) | HF encode MB/s | HF encode_batch MB/s | C / HF encode | C / HF batch |")
    print("|---|---|---|---|---|---|")
    for v, c, h1, h2, _ in rows:
        print(f"| {v} | {c:.1f} | {h1:.1f} | {h2:.1f} | {c/h1:.2f}x | {c/h2:.2f}x |")

if __name__ == "__main__":
    main()
