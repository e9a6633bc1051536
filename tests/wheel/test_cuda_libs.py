"""The cuda plugin opens cuBLAS, cuBLASLt and CUPTI at run time from CUDA 13
or CUDA 12 libraries (gpu/cuda/cuda_dynload.c). No GPU needed: each case loads
build/libtk_cuda.so in a fresh process and calls its tk_cuda_libs_probe,
which opens the libraries as tk_cuda_plugin_open does and dlsyms every
function the plugin calls in them (tests/suites/cuda_plugin.sh checks that
the plugin reaches them only that way: no undefined cublas/cupti symbol).

- CUDA 13: the nvidia/cu13/lib wheel .venv-t2's torch brings;
- CUDA 12: nvidia-cublas-cu12 and nvidia-cuda-cupti-cu12 12.8 (Colab's), in
  the wheels' own layout under .cuda-peers/cu12 (scripts/cuda_peers.sh, run by
  scripts/deps.sh: the test reads the folder and never downloads
  downloads them the first time);
- found beside the plugin's package, the way an installed wheel finds
  torch's (<plugin dir>/../nvidia/...), without $TXK_CUDA_LIBDIRS;
- a cuBLAS torch already loaded is the one taken; CUPTI 13 (the runtime's
  major) before 12;
- a missing cuBLAS and a missing CUPTI are each said in one line naming
  the library;
- the constants and record fields the plugin uses have the same values in
  CUDA 12.8's headers as in the 13.0 it is compiled with."""
import glob, os, re, shutil, subprocess, sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build")
PLUGIN = os.path.join(BUILD, "libtk_cuda.so")
CU12 = os.path.join(ROOT, ".cuda-peers", "cu12")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

if not os.path.exists(PLUGIN) and not shutil.which("nvcc") and not os.path.exists(CUDA_HOME + "/bin/nvcc"):
    pytest.skip("nvcc not found: the cuda plugin is not built on this machine", allow_module_level=True)

PROBE = r"""
import ctypes, os, sys
for pre in filter(None, os.environ.get("PROBE_PRELOAD", "").split(":")):
    ctypes.CDLL(pre, mode=os.RTLD_GLOBAL)  # what torch's import does
lib = ctypes.CDLL(sys.argv[1])
buf = ctypes.create_string_buffer(8192)
rc = lib.tk_cuda_libs_probe(buf, ctypes.c_size_t(len(buf)))
print(rc)
print(buf.value.decode())
"""


