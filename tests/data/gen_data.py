#!/usr/bin/env python3
"""Writes the project's own test/demo data (deterministic, stdlib only).

  reviews_train.csv / reviews_dev.csv  product reviews labelled pos/neg/mixed by
      what they say (sentiment words decide the label, so a model can learn it);
      lengths long-tailed: most a sentence or three, p99 near 150 word pieces,
      a few outliers past 512; some fields carry commas, quotes and newlines.
  squad_train.json / squad_dev.json    SQuAD v1.1 format: generated encyclopedia
      paragraphs (short to very long), questions whose answers are spans with
      answer_start.
  fortunes.csv (with --fortunes)       real English text from Debian's fortunes
      packages, labelled by collection, for demos.

Usage: gen_data.py OUTDIR [--seed N] [--train N] [--dev N] [--fortunes]
"""
import csv, json, os, random, sys

POS = ["great", "excellent", "wonderful", "reliable", "sturdy", "delightful", "fast", "comfortable"]
NEG = ["terrible", "awful", "flimsy", "broken", "disappointing", "slow", "noisy", "useless"]
ITEMS = ["kettle", "laptop", "backpack", "headphones", "blender", "bicycle", "lamp", "camera", "tent", "phone"]
FILLER = ["I bought it last month for my sister.", "Shipping took about a week.",
          "The box arrived slightly dented.", "My neighbour has the same model.",
          "It comes in three colours, I chose the grey one.", "The manual is printed in four languages.",
          "We used it mostly on weekends.", "The price went up since then.",
          "Customer service answered the phone after ten minutes.", "It replaced an older one from 2015."]

def sentence(rng, words, item):
    w = rng.choice(words)
    return rng.choice([f"The {item} is {w}.", f"Honestly, a {w} {item}!", f"It feels {w}, really {w}.",
                       f"Overall: \"{w}\", and I mean it.", f"{w.capitalize()} build, {w} use."])

def review(rng):
    item = rng.choice(ITEMS)
    label = rng.choice(["pos", "neg", "mixed"])
    n = max(1, int(rng.lognormvariate(0.9, 0.8)))        # sentences: long tail
    if rng.random() < 0.004:
        n = rng.randint(45, 70)                          # outliers past 512 pieces
    parts = []
    for i in range(n):
        r = rng.random()
        if r < 0.5:
            parts.append(rng.choice(FILLER))
        elif label == "pos" or (label == "mixed" and i % 2 == 0):
            parts.append(sentence(rng, POS, item))
        else:
            parts.append(sentence(rng, NEG, item))
    if label == "mixed":   # a mixed review says both, whatever the filler did
        parts.insert(0, sentence(rng, POS, item)); parts.append(sentence(rng, NEG, item))
    elif not any(any(w in p for w in POS + NEG) for p in parts):
        parts.append(sentence(rng, POS if label == "pos" else NEG, item))
    sep = "\n" if rng.random() < 0.05 else " "           # a few embedded newlines
    return sep.join(parts), label

def write_reviews(path, n, rng):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\r\n")
        w.writerow(["id", "text", "label"])
        for i in range(n):
            t, l = review(rng)
            w.writerow([i, t, l])

CITIES = ["Arden", "Belmora", "Castria", "Dunmere", "Elsworth", "Fenwick", "Galloway", "Harrow", "Ilmar", "Jorvik"]
PEOPLE = ["Ada Marlow", "Bruno Keller", "Chen Wei", "Dara Okafor", "Emil Novak", "Farah Haddad", "Greta Lind"]
RIVERS = ["Silverrun", "Mossbeck", "Tallow", "Wyre", "Ouse", "Kelpie"]
GOODS = ["wool", "salt", "glass", "timber", "copper", "wine", "paper"]

def paragraph(rng):
    city, person, river, good = rng.choice(CITIES), rng.choice(PEOPLE), rng.choice(RIVERS), rng.choice(GOODS)
    year = str(rng.randint(900, 1900))
    facts = [(f"{city} was founded in {year} by {person}.", [(f"When was {city} founded?", year),
                                                           (f"Who founded {city}?", person)]),
             (f"The town lies on the river {river}.", [(f"Which river does {city} lie on?", river)]),
             (f"For centuries its wealth came from {good}.", [(f"What did {city}'s wealth come from?", good)])]
    rng.shuffle(facts)
    n_fill = max(0, int(rng.lognormvariate(1.2, 0.9)))
    if rng.random() < 0.01:
        n_fill = rng.randint(40, 60)
    text, qas = "", []
    fill = [f"Visitors often remark on the {rng.choice(['old', 'quiet', 'narrow', 'busy'])} streets.",
            "The market is held every Thursday.", "Several bridges were rebuilt after the flood.",
            "Its library holds a collection of maps.", "The climate is mild and wet."]
    for i, (sent, qs) in enumerate(facts):
        for _ in range(n_fill // 3 + (i < n_fill % 3)):
            text += rng.choice(fill) + " "
        base = len(text)
        text += sent + " "
        for q, a in qs:
            qas.append((q, a, base + sent.index(a)))
    return text.strip(), qas

def write_squad(path, n, rng, prefix):
    data, k = [], 0
    for i in range(n):
        ctx, qas = paragraph(rng)
        items = []
        for q, a, s in qas:
            assert ctx[s:s + len(a)] == a
            items.append({"id": f"{prefix}{k}", "question": q, "answers": [{"text": a, "answer_start": s}]})
            k += 1
        data.append({"title": f"t{i}", "paragraphs": [{"context": ctx, "qas": items}]})
    with open(path, "w") as f:
        json.dump({"version": "1.1", "data": data}, f, ensure_ascii=False)

def write_fortunes(path, rng, per_label=400):
    root = "/usr/share/games/fortunes"
    rows = []
    for name in ["literature", "science", "food", "law", "computers"]:
        p = os.path.join(root, name)
        if not os.path.exists(p):
            continue
        items = [t.strip() for t in open(p, encoding="utf-8", errors="replace").read().split("\n%\n") if t.strip()]
        rng.shuffle(items)
        rows += [(t, name) for t in items[:per_label]]
    rng.shuffle(rows)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)

def main():
    out = sys.argv[1]
    args = sys.argv[2:]
    opt = lambda k, d: int(args[args.index(k) + 1]) if k in args else d
    rng = random.Random(opt("--seed", 1234))
    os.makedirs(out, exist_ok=True)
    write_reviews(os.path.join(out, "reviews_train.csv"), opt("--train", 2000), rng)
    write_reviews(os.path.join(out, "reviews_dev.csv"), opt("--dev", 400), rng)
    write_squad(os.path.join(out, "squad_train.json"), opt("--train", 2000) // 4, rng, "tr")
    write_squad(os.path.join(out, "squad_dev.json"), opt("--dev", 400) // 4, rng, "dv")
    if "--fortunes" in args:
        write_fortunes(os.path.join(out, "fortunes.csv"), rng)

if __name__ == "__main__":
    main()
