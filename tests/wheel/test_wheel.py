"""`make wheel` as a release would build it, installed as a user would
(issue 42): a fresh venv of /usr/bin/python3 with the system's site packages
(for IPython), `pip install --no-index` of the wheel, nothing else.

- the file: dist/txkernel_bert-VERSION-py3-none-manylinux_2_XX_x86_64.whl,
  XX <= 35 (Colab's and Kaggle's glibc), at most 100 MB; inside: the engine,
  the cuda plugin with SASS for sm_75 .. sm_120, txk and txkernel, the
  kernelspec installer and the three commands;
- installed: every NEEDED library of every ELF file resolves inside the
  wheel (its RPATH), to glibc, to the compiler runtime (libgcc_s,
  libstdc++) or to NVIDIA's driver/CUDA libraries, and no symbol asks for
  glibc newer than 2.35;
- run from it, in a folder away from the checkout: `%load_ext txkernel` in
  IPython, a plan and a short CPU training cell; `txk` plans; `txkernel
  --version`; `txkernel-kernelspec` writes a spec that starts the wheel's
  binary.
The install time is printed (bench/RESULTS.md "## wheel" has the figures)."""
import glob, os, re, shutil, subprocess, sys, textwrap, time, zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
NAME_RE = re.compile(r"^txkernel_bert-(\d+\.\d+\.\d+)-py3-none-manylinux_2_(\d+)_x86_64\.whl$")

GLIBC = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "ld-linux-x86-64.so.2",
         "libresolv.so.2", "libutil.so.1", "libanl.so.1"}
COMPILER_RUNTIME = {"libgcc_s.so.1", "libstdc++.so.6"}
NVIDIA = re.compile(r"^lib(cuda|nvidia-ml|cublas|cublasLt|cupti|nccl)\.so(\.\d+)*$")

if not shutil.which("nvcc") and not os.path.exists(CUDA_HOME + "/bin/nvcc"):
    pytest.skip("nvcc not found: the wheel carries the cuda plugin and cannot be built here",
                allow_module_level=True)


def clean_env(**extra):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("TXK_", "PYTHON", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "JUPYTER", "CUDA_"))}
    e.update(extra)
    return e


@pytest.fixture(scope="module")
def wheel():
    # the build tools come from scripts/deps.sh (make test's set-up): the
    # test itself never reaches PyPI
    assert os.path.exists(os.path.join(ROOT, ".venv-wheel", "bin", "auditwheel")), \
        ".venv-wheel is missing: scripts/deps.sh makes it (bash scripts/wheel.sh --tools)"
    for old in glob.glob(os.path.join(ROOT, "dist", "txkernel_bert-*.whl")):
        os.remove(old)
    r = subprocess.run(["make", "--no-print-directory", "wheel"], cwd=ROOT, capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    found = glob.glob(os.path.join(ROOT, "dist", "txkernel_bert-*.whl"))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    top = tmp_path_factory.mktemp("wheel")
    v = top / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(v)], check=True)
    py = str(v / "bin" / "python")
    t0 = time.monotonic()
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", wheel],
                       capture_output=True, text=True, env=clean_env(), cwd=str(top))
    secs = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"pip install of {os.path.basename(wheel)} into a fresh venv: {secs:.1f} s")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return {"top": top, "dir": v, "py": py, "site": site, "secs": secs}


def test_file_name_and_size(wheel):
    m = NAME_RE.match(os.path.basename(wheel))
    assert m, os.path.basename(wheel)
    assert int(m.group(2)) <= 35, f"needs glibc 2.{m.group(2)}: Colab and Kaggle have 2.35"
    mb = os.path.getsize(wheel) / 2**20
    print(f"{os.path.basename(wheel)}: {mb:.1f} MB")
    assert mb <= 100, f"{mb:.1f} MB"


