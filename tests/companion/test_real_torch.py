"""The companion beside the real torch of the kernel's interpreter (Debian's
torch 1.13 in .venv; torch 2.x on the Colab row, test_colab_stack.py), on
the CPU: torch is imported before `%load_ext txkernel`, as in a notebook
whose first cell is `import torch`, so torch's libgomp (the soname the
engine links) is already loaded when the engine comes. %txdevice says what
that torch holds (no CUDA device here, said plainly), and a training cell
runs beside it and reports its result. The kernel's own stack (Python,
IPython, ipykernel, jupyter_client, torch, transformers) is reported, and
checked against $TXK_COMPANION_EXPECT when set (`name=version-prefix,...`,
as test_colab_stack.py sets it)."""
import json
import os

import pytest

import companion_util as cu

DATA = os.path.join(cu.ROOT, "tests", "data")


@pytest.fixture(scope="module")
def py():
    km, kc = cu.start(cu.python_kernel_name(), cu.ROOT)
    rep, outs = cu.run(kc, "import torch\nprint(torch.__version__)")
    assert rep["status"] == "ok", cu.text(outs)
    rep, outs2 = cu.run(kc, "%load_ext txkernel")
    assert rep["status"] == "ok", cu.text(outs2)
    yield km, kc, cu.text(outs)[0].strip()
    cu.u.stop(km, kc)


STACK = """
import json, sys, importlib
v = {"python": sys.version.split()[0]}
for m in ("IPython", "ipykernel", "jupyter_client", "torch", "transformers"):
    v[m] = importlib.import_module(m).__version__ if m in sys.modules or m != "transformers" else None
print(json.dumps(v))
"""


def test_the_kernels_stack(py):
    _, kc, _ = py
    rep, outs = cu.run(kc, STACK)
    assert rep["status"] == "ok", cu.text(outs)
    got = json.loads(cu.text(outs)[0])
    print("companion kernel:", got)
    want = os.environ.get("TXK_COMPANION_EXPECT")
    for item in (want.split(",") if want else []):
        name, prefix = item.split("=")
        assert got.get(name) and got[name].startswith(prefix), (name, prefix, got)


def test_txdevice_says_what_the_real_torch_holds(py):
    _, kc, version = py
    rep, outs = cu.run(kc, "%txdevice")
    shown = "\n".join(cu.text(outs))
    assert rep["status"] == "ok", shown
    assert "PyTorch in this process sees no CUDA device (torch.cuda.is_available() is False): " \
           "it holds no GPU memory" in shown, (version, shown)


def test_trains_beside_torch(py):
    _, kc, version = py
    code = ("%%txtrain\nmodel: bert-tiny\ninit: random\n"
            f"vocab: {DATA}/vocab_uncased.txt\ntrain_file: {DATA}/reviews_train.csv\n"
            "dev_split: 0\nmax_examples: 64\nmax_len: 64\nbatch_size: 16\nmax_steps: 3\ndevice: cpu\n")
    rep, outs = cu.run(kc, code)
    shown = "\n".join(cu.text(outs))
    assert rep["status"] == "ok", (version, shown)
    assert "Trained 3 steps" in shown, shown
    # the result is the engine's, shown by IPython: its vendor data travelled too
    assert any("application/vnd.txkernel.result+json" in (o["content"].get("data") or {}) for o in outs)
