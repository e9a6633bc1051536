"""Helpers for the companion's tests: the stock python3 kernel (Debian's
ipykernel) started from this .venv's python, where `make test` installed the
companion with `pip install .`, through a temporary kernelspec named python3
that shadows the system one; and the txkernel kernel under test beside it, so
each cell can be run on both and compared."""
import json, os, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
import txk_util as u  # noqa: E402

_py = {}


def python_kernel_name(python=None, preload=None):
    """A python3 kernelspec for `python` (default: $TXK_COMPANION_PYTHON, else
    this interpreter), shadowing the system python3 spec. The kernel runs
    $TXK_COMPANION_PRELOAD (Python, e.g. `import torch, transformers`) as it
    starts, before any cell: a notebook whose first cell imports torch."""
    python = python or os.environ.get("TXK_COMPANION_PYTHON") or sys.executable
    preload = preload if preload is not None else os.environ.get("TXK_COMPANION_PRELOAD")
    if (python, preload) not in _py:
        u.dev_kernel_name()  # sets JUPYTER_PATH/XDG_DATA_HOME for the txkernel spec first
        top = tempfile.mkdtemp(prefix="txk-py-")
        d = os.path.join(top, "kernels", "python3")
        os.makedirs(d)
        with open(os.path.join(d, "kernel.json"), "w") as f:
            json.dump({"argv": [python, "-Xfrozen_modules=off", "-m", "ipykernel_launcher",
                                "-f", "{connection_file}"]
                               + ([f"--IPKernelApp.exec_lines={preload}"] if preload else []),
                       "display_name": "Python 3 (ipykernel)", "language": "python",
                       "interrupt_mode": "signal",
                       "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}}, f)
        os.environ["JUPYTER_PATH"] = top + os.pathsep + os.environ.get("JUPYTER_PATH", "")
        _py[(python, preload)] = "python3"
    return _py[(python, preload)]


def start(kernel_name, cwd):
    from jupyter_client.manager import KernelManager
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel(cwd=cwd)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def run(kc, code, timeout=120, stop_on_error=False):
    """stop_on_error is off by default: with it on, ipykernel aborts the
    requests that reach it before it leaves its abort state after an error,
    and a test's next cell was, at times (CI, 2026-11-25: test_holder's
    %txadvise after its planned OOM came back with no output)."""
    reply, outs = u.run_cell(kc, code, timeout=timeout, stop_on_error=stop_on_error)
    return reply["content"], outs


def text(outs):
    """What a reader sees, output by output: stream text, error 'ename: evalue',
    text/plain of displays and results; update_display_data left out;
    consecutive writes to one stream joined."""
    parts, last_stream = [], None
    for o in outs:
        t, c = o["msg_type"], o["content"]
        if t == "stream":
            # ipykernel may merge or split writes into stream messages differently
            if last_stream == c["name"]:
                parts[-1] += c["text"]
            else:
                parts.append(c["text"])
            last_stream = c["name"]
            continue
        last_stream = None
        if t == "error":
            parts.append(c["ename"] + ": " + c["evalue"])
        elif t in ("display_data", "execute_result"):
            parts.append(c["data"].get("text/plain", ""))
    return parts


def errors(outs):
    return [o["content"] for o in outs if o["msg_type"] == "error"]