def test_contents(wheel, tmp_path):
    z = zipfile.ZipFile(wheel)
    names = set(z.namelist())
    for f in ("txkernel/__init__.py", "txkernel/_engine.py", "txkernel/kernelspec.py", "txkernel/libtxk.so",
              "txkernel/libtk_cuda.so", "txkernel/bin/txk", "txkernel/bin/txkernel",
              "txkernel/kernelspec/logo-64x64.png"):
        assert f in names, f
    libs = [n for n in names if n.startswith("txkernel_bert.libs/")]
    assert any(n.startswith("txkernel_bert.libs/libjansson") for n in libs), libs
    ep = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = z.read(ep[0]).decode()
    for cmd in ("txk = txkernel._cli:txk", "txkernel = txkernel._cli:txkernel",
                "txkernel-kernelspec = txkernel.kernelspec:main"):
        assert cmd in text, text
    wheel_meta = z.read([n for n in names if n.endswith(".dist-info/WHEEL")][0]).decode()
    assert "Root-Is-Purelib: false" in wheel_meta and "Tag: py3-none-manylinux_2_" in wheel_meta, wheel_meta
    plugin = tmp_path / "libtk_cuda.so"
    plugin.write_bytes(z.read("txkernel/libtk_cuda.so"))
    sass, ptx = fatbin_archs(str(plugin))
    assert {75, 80, 86, 89, 90, 100, 120} <= sass, sorted(sass)
    assert 120 in ptx, sorted(ptx)


def fatbin_archs(path):
    """(SASS architectures, PTX architectures) in an ELF file's .nv_fatbin
    section, read from the fat binary's own headers (magic 0xBA55ED50; each
    entry: kind 2 cubin / 1 PTX, its header size and padded payload size,
    the sm number at byte 28): this toolkit has no cuobjdump."""
    import struct
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True).stdout
    sec = [l.split("]", 1)[1].split() for l in out.splitlines() if " .nv_fatbin " in l]
    assert sec, "no .nv_fatbin section in " + path
    off, size = int(sec[0][3], 16), int(sec[0][4], 16)
    with open(path, "rb") as f:
        f.seek(off)
        data = f.read(size)
    sass, ptx, pos = set(), set(), 0
    while pos + 16 <= len(data):
        magic, _, hsz, fsz = struct.unpack_from("<IHHQ", data, pos)
        if magic != 0xBA55ED50:
            pos += 8
            continue
        e, end = pos + hsz, pos + hsz + fsz
        while e < end:
            kind, _, ehsz, padded = struct.unpack_from("<HHII", data, e)
            sm = struct.unpack_from("<I", data, e + 28)[0]
            (sass if kind == 2 else ptx).add(sm)
            e += ehsz + padded
        pos = end
    return sass, ptx


def elf_files(root):
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p) and os.path.isfile(p):
                with open(p, "rb") as fh:
                    if fh.read(4) == b"\x7fELF":
                        yield p


