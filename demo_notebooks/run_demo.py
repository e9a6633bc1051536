#!/usr/bin/env python3
"""Runs a demo notebook headless against the installed txkernel kernelspec
(nbclient), writes the executed notebook and an HTML export (nbconvert) under
demo_notebooks/out/, and prints where they are.

Which notebook: the lowest-numbered one given on the command line; else
01_*.ipynb if present; else 00_*.ipynb. Cells tagged raises-exception may
fail; any other error fails the run (exit 1)."""
import glob, os, sys

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = os.path.dirname(os.path.abspath(__file__))


def pick(args):
    if args:
        return sorted(args, key=os.path.basename)[0]
    for pattern in ("01_*.ipynb", "00_*.ipynb"):
        found = sorted(glob.glob(os.path.join(HERE, pattern)))
        if found:
            return found[0]
    sys.exit("run_demo: no demo notebook (01_*.ipynb or 00_*.ipynb) in " + HERE)


def main():
    path = pick(sys.argv[1:])
    nb = nbformat.read(path, as_version=4)
    kernel = nb.metadata.get("kernelspec", {}).get("name", "txkernel")
    print(f"run_demo: executing {os.path.relpath(path)} with kernel {kernel}", flush=True)
    client = NotebookClient(nb, kernel_name=kernel, timeout=600, resources={"metadata": {"path": HERE}})
    failed = None
    try:
        client.execute()
    except CellExecutionError as e:
        failed = e
    out = os.path.join(HERE, "out")
    os.makedirs(out, exist_ok=True)
    stem = os.path.splitext(os.path.basename(path))[0]
    nb_out = os.path.join(out, stem + ".ipynb")
    nbformat.write(nb, nb_out)
    from nbconvert import HTMLExporter
    html, _ = HTMLExporter().from_notebook_node(nb)
    html_out = os.path.join(out, stem + ".html")
    with open(html_out, "w", encoding="utf-8") as f:
        f.write(html)
    print(f"run_demo: executed notebook: {nb_out}")
    print(f"run_demo: HTML export:       {html_out}")
    if failed:
        print(f"run_demo: a cell failed:\n{failed}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
