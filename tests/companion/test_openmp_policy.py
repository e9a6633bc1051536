"""How the companion opens the engine with respect to OpenMP's wait policy
(python/txkernel/_engine.py, issue 28): libgomp reads OMP_WAIT_POLICY once,
when it loads, so the engine is opened with `passive` for that dlopen only
and the user's environment is restored; when libgomp was loaded before it
(torch does so on import; here ctypes stands in for torch) and the user set
no policy, `%load_ext` says so in one line; a policy the user set is theirs,
and nothing is said. Each case runs in a fresh Python."""
import os
import subprocess
import sys

import companion_util as cu

CASE = r"""
import ctypes, os, sys
if PRELOAD:
    ctypes.CDLL("libgomp.so.1")
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_cell("%load_ext txkernel").raise_error()
print("policy after:", os.environ.get("OMP_WAIT_POLICY"))
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libgomp" in l]
print("libgomp copies:", len(set(maps)))
"""


def run(preload, policy):
    # OMP_DISPLAY_ENV=verbose: libgomp prints, as it loads, how long its idle
    # workers spin (GOMP_SPINCOUNT: 0 passive, 300000 by default; its
    # OMP_WAIT_POLICY line says PASSIVE for both)
    env = dict({k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}, OMP_DISPLAY_ENV="verbose")
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    python = os.environ.get("TXK_COMPANION_PYTHON") or sys.executable
    r = subprocess.run([python, "-c", f"PRELOAD = {preload}\n" + CASE], capture_output=True, text=True,
                       env=env, cwd=cu.ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def test_passive_for_the_load_only():
    out, err = run(False, None)
    assert "policy after: None" in out and "libgomp copies: 1" in out, out
    assert "GOMP_SPINCOUNT = '0'" in err, err
    assert "txkernel: OpenMP" not in err, err


def test_libgomp_loaded_first_is_said():
    out, err = run(True, None)
    assert "GOMP_SPINCOUNT = '300000'" in err, err  # loaded before us, with the default
    assert "policy after: None" in out and "libgomp copies: 1" in out, out
    lines = [l for l in err.splitlines() if l.startswith("txkernel: OpenMP (libgomp) was already loaded")]
    assert len(lines) == 1, err
    assert "%load_ext txkernel` before `import torch`" in lines[0]
    assert "OMP_WAIT_POLICY'] = 'passive' before importing torch" in lines[0]


def test_the_users_policy_is_kept_and_nothing_said():
    out, err = run(True, "active")
    assert "policy after: active" in out, out
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in err and "txkernel: OpenMP" not in err, err
