"""The installed kernelspec (make install) end to end: a notebook executed by
nbclient with its outputs checked, and jupyter console answering a cell."""
import os, subprocess, sys

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOUR = os.path.join(ROOT, "demo_notebooks", "00_kernel_tour.ipynb")


def test_kernelspec_installed():
    spec = KernelSpecManager().get_kernel_spec("txkernel")
    assert spec.display_name == "txkernel (BERT OOM doctor)"
    assert os.path.isabs(spec.argv[0]) and os.access(spec.argv[0], os.X_OK)
    assert spec.argv[1:] == ["-f", "{connection_file}"]
    assert os.path.exists(os.path.join(spec.resource_dir, "logo-64x64.png"))


def test_notebook_runs_with_nbclient():
    nb = nbformat.read(TOUR, as_version=4)
    NotebookClient(nb, kernel_name="txkernel", timeout=60).execute()
    cells = [c for c in nb.cells if c.cell_type == "code"]
    by_src = {c.source.splitlines()[0]: c for c in cells}
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))
    out = by_src["%txversion"].outputs
    assert out[0].output_type == "execute_result"
    assert out[0].data["text/plain"] == "txkernel 0.1.0 (Jupyter protocol 5.3)"
    ls = by_src["%lsmagic"].outputs[0]
    assert ls.output_type == "display_data" and "%sleep" in ls.data["text/plain"] and "<table>" in ls.data["text/html"]
    echo = by_src["%echo hello from txkernel"].outputs
    assert [(o.name, o.text) for o in echo] == [("stdout", "hello from txkernel\n"), ("stderr", "this line went to stderr\n")]
    # the update replaced the display in place: one output showing the last text
    prog = by_src["%echo --display progress step 0 of 3"].outputs
    assert len(prog) == 1 and prog[0].data["text/plain"] == "step 3 of 3 (done)"
    assert by_src["%%echo"].outputs[0].text.startswith("model: bert-base-cased\n")
    err = by_src["%txverison"].outputs
    assert err[0].output_type == "error" and "did you mean %txversion?" in err[0].evalue


def test_jupyter_console_answers():
    # jupyter console 6.4 with piped stdin sometimes shows its first prompt
    # and then nothing until the timeout (1 run in 6 here, 2026-11-25; the
    # cause is not found yet, and the next console is answered at once): one
    # more try with a fresh console and kernel; a kernel that never answers
    # still fails both
    cmd = [sys.executable, "-m", "jupyter", "console", "--kernel", "txkernel", "--simple-prompt"]
    feed = "%echo hello from console\n%txversion\n"
    try:
        r = subprocess.run(cmd, input=feed, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        r = subprocess.run(cmd, input=feed, capture_output=True, text=True, timeout=60)
    assert "hello from console" in r.stdout, r.stdout + r.stderr
    assert "txkernel 0.1.0 (Jupyter protocol 5.3)" in r.stdout
