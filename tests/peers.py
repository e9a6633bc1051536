"""The test rows: each row is one Python whose packages are the peers the
interop tests hold txkernel against (PyTorch, transformers, huggingface_hub,
tokenizers, safetensors).

- torch1: `.venv`, Debian's torch 1.13 with `transformers<4.41` (2022's
  stack; pytest itself runs here);
- torch2: `.venv-t2`, PyPI's torch 2.x (used on the CPU), transformers 5.x,
  huggingface_hub (what users run today).

scripts/deps.sh makes both. tests/conftest.py runs every test marked `peer`
once per row; tests/run_all.py prints each row's versions.
"""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = (("torch1", ".venv"), ("torch2", ".venv-t2"))
PACKAGES = ("torch", "transformers", "huggingface_hub", "tokenizers", "safetensors")


def peer_rows():
    """[(label, python)]: each row's interpreter as an absolute path, also
    when it is absent (a test on that row then fails naming the path)."""
    return [(label, os.path.join(ROOT, venv, "bin", "python")) for label, venv in ROWS]


_versions = {}


def versions(python):
    """One line: the Python and peer package versions `python` has, read from
    the installed distributions (importlib.metadata, nothing imported), or
    why they could not be read."""
    if python not in _versions:
        if not os.access(python, os.X_OK):
            _versions[python] = f"{python} is missing (scripts/deps.sh, run by make test, installs it)"
        else:
            code = ("import importlib.metadata as m, platform\n"
                    "def v(p):\n"
                    "    try:\n        return m.version(p)\n"
                    "    except m.PackageNotFoundError:\n        return 'not installed'\n"
                    f"print(', '.join(['python ' + platform.python_version()] + [p + ' ' + v(p) for p in {PACKAGES!r}]))")
            r = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=60)
            _versions[python] = r.stdout.strip() if r.returncode == 0 else f"{python} failed: {r.stdout.strip()}"
    return _versions[python]