def dynamic(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    rpath = re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library (?:rpath|runpath): \[(.+?)\]", out)
    dirs = []
    for r in rpath:
        dirs += [x.replace("$ORIGIN", os.path.dirname(path)) for x in r.split(":")]
    return needed, dirs


def installed_elves(venv):
    files = list(elf_files(os.path.join(venv["site"], "txkernel"))) + \
        list(elf_files(os.path.join(venv["site"], "txkernel_bert.libs")))
    assert any(f.endswith("libtk_cuda.so") for f in files) and any(f.endswith("/bin/txk") for f in files)
    return files


def test_needed_libraries_resolve(venv):
    bad = []
    for f in installed_elves(venv):
        needed, dirs = dynamic(f)
        for n in needed:
            if n in GLIBC or n in COMPILER_RUNTIME or NVIDIA.match(n):
                continue
            if any(os.path.exists(os.path.join(d, n)) for d in dirs):
                continue
            bad.append(f"{os.path.relpath(f, venv['site'])} needs {n}, which is not in the wheel")
    assert not bad, "\n".join(bad)


def test_no_symbol_newer_than_glibc_2_35(venv):
    bad = []
    for f in installed_elves(venv):
        out = subprocess.run(["objdump", "-T", f], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            m = re.search(r"\bGLIBC_2\.(\d+)\b", line)
            if m and int(m.group(1)) > 35:
                bad.append(f"{os.path.relpath(f, venv['site'])}: {line.split()[-1]} (GLIBC_2.{m.group(1)})")
    assert not bad, "\n".join(bad)


def test_no_cuda_runtime_or_blas_needed(venv):
    """The plugin needs no CUDA library at load time: cudart is linked in,
    cuBLAS/CUPTI are opened when a device is (test_cuda_libs.py)."""
    plugin = os.path.join(venv["site"], "txkernel", "libtk_cuda.so")
    needed, _ = dynamic(plugin)
    assert not [n for n in needed if re.match(r"lib(cudart|cublas|cupti|cuda)\b", n)], needed


COMPANION = textwrap.dedent(r'''
    import os, sys, txkernel
    from IPython.core.interactiveshell import InteractiveShell
    print("FROM", os.path.dirname(txkernel.__file__))
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "txkernel")
    plan = """model: bert-base-cased
    max_len: 128
    batch_size: 8
    gpu: t4
    """
    r = sh.run_cell("%%txplan\n" + plan)
    print("PLAN_OK", r.success)
    train = """model: bert-tiny
    init: random
    vocab: {data}/vocab_cased.txt
    train_file: {data}/reviews_train.csv
    max_len: 64
    batch_size: 16
    max_examples: 64
    lr: 2e-3
    dropout: 0.0
    device: {{capacity: 200MiB, threads: 1}}
    """.format(data=sys.argv[1])
    r = sh.run_cell("%%txtrain --no-plan\n" + train)
    print("TRAIN_OK", r.success)
''')


def test_companion_from_the_wheel(venv):
    script = venv["top"] / "companion.py"
    script.write_text(COMPANION)
    r = subprocess.run([venv["py"], str(script), DATA], capture_output=True, text=True, timeout=600,
                       cwd=str(venv["top"]), env=clean_env(OMP_NUM_THREADS="1"))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"FROM {venv['site']}/txkernel" in out, out[-4000:]
    assert "PLAN_OK True" in out and "TRAIN_OK True" in out, out[-4000:]
    assert "Plan: batch 8 x seq 128" in out, out[-4000:]
    assert re.search(r"Trained 12 steps in [0-9.]+ s\. Peak", out), out[-4000:]


def test_commands_from_the_wheel(venv, tmp_path):
    bindir = venv["dir"] / "bin"
    env = clean_env()
    r = subprocess.run([str(bindir / "txkernel"), "--version"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.startswith("txkernel "), r.stdout + r.stderr
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model: bert-base-cased\nmax_len: 128\nbatch_size: 8\ngpu: t4\n")
    r = subprocess.run([str(bindir / "txk"), "plan", str(cfg), "--json"], capture_output=True, text=True,
                       env=env, cwd=str(tmp_path), timeout=120)
    assert r.returncode in (0, 3), r.stdout + r.stderr
    assert '"model"' in r.stdout or '"fits"' in r.stdout, r.stdout[:2000]
    r = subprocess.run([str(bindir / "txkernel-kernelspec"), "--prefix", str(tmp_path / "jup")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    spec = json.load(open(tmp_path / "jup" / "share" / "jupyter" / "kernels" / "txkernel" / "kernel.json"))
    exe = spec["argv"][0]
    assert exe.startswith(venv["site"]) and os.access(exe, os.X_OK), spec
    assert spec["env"]["TXK_CUDA_PLUGIN"] == os.path.join(venv["site"], "txkernel", "libtk_cuda.so"), spec
    assert os.path.exists(tmp_path / "jup" / "share" / "jupyter" / "kernels" / "txkernel" / "logo-64x64.png")


def test_colab_setup_installs_the_wheel(wheel, tmp_path):
    """scripts/colab_setup.sh --wheel: no apt, no build; the companion and
    the kernelspec from the wheel (here under --prefix, no root needed)."""
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "colab_setup.sh"), "--prefix", str(tmp_path / "p"),
                        "--python", "/usr/bin/python3", "--wheel", wheel],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "txkernel is installed from the wheel" in r.stdout, r.stdout
    assert not os.path.exists(os.path.join(ROOT, "build", "wheel-stage")), "the wheel mode built something"
    spec = tmp_path / "p" / "share" / "jupyter" / "kernels" / "txkernel" / "kernel.json"
    assert spec.exists(), r.stdout


def test_kernel_from_the_wheels_kernelspec(venv, tmp_path):
    """The txkernel kernel, started by Jupyter from the spec
    txkernel-kernelspec wrote (the wheel's binary, its zmq and sodium from
    txkernel_bert.libs), answers kernel_info and plans a cell."""
    from jupyter_client.manager import KernelManager
    r = subprocess.run([str(venv["dir"] / "bin" / "txkernel-kernelspec"), "--prefix", str(tmp_path)],
                       capture_output=True, text=True, env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(tmp_path / "share" / "jupyter")
    try:
        km = KernelManager(kernel_name="txkernel")
        assert km.kernel_spec.argv[0].startswith(venv["site"]), km.kernel_spec.argv
        km.start_kernel(cwd=str(tmp_path))
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            msg_id = kc.execute("%%txplan\nmodel: bert-base-cased\nmax_len: 128\nbatch_size: 8\ngpu: t4\n")
            reply = kc.get_shell_msg(timeout=120)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = kc.get_shell_msg(timeout=120)
            assert reply["content"]["status"] == "ok", reply["content"]
            texts = []
            while True:
                m = kc.get_iopub_msg(timeout=30)
                if m["parent_header"].get("msg_id") != msg_id:
                    continue
                if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                    break
                data = m["content"].get("data", {})
                texts.append(data.get("text/plain", "") + m["content"].get("text", ""))
            assert any("Plan: batch 8 x seq 128" in t for t in texts), texts
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old


TORCH_FIRST = textwrap.dedent(r'''
    import re, sys
    import torch  # what a Colab notebook does before %load_ext
    from IPython.core.interactiveshell import InteractiveShell
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "txkernel")
    print("NOTE", sys.modules["txkernel._engine"].OPENMP_NOTE)
    print("GOMP", sorted(set(re.findall(r"/\S*libgomp\S*", open("/proc/self/maps").read()))))
    r = sh.run_cell("""%%txtrain --no-plan
    model: bert-tiny
    init: random
    vocab: {data}/vocab_cased.txt
    train_file: {data}/reviews_train.csv
    max_len: 64
    batch_size: 16
    max_examples: 32
    epochs: 1
    lr: 2e-3
    device: {{capacity: 200MiB, threads: 1}}
    """.format(data=sys.argv[1]))
    print("TRAIN_OK", r.success)
''')


def test_companion_after_torch(venv):
    """torch (the system's, through --system-site-packages) imported before
    %load_ext: the wheel's engine brings its own libgomp (auditwheel's
    renamed copy), which reads the passive policy as it loads, so there is
    no note about torch's libgomp, and a training cell runs beside torch."""
    r = subprocess.run([venv["py"], "-c", "import torch"], capture_output=True, text=True, env=clean_env())
    if r.returncode != 0:
        pytest.skip("no torch among the system's site packages: " + r.stderr.strip()[-200:])
    script = venv["top"] / "torch_first.py"
    script.write_text(TORCH_FIRST)
    r = subprocess.run([venv["py"], str(script), DATA], capture_output=True, text=True, timeout=600,
                       cwd=str(venv["top"]), env=clean_env())
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "NOTE None" in out, out[-4000:]
    gomp = re.search(r"GOMP (\[.*\])", out).group(1)
    assert "txkernel_bert.libs/libgomp-" in gomp, gomp
    assert "TRAIN_OK True" in out and re.search(r"Trained 2 steps in [0-9.]+ s\.", out), out[-4000:]
