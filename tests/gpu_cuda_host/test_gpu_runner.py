"""The GPU suite's runners, checked without a GPU (issue 33): what
tests/gpu_cuda/run.sh counts and prints, and what scripts/devkit_run.sh says
when the kit, a file of it, or the GPU is missing, and when the kit has no
wheel for the machine's Python.

run.sh runs stand-in test binaries and a stand-in python (shell scripts that
print closing lines the way the real tests do); devkit_run.sh unpacks a
small archive laid out as scripts/devkit.sh lays out the real one, with a
stand-in nvidia-smi (the one a machine without a GPU has: it prints "No
devices were found" and exits 6) and a stand-in pip wheel."""
import glob, os, subprocess, tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script(path, body):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, 0o755)


def run_sh(tmp_path, tests, py_body, **env):
    build = tmp_path / "build"
    (build / "gpu_tests").mkdir(parents=True)
    (build / "libtk_cuda.so").write_text("")
    for name, body in tests.items():
        script(str(build / "gpu_tests" / name), body)
    (build / "gpu_tests" / "gpu_x.d").write_text("")  # make's dependency files are not tests
    script(str(tmp_path / "python"), py_body)
    e = {k: v for k, v in os.environ.items()
         if k not in ("TXK_COMPANION_PYTHONPATH", "TXK_COMPANION_SKIP", "PYTHONPATH")}
    e.update(TXK_COMPANION_PYTHON=str(tmp_path / "python"), GPU_TEST_TIMEOUT="20", **env)
    r = subprocess.run(["bash", "tests/gpu_cuda/run.sh", str(build)], cwd=ROOT, env=e, capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stdout


# the python stand-in: gpu_txwatch.py prints its PYTHONPATH and passes; gpu_torchplan.py passes 7 rows
PY_OK = """case "$1" in
*gpu_txwatch.py) echo "PYTHONPATH=$PYTHONPATH"; echo "9 passed, 0 failed" ;;
*gpu_torchplan.py) echo "tiny: ratio 1.0000: ok"; echo "7 passed, 0 failed" ;;
esac
"""


def test_run_sh_counts_skips_and_failures(tmp_path):
    rc, out = run_sh(tmp_path, {
        "gpu_a": 'echo "3 passed, 0 failed"\n',
        "gpu_b": 'echo "gpu_b: skipped: needs 2 GPUs, this machine has 1"; echo "0 passed, 0 failed, 1 skipped"\n',
        "gpu_c": "echo boom; exit 3\n",                     # crashed: no closing line
        "gpu_d": 'echo "2 passed, 0 failed"; exit 1\n',      # non-zero exit with nothing failed
        "gpu_e": 'echo "0 passed, 0 failed"\n',             # ran nothing
    }, PY_OK)
    lines = out.splitlines()
    assert lines[-1] == "21 passed, 3 failed, 1 skipped", out
    assert rc == 1
    assert any(l.startswith("gpu_a: 3 passed, 0 failed, 0 skipped") for l in lines), out
    assert any(l.startswith("gpu_b: 0 passed, 0 failed, 1 skipped") for l in lines), out
    assert "    gpu_b: skipped: needs 2 GPUs, this machine has 1" in lines, out  # a skip shows its reason
    assert any(l.startswith("gpu_c: 0 passed, 1 failed") for l in lines) and "    boom" in lines, out
    assert any(l.startswith("gpu_d: 2 passed, 1 failed") for l in lines), out
    assert "    gpu_e: ran nothing" in lines, out
    assert not any(l.startswith("gpu_x") for l in lines), out
    assert "    tiny: ratio 1.0000: ok" in lines, out  # gpu_torchplan's rows always show


def test_run_sh_all_passed_and_companion_path(tmp_path):
    rc, out = run_sh(tmp_path, {"gpu_a": 'echo "3 passed, 0 failed"\n'}, PY_OK,
                     TXK_COMPANION_PYTHONPATH="/kit/site:/kit/companion")
    assert rc == 0 and out.splitlines()[-1] == "19 passed, 0 failed, 0 skipped", out
    # the kit's site reaches gpu_txwatch (shown here only because the stand-in fails below)
    rc, out = run_sh(tmp_path / "2", {"gpu_a": 'echo "3 passed, 0 failed"\n'},
                     PY_OK.replace('"9 passed, 0 failed"', '"0 passed, 1 failed"'),
                     TXK_COMPANION_PYTHONPATH="/kit/site:/kit/companion")
    assert "    PYTHONPATH=/kit/site:/kit/companion" in out.splitlines(), out
    assert rc == 1 and out.splitlines()[-1] == "10 passed, 1 failed, 0 skipped", out


# ---- devkit_run.sh ------------------------------------------------------------

def make_kit(tmp_path, leave_out=(), pythons="3.12", pip_says="ERROR: No matching distribution found for debugpy>=1.0",
             bodies=None):
    """An archive with the real kit's layout (scripts/devkit.sh); pip's wheel
    is a folder whose pip/__main__.py prints pip_says and fails. bodies:
    {kit path: shell script} for stand-ins that must say something."""
    stage = tmp_path / "stage"
    files = ["build/libtk_cuda.so", "build/txk", "build/bench/train_cpu", "build/bench/attn_gpu", "companion/txkernel/_engine.py",
             "companion/txkernel/libtxk.so", "wheels/requirements.txt", "COMMIT"]
    files += ["build/gpu_tests/" + os.path.basename(s)[:-2]
              for s in glob.glob(os.path.join(ROOT, "tests/gpu_cuda/gpu_*.c"))]
    for f in files:
        if f not in leave_out:
            (stage / f).parent.mkdir(parents=True, exist_ok=True)
            (stage / f).write_text("#!/bin/sh\n" + bodies[f] if bodies and f in bodies else "")
    (stage / "wheels" / "PYTHONS").write_text(pythons.replace(" ", "\n") + "\n")
    pip = stage / "wheels" / "pip-0-py3-none-any.whl" / "pip"
    pip.mkdir(parents=True)
    (pip / "__main__.py").write_text(f"import sys\nprint({pip_says!r}, file=sys.stderr)\nsys.exit(1)\n")
    archive = tmp_path / "kit.tar.xz"
    with tarfile.open(archive, "w:xz") as t:
        t.add(stage, arcname=".")
    return archive


def devkit_run(tmp_path, archive, *steps, gpu=False, ldd=None, **env):
    bin_ = tmp_path / "bin"
    script(str(bin_ / "nvidia-smi"), 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n' if gpu else
           'echo "No devices were found"; exit 6\n')
    if ldd is not None:
        script(str(bin_ / "ldd"), ldd)
    e = dict(os.environ, DEVKIT_ARCHIVE=str(archive), KIT=str(tmp_path / "kit"), OUT=str(tmp_path / "out"),
             PATH=f"{bin_}:{os.environ['PATH']}", **env)
    r = subprocess.run(["bash", "scripts/devkit_run.sh", *steps], cwd=ROOT, env=e, capture_output=True, text=True,
                       timeout=60)
    return r.returncode, r.stdout + r.stderr


def test_devkit_run_names_a_missing_archive(tmp_path):
    rc, out = devkit_run(tmp_path, tmp_path / "absent.tar.xz", "info", "test")
    assert rc == 2 and f"no {tmp_path / 'absent.tar.xz'} here" in out and "scripts/devkit.sh" in out, out


def test_devkit_run_names_what_the_kit_lacks(tmp_path):
    archive = make_kit(tmp_path, leave_out=("build/txk", "build/gpu_tests/gpu_model"))
    rc, out = devkit_run(tmp_path, archive, "info", "test")
    assert rc == 2 and "lacks: build/txk build/gpu_tests/gpu_model" in out, out


def test_devkit_run_names_the_missing_gpu(tmp_path):
    rc, out = devkit_run(tmp_path, make_kit(tmp_path), "info", "test")
    assert rc == 2, out
    assert "no NVIDIA GPU here: nvidia-smi -L lists none (No devices were found)" in out, out


@pytest.mark.parametrize("pythons, skips", [("3.0", True), ("{v}", False)], ids=["not-packed-for-it", "packed-for-it"])
def test_devkit_run_skips_only_without_a_wheel_for_this_python(tmp_path, pythons, skips):
    """The companion step needs no GPU. The kit's pip finds no distribution:
    a skip when the kit was not packed for this Python, a failure when it was
    (the kit is incomplete)."""
    v = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                       text=True).stdout.strip()
    rc, out = devkit_run(tmp_path, make_kit(tmp_path, pythons=pythons.format(v=v)), "companion")
    if skips:
        assert rc == 0, out
        assert f"the kit has no wheels for Python {v}" in out and "it was packed for Python 3.0" in out, out
        assert "No matching distribution found for debugpy" in out, out
    else:
        assert rc == 1 and f"installing the kit wheels for Python {v}" in out and "failed" in out, out


