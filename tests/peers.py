"""The Python peers interop tests run against, one row each: "old" (this
checkout's .venv: Debian torch 1.13 + transformers<4.41) and "new" (.venv-t2:
PyPI torch 2.x + transformers 5.x + huggingface_hub). TK_PEER_OLD and
TK_PEER_NEW name another interpreter for a row. pytest itself runs under
.venv; a test drives a row's interpreter as a subprocess."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = (("old", "TK_PEER_OLD", ".venv"), ("new", "TK_PEER_NEW", ".venv-t2"))


def peer_python(label):
    """The interpreter of row `label`, or None when it is not installed."""
    for name, var, venv in ROWS:
        if name == label:
            p = os.environ.get(var) or os.path.join(ROOT, venv, "bin", "python")
            return p if os.access(p, os.X_OK) else None
    raise KeyError(label)


def peer_rows():
    """[(label, python_path)] for the rows that exist here, old first."""
    return [(name, peer_python(name)) for name, _, _ in ROWS if peer_python(name)]
