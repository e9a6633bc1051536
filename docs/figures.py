#!/usr/bin/env python3
"""Renders the pictures the docs show from the engine itself (the companion's
libtxk.so through txkernel._engine), so a picture is what txkernel draws
today, not a drawing of it: `make docs` runs it.

  docs/img/seed-plan.svg   %%txplan of examples/seed_colab.yaml (the seed's
                           bert-base-cased, 512 tokens, batch 32, on a P4):
                           the planned peak by category, as a notebook shows it
"""
import os, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("TXK_ENGINE_LIB", os.path.join(ROOT, "build", "libtxk.so"))
from txkernel._engine import Engine  # noqa: E402


def svg_of(engine, cell):
    outs = []
    rc = engine.execute(cell, outs.append, catch_sigint=False)
    svgs = [o["data"]["image/svg+xml"] for o in outs if "image/svg+xml" in (o.get("data") or {})]
    if rc != 0 or not svgs:
        sys.exit(f"docs/figures.py: the engine drew nothing for {cell.splitlines()[0]!r} (rc {rc}): {outs}")
    return svgs[0]


def main():
    os.chdir(ROOT)
    e = Engine()
    with open("examples/seed_colab.yaml", encoding="utf-8") as f:
        svg = svg_of(e, "%%txplan\n" + f.read())
    out = os.path.join("docs", "img", "seed-plan.svg")
    with open(out, "w", encoding="utf-8") as f:
        f.write(svg + "\n")
    print(f"docs/figures.py: wrote {out}")


if __name__ == "__main__":
    main()
