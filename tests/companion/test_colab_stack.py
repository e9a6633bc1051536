"""The Colab row: the companion's tests in a python3 kernel on Colab's own
Jupyter stack, at the versions Colab's runtime pins (IPython 7.34.0,
ipykernel 6.17.1, jupyter_client 7.4.9), with torch 2.x and transformers 5.x
imported as the kernel starts, before any cell (a notebook that begins with
`import torch`). The kernel's interpreter is .venv-colab's (scripts/deps.sh
makes it; it reaches .venv-t2's torch through a .pth file; `make
companion-install` installs the companion into it). The tests run are the
ones that depend on the kernel and its Python: `%load_ext` and the magics
with their errors as one line (against the txkernel kernel), live progress,
heartbeat and control during training and the interrupt
(test_load_ext.py), and %txdevice's line about the real torch, a training
cell beside it, and the kernel's versions checked from inside it
(test_real_torch.py). The Debian row (.venv: IPython 8, ipykernel 6.x,
torch 1.13) runs every companion test as its own files."""
import json
import os
import subprocess
import sys

import companion_util as cu

COLAB = os.path.join(cu.ROOT, ".venv-colab", "bin", "python")
PINS = {"IPython": "7.34.0", "ipykernel": "6.17.1", "jupyter_client": "7.4.9"}
TESTS = ["tests/companion/test_load_ext.py::test_errors_same_as_txkernel_and_next_cell_runs",
         "tests/companion/test_load_ext.py::test_training_keeps_kernel_alive_and_interrupt_stops_within_a_step",
         "tests/companion/test_real_torch.py"]


def versions():
    code = ("import json, sys, IPython, ipykernel, jupyter_client, torch, transformers, txkernel, os\n"
            "print(json.dumps({'python': sys.version.split()[0], 'IPython': IPython.__version__,"
            " 'ipykernel': ipykernel.__version__, 'jupyter_client': jupyter_client.__version__,"
            " 'torch': torch.__version__, 'transformers': transformers.__version__,"
            " 'torch_at': os.path.dirname(torch.__file__), 'txkernel_at': os.path.dirname(txkernel.__file__)}))")
    r = subprocess.run([COLAB, "-c", code], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, ".venv-colab lacks a piece (scripts/deps.sh, make companion-install): " + r.stderr
    return json.loads(r.stdout)


def test_companion_tests_on_colabs_stack():
    # make test's scripts/deps.sh makes the row, so a missing one fails, naming it
    assert os.path.exists(COLAB), f"{COLAB} is missing: scripts/deps.sh makes it (after .venv-t2)"
    v = versions()
    print("Colab row:", v)
    for name, pin in PINS.items():
        assert v[name] == pin, (name, v)
    assert v["torch"].startswith("2.") and v["transformers"].startswith("5."), v
    # one torch on disk: .venv-t2's, through the .pth file
    assert os.path.realpath(v["torch_at"]).startswith(os.path.realpath(os.path.join(cu.ROOT, ".venv-t2"))), v
    expect = ",".join(f"{k}={x}" for k, x in PINS.items()) + ",torch=2.,transformers=5."
    env = dict(os.environ, TXK_COMPANION_PYTHON=COLAB, TXK_COMPANION_PRELOAD="import torch, transformers",
               TXK_COMPANION_EXPECT=expect)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s", *TESTS],
                       capture_output=True, text=True, env=env, cwd=cu.ROOT)
    tail = "\n".join(r.stdout.splitlines()[-40:])
    assert r.returncode == 0 and "5 passed" in r.stdout, f"Colab row {v}:\n{tail}\n{r.stderr[-2000:]}"