# ---- devkit_run.sh short: one call of at most 10 minutes on a card (issue 43) ----

SAYS = 'echo "$(basename "$0") TK_TEST_ONLY=${TK_TEST_ONLY:-} $*"\n'
LDD_OK = """case "$1" in
--version) echo "ldd (GNU libc) 2.39" ;;
*) echo "\tlibcublasLt.so.13 => /usr/local/cuda/lib64/libcublasLt.so.13" ;;
esac
"""


def short_kit(tmp_path):
    return make_kit(tmp_path, bodies={"build/gpu_tests/gpu_ops": SAYS, "build/gpu_tests/gpu_model": SAYS,
                                      "build/bench/attn_gpu": SAYS})


def test_devkit_run_short_runs_each_check_in_order(tmp_path):
    """The short step: the attention and fast-vs-reference tests, the decline
    counters, attn_gpu at p 0 and 0.1, the step at 32 x 512 fp16 without
    CUPTI beside HF; its log in $OUT."""
    py = tmp_path / "py"
    script(str(py), 'echo "python $* TXK_CUPTI=${TXK_CUPTI:-}"\n')
    rc, out = devkit_run(tmp_path, short_kit(tmp_path), "short", gpu=True, ldd=LDD_OK, PYTHON=str(py))
    assert rc == 0, out
    want = ["gpu_ops TK_TEST_ONLY=attention", "gpu_ops TK_TEST_ONLY=fast_vs_reference",
            "gpu_model TK_TEST_ONLY=lt_declines",
            "attn_gpu TK_TEST_ONLY= --seq 128,512 --dtypes fp16,bf16 --p 0,0.1 --reps 10",
            f"python bench/train_gpu/run.py {tmp_path / 'kit'}/build --rows 512xfp16 --no-cupti TXK_CUPTI="]
    at = [out.find(w) for w in want]
    assert all(i >= 0 for i in at) and at == sorted(at), out
    assert (tmp_path / "out" / "short.log").read_text().count("---") == 6


def test_devkit_run_short_stops_when_ldd_finds_a_library_missing(tmp_path):
    ldd = LDD_OK.replace("=> /usr/local/cuda/lib64/libcublasLt.so.13", "=> not found")
    assert "not found" in ldd
    rc, out = devkit_run(tmp_path, short_kit(tmp_path), "short", "test", gpu=True, ldd=ldd)
    assert rc == 1, out
    assert "libcublasLt.so.13 => not found" in out and "a library is not found (above): stopping" in out, out
    assert "TK_TEST_ONLY" not in out and "=== test" not in out, out  # nothing after it ran