def probe(plugin=PLUGIN, **env):
    e = {k: v for k, v in os.environ.items()
         if k not in ("TXK_CUDA_LIBDIRS", "TXK_CUDA_MAJOR", "LD_LIBRARY_PATH", "CUDA_HOME")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", PROBE, plugin], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    rc, line = r.stdout.split("\n", 1)
    line = line.rstrip("\n")
    assert "\n" not in line, "the probe's message is one line: " + line
    return int(rc), line


def t2_cu13():
    site = glob.glob(os.path.join(ROOT, ".venv-t2", "lib", "python3*", "site-packages"))
    d = [os.path.join(s, "nvidia", "cu13", "lib") for s in site]
    d = [x for x in d if os.path.exists(os.path.join(x, "libcublasLt.so.13"))]
    assert d, ".venv-t2 has no nvidia/cu13/lib (scripts/deps.sh installs torch 2.x with CUDA 13 wheels there)"
    return d[0]


@pytest.fixture(scope="module")
def cu12():
    assert os.path.exists(os.path.join(CU12, ".complete")), \
        f"{CU12} is missing: scripts/deps.sh (make test's set-up) puts CUDA 12's libraries there"
    return {"blas": os.path.join(CU12, "nvidia", "cublas", "lib"),
            "cupti": os.path.join(CU12, "nvidia", "cuda_cupti", "lib")}


def test_plugin_built():
    assert os.path.exists(PLUGIN), "build/libtk_cuda.so is missing (make build/libtk_cuda.so)"


def test_cuda13_from_torch_wheel():
    d = t2_cu13()
    rc, line = probe(TXK_CUDA_MAJOR="13", TXK_CUDA_LIBDIRS=d)
    assert rc == 0, line
    real = os.path.realpath(d)
    assert line.startswith("cuBLAS 13 ("), line
    for lib in ("libcublas.so.13", "libcublasLt.so.13", "libcupti.so.13"):
        assert os.path.join(real, lib) in line or os.path.join(d, lib) in line, (lib, line)


def test_cuda12_from_colab_wheels(cu12):
    rc, line = probe(TXK_CUDA_MAJOR="12", TXK_CUDA_LIBDIRS=cu12["blas"] + ":" + cu12["cupti"])
    assert rc == 0, line
    assert line.startswith("cuBLAS 12 ("), line
    assert os.path.join(cu12["blas"], "libcublas.so.12") in line, line
    assert os.path.join(cu12["blas"], "libcublasLt.so.12") in line, line
    assert os.path.join(cu12["cupti"], "libcupti.so.12") in line, line


def test_cuda12_only_machine_picks_12(cu12):
    """No major forced: the folders come before the majors, so a runtime
    whose torch brought CUDA 12's wheels gets those, although this machine's
    toolkit (/usr/local/cuda, searched last) is CUDA 13."""
    rc, line = probe(TXK_CUDA_LIBDIRS=cu12["blas"] + ":" + cu12["cupti"])
    assert rc == 0 and line.startswith("cuBLAS 12 ("), line


def test_the_cublas_torch_loaded_wins(cu12):
    """torch imported first has libcublas.so.12 in the process: the plugin
    takes that one, not the CUDA 13 toolkit of this machine nor anything
    else, so one process holds one cuBLAS."""
    blas = cu12["blas"]
    rc, line = probe(PROBE_PRELOAD=f"{blas}/libcublasLt.so.12:{blas}/libcublas.so.12",
                     TXK_CUDA_LIBDIRS=cu12["cupti"], TXK_CUDA_MAJOR="12")
    assert rc == 0, line
    assert line.startswith(f"cuBLAS 12 ({blas}/libcublas.so.12, {blas}/libcublasLt.so.12)"), line
    assert "CUPTI 12 (" + cu12["cupti"] in line, line


def test_cupti_13_first(cu12):
    """CUPTI hooks the CUDA runtime, and the plugin's is 13: with cuBLAS 12
    (its folder first) and both CUPTIs at hand, CUPTI 13 is taken."""
    d13 = t2_cu13()
    rc, line = probe(TXK_CUDA_LIBDIRS=":".join([cu12["blas"], cu12["cupti"], d13]))
    assert rc == 0, line
    assert line.startswith("cuBLAS 12 (" + cu12["blas"]), line
    assert "; CUPTI 13 (" + d13 in line, line


def test_found_beside_the_package(tmp_path, cu12):
    """An installed wheel: site-packages/txkernel/libtk_cuda.so finds
    site-packages/nvidia/cublas/lib and nvidia/cuda_cupti/lib by itself."""
    site = tmp_path / "site-packages"
    (site / "txkernel").mkdir(parents=True)
    shutil.copy(PLUGIN, site / "txkernel" / "libtk_cuda.so")
    (site / "nvidia").mkdir()
    os.symlink(os.path.join(CU12, "nvidia", "cublas"), site / "nvidia" / "cublas")
    os.symlink(os.path.join(CU12, "nvidia", "cuda_cupti"), site / "nvidia" / "cuda_cupti")
    rc, line = probe(plugin=str(site / "txkernel" / "libtk_cuda.so"), TXK_CUDA_MAJOR="12")
    assert rc == 0, line
    assert str(site / "txkernel" / ".." / "nvidia" / "cublas" / "lib") in line or "cu12/nvidia/cublas/lib" in line, line


def test_missing_cublas_is_one_line():
    rc, line = probe(TXK_CUDA_MAJOR="12", TXK_CUDA_LIBDIRS="/nonexistent/txk")
    assert rc == -1, line
    assert line.startswith("cuBLAS not found: no libcublasLt.so.12 "), line
    assert "/nonexistent/txk" in line and "TXK_CUDA_LIBDIRS" in line, line


def test_missing_cupti_is_one_line(cu12):
    rc, line = probe(TXK_CUDA_MAJOR="12", TXK_CUDA_LIBDIRS=cu12["blas"])
    assert rc == 1, line
    assert "CUPTI not found: no libcupti.so.12 " in line, line


def _used_constants():
    srcs = glob.glob(os.path.join(ROOT, "gpu", "cuda", "*.c")) + glob.glob(os.path.join(ROOT, "gpu", "cuda", "*.cu")) \
        + glob.glob(os.path.join(ROOT, "gpu", "cuda", "*.h")) + glob.glob(os.path.join(ROOT, "gpu", "cuda", "*.cuh"))
    names = set()
    for s in srcs:
        if s.endswith("cuda_dynload.c"):
            continue  # its fallbacks (NOT_INITIALIZED) are not sent to the library
        names |= set(re.findall(r"\b(CUBLASLT_[A-Z0-9_]+|CUBLAS_(?:COMPUTE|OP|GEMM|DEFAULT|TF32|PEDANTIC)[A-Z0-9_]*"
                                r"|CUDA_R_[0-9A-Z_]+|CUPTI_ACTIVITY_[A-Z0-9_]+|CUPTI_EXTERNAL_[A-Z0-9_]+)\b",
                                open(s, errors="replace").read()))
    return sorted(names)


def _abi_dump(tmp_path, incs, kernel_rec, tag):
    src = tmp_path / f"abi_{tag}.c"
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <cublas_v2.h>", "#include <cublasLt.h>",
             "#include <cupti.h>", "#define O(T,f) printf(#T \".\" #f \" %zu\\n\", offsetof(T,f))",
             "int main(void) {"]
    lines += [f'printf("{c} %ld\\n", (long)({c}));' for c in _used_constants()]
    for f in ("start", "end", "correlationId", "kind"):
        lines.append(f"O({kernel_rec},{f});")
    for f in ("memoryKind", "memoryOperationType", "source", "address", "bytes"):
        lines.append(f"O(CUpti_ActivityMemory4,{f});")
    for f in ("externalKind", "correlationId", "externalId"):
        lines.append(f"O(CUpti_ActivityExternalCorrelation,{f});")
    lines += ['printf("algo %zu heur %zu\\n", sizeof(cublasLtMatmulAlgo_t), sizeof(cublasLtMatmulHeuristicResult_t));',
              "return 0; }"]
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / f"abi_{tag}"
    cmd = ["gcc", "-w"] + [f"-I{i}" for i in incs] + [str(src), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()


def test_cuda12_headers_agree(tmp_path, cu12):
    """What the plugin, compiled against CUDA 13, hands to or reads from a
    CUDA 12 library means the same there. The kernel record is
    CUpti_ActivityKernel10 in 13 and CUpti_ActivityKernel9 in 12.8: the
    fields read must sit at the same offsets."""
    used = _used_constants()
    assert "CUBLASLT_MATMUL_DESC_EPILOGUE" in used and "CUPTI_ACTIVITY_KIND_MEMORY2" in used, used
    cuda_inc = os.path.join(CUDA_HOME, "include")
    d13 = _abi_dump(tmp_path, [cuda_inc], "CUpti_ActivityKernel10", "13")
    d12 = _abi_dump(tmp_path, [os.path.join(CU12, "nvidia", "cublas", "include"),
                               os.path.join(CU12, "nvidia", "cuda_cupti", "include"), cuda_inc],
                    "CUpti_ActivityKernel9", "12")
    d12 = [x.replace("CUpti_ActivityKernel9", "CUpti_ActivityKernel10") for x in d12]
    diff = [(a, b) for a, b in zip(d12, d13) if a != b]
    assert len(d12) == len(d13) and not diff, diff
