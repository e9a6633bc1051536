"""`make test-gpu`'s companion check: in the stock python3 kernel with
`%load_ext txkernel`, a 2 GiB tensor of the real torch is named by %txdevice
and %txmem as PyTorch's caching allocator in this process, and no longer once
freed; then a `%%txwatch` cell allocates 1 GiB CUDA tensors until
the real torch raises torch.cuda.OutOfMemoryError; the cell must show
txkernel's diagnosis of the snapshot taken at that moment (a capacity
diagnosis: the cell's live tensors fill the device) in place of a bare
traceback, keep the traceback for %tb, and leave the kernel usable once the
tensors are dropped. Not a test_*.py: `make test` never collects it (it needs
a GPU); tests/gpu_cuda/run.sh runs it. Prints "N passed, N failed".

The kernel's python ($TXK_COMPANION_PYTHON, else this one) must have a CUDA
torch, jupyter_client, ipykernel and the companion; each one missing is a
failure that names it. On a GPU machine without them, scripts/devkit_run.sh
installs the kit's wheels and puts them on PYTHONPATH. The one skip: when
the kit has no wheel for that python's version, devkit_run.sh says so in
TXK_COMPANION_SKIP, and this prints it with "0 passed, 0 failed, 1 skipped"."""
import os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "companion"))

if os.environ.get("TXK_COMPANION_SKIP"):
    print(f"gpu_txwatch: skipped: {os.environ['TXK_COMPANION_SKIP']}")
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(0)
python = os.environ.get("TXK_COMPANION_PYTHON") or sys.executable
probe = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
if probe.returncode != 0 or probe.stdout.strip() != "True":
    why = "torch is not importable" if probe.returncode else "torch sees no CUDA device"
    print(f"gpu_txwatch: {why} in {python} (set TXK_COMPANION_PYTHON to a python with CUDA torch)")
    print("0 passed, 1 failed")
    sys.exit(1)
for mod in ("jupyter_client", "ipykernel", "txkernel"):
    probe = subprocess.run([python, "-c", f"import {mod}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    if probe.returncode != 0:
        print(f"gpu_txwatch: {mod} is not importable in {python} (PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}): "
              f"{probe.stderr.strip().splitlines()[-1:]}; on a machine without it, scripts/devkit_run.sh test "
              "installs it from the kit")
        print("0 passed, 1 failed")
        sys.exit(1)

import companion_util as cu  # noqa: E402

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else "\n" + detail[-3000:]))
    passed += bool(ok)
    failed += not ok


km, kc = cu.start(cu.python_kernel_name(python), ROOT)
try:
    rep, outs = cu.run(kc, "%load_ext txkernel")
    check("load_ext", rep["status"] == "ok", "\n".join(cu.text(outs)))
    # the user's PyTorch in the same process is a named holder
    rep, outs = cu.run(kc, "import torch\nx = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')\n"
                           "print(torch.cuda.memory_reserved(), torch.cuda.memory_allocated())")
    got = "\n".join(cu.text(outs)).split()
    check("torch holds 2 GiB", len(got) == 2 and int(got[1]) == 2 << 30, " ".join(got))
    rep, outs = cu.run(kc, "%txdevice")
    seen = "\n".join(cu.text(outs))
    check("%txdevice names PyTorch's caching allocator",
          "PyTorch caching allocator in this process: 2.00 GiB reserved, 2.00 GiB allocated" in seen, seen)
    rep, outs = cu.run(kc, "%txmem --json")
    js = [o["content"]["data"]["application/json"] for o in outs
          if "application/json" in (o["content"].get("data") or {})]
    check("%txmem --json counts it", js and js[-1].get("in_process", {}).get("reserved") == int(got[0]),
          repr(js[-1:] if js else outs))
    rep, outs = cu.run(kc, "del x; import gc; gc.collect(); torch.cuda.empty_cache()\n%txdevice")
    seen = "\n".join(cu.text(outs))
    check("freed, it holds nothing", "PyTorch caching allocator in this process: 0 bytes reserved" in seen, seen)
    cell = ("%%txwatch\nimport torch\nxs = []\nwhile True:\n"
            "    xs.append(torch.empty(1 << 30, dtype=torch.uint8, device='cuda'))\n")
    rep, outs = cu.run(kc, cell, timeout=300)
    seen = "\n".join(cu.text(outs))
    check("the real OOM is caught, not raised", rep["status"] == "ok" and not cu.errors(outs), seen)
    check("the diagnosis shows", "CUDA out of memory in this cell" in seen and "capacity" in seen.lower(), seen)
    check("the traceback is kept", "(the traceback: %tb)" in seen, seen)
    rep, outs = cu.run(kc, "%tb")
    check("%tb shows OutOfMemoryError", "OutOfMemoryError" in "\n".join(cu.text(outs)), "\n".join(cu.text(outs)))
    rep, outs = cu.run(kc, "n = len(xs); del xs; torch.cuda.empty_cache(); print(n, torch.cuda.memory_allocated())")
    got = "\n".join(cu.text(outs)).split()
    check("the cell's tensors were live, and are released", len(got) == 2 and int(got[0]) > 0 and got[1] == "0",
          " ".join(got))
finally:
    cu.u.stop(km, kc)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
