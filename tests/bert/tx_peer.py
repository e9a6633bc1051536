"""The transformers side of test_tx5.py, run under a peer row's python
(tests/peers.py: transformers 4.40 or 5.x), so one test drives both
versions. Each command prints one JSON object on stdout.

  save DIR VOCAB LOWER          a tiny random BertForSequenceClassification
                                (3 labels) and its tokenizer, saved by this
                                version's save_pretrained
  tokenizer DIR VOCAB LOWER     the tokenizer alone, saved the same way
  logits DIR TEXTS.json MAXLEN  AutoTokenizer + AutoModelForSequenceClassification
                                of DIR: logits, probabilities, the missing and
                                unexpected keys, the tokenizer's ids
  ids DIR RECORDS.jsonl         AutoTokenizer ids of each {"a", "b"?} record
  tokcases SPEC.json RECORDS.jsonl
                                for each case {"dir", "vocab", "lower",
                                "variant", "n"} of SPEC: the tokenizer saved to dir,
                                the variant's change made to the files, then
                                the ids of the first n records from AutoTokenizer and
                                from HF tokenizers reading tokenizer.json
"""
import json, os, shutil, sys, tempfile

import transformers


def tokenizer(vocab, lower):
    if transformers.__version__ >= "5":
        # 5.x builds the tokenizers-backed BertTokenizer from a folder's vocab.txt
        d = tempfile.mkdtemp()
        shutil.copy(vocab, os.path.join(d, "vocab.txt"))
        t = transformers.BertTokenizer.from_pretrained(d, do_lower_case=lower, model_max_length=128)
        shutil.rmtree(d)
        return t
    return transformers.BertTokenizerFast(vocab_file=vocab, do_lower_case=lower, model_max_length=128)


def encode_all(tok, recs):
    """AutoTokenizer's ids of each record, singles and pairs each in one batch
    call. An empty second text is no pair to tok() (it tests truthiness),
    while the tokenizer itself encodes it as one: those go to the backend."""
    out = [None] * len(recs)
    single = [i for i, r in enumerate(recs) if "b" not in r]
    pair = [i for i, r in enumerate(recs) if r.get("b")]
    if single:
        for i, ids in zip(single, tok([recs[i]["a"] for i in single])["input_ids"]):
            out[i] = ids
    if pair:
        for i, ids in zip(pair, tok([recs[i]["a"] for i in pair], [recs[i]["b"] for i in pair])["input_ids"]):
            out[i] = ids
    for i, r in enumerate(recs):
        if r.get("b") == "":
            out[i] = tok.backend_tokenizer.encode(r["a"], "").ids
    return out


def apply_variant(d, variant):
    """Changes a key of the saved files, so the test shows it is read."""
    if not variant:
        return
    tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    tc = json.load(open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8"))
    if variant == "strip_accents":
        # transformers rebuilds the normalizer from tokenizer_config.json's keys: both files say it
        tj["normalizer"]["strip_accents"] = tc["strip_accents"] = True
    elif variant.startswith("max_word_"):
        tj["model"]["max_input_chars_per_word"] = int(variant.split("_")[-1])
    else:
        sys.exit("tx_peer: unknown variant " + variant)
    json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    json.dump(tc, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"))


def main():
    cmd, d = sys.argv[1], sys.argv[2]
    out = {"transformers": transformers.__version__}
    if cmd in ("save", "tokenizer"):
        vocab, lower = sys.argv[3], sys.argv[4] == "1"
        if cmd == "save":
            import torch
            torch.manual_seed(0)
            labels = ["mixed", "neg", "pos"]
            cfg = transformers.BertConfig(vocab_size=sum(1 for _ in open(vocab, encoding="utf-8")), hidden_size=32,
                                          num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                          max_position_embeddings=128, num_labels=3,
                                          id2label=dict(enumerate(labels)),
                                          label2id={l: i for i, l in enumerate(labels)})
            transformers.BertForSequenceClassification(cfg).save_pretrained(d)
        tokenizer(vocab, lower).save_pretrained(d)
        out["files"] = sorted(os.listdir(d))
    elif cmd == "logits":
        import torch
        texts, max_len = json.load(open(sys.argv[3], encoding="utf-8")), int(sys.argv[4])
        tok = transformers.AutoTokenizer.from_pretrained(d)
        model, info = transformers.AutoModelForSequenceClassification.from_pretrained(d, output_loading_info=True)
        model.eval()
        with torch.no_grad():
            enc = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
            logits = model(**enc).logits
        out.update(logits=logits.tolist(), probs=torch.softmax(logits, -1).tolist(),
                   missing=list(info["missing_keys"]), unexpected=list(info["unexpected_keys"]),
                   ids=[tok(t, truncation=True, max_length=max_len)["input_ids"] for t in texts],
                   id2label={str(k): v for k, v in model.config.id2label.items()})
    elif cmd == "ids":
        tok = transformers.AutoTokenizer.from_pretrained(d)
        recs = [json.loads(l) for l in open(sys.argv[3], encoding="utf-8") if l.strip()]
        out["ids"] = encode_all(tok, recs)
    elif cmd == "tokcases":
        import tokenizers
        recs = [json.loads(l) for l in open(sys.argv[3], encoding="utf-8") if l.strip()]
        out["cases"] = []
        for c in json.load(open(d, encoding="utf-8")):
            tokenizer(c["vocab"], c["lower"]).save_pretrained(c["dir"])
            files = sorted(os.listdir(c["dir"]))
            apply_variant(c["dir"], c["variant"])
            tok = transformers.AutoTokenizer.from_pretrained(c["dir"])
            raw = tokenizers.Tokenizer.from_file(os.path.join(c["dir"], "tokenizer.json"))
            mine = recs[:c["n"]]
            out["cases"].append({"files": files, "ids": encode_all(tok, mine),
                                 "file_ids": [e.ids for e in raw.encode_batch([(r["a"], r["b"]) if "b" in r else r["a"]
                                                                               for r in mine])]})
    else:
        sys.exit("tx_peer: unknown command " + cmd)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
