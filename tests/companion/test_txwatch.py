"""%%txwatch and %txmem --torch in the stock python3 kernel, on the CPU, with
a stand-in for torch.cuda (this machine has no GPU): the stand-in's
memory._snapshot() serves the real OOM snapshot in tests/data/pytorch_snapshots
and the cell raises its OutOfMemoryError; its device reports 11.5 GiB. The
file holds no OOM event, so the companion passes the device's size
(--capacity) and the cell shows the diagnosis (live tensors fill the device:
capacity) in place of a bare traceback, the
traceback stays available (%tb), recording is switched on and off around the
cell, other exceptions pass through untouched, and without CUDA each magic
says so in one line. On a GPU, make test-gpu's companion check uses the real
torch."""
import os

import pytest

import companion_util as cu

SNAP = os.path.join(cu.ROOT, "tests", "data", "pytorch_snapshots", "llm_oom.pickle")

STAND_IN = f"""
import pickle, sys, types
calls = []
class OutOfMemoryError(RuntimeError):
    pass
memory = types.SimpleNamespace(
    _record_memory_history=lambda enabled="all", **kw: calls.append(enabled),
    _snapshot=lambda: pickle.load(open({SNAP!r}, "rb")))
cuda = types.SimpleNamespace(is_available=lambda: AVAILABLE, OutOfMemoryError=OutOfMemoryError, memory=memory,
                             current_device=lambda: 0,
                             get_device_properties=lambda d: types.SimpleNamespace(total_memory=TOTAL))
torch = types.ModuleType("torch")
torch.cuda = cuda
AVAILABLE = True
TOTAL = 11 * 2**30 + 2**29  # the card the stand-in reports: 11.5 GiB
sys.modules["torch"] = torch
"""


def shown(outs):
    return "\n".join(cu.text(outs))


@pytest.fixture(scope="module")
def py():
    km, kc = cu.start(cu.python_kernel_name(), cu.ROOT)
    for code in (STAND_IN, "%load_ext txkernel"):
        rep, outs = cu.run(kc, code)
        assert rep["status"] == "ok", outs
    yield km, kc
    cu.u.stop(km, kc)


def test_txwatch_diagnoses_the_oom_of_the_cell(py):
    _, kc = py
    rep, outs = cu.run(kc, "%%txwatch\nx = 1\nraise torch.cuda.OutOfMemoryError("
                           "'CUDA out of memory. Tried to allocate 20.00 MiB')", timeout=120)
    seen = shown(outs)
    assert rep["status"] == "ok", seen
    assert "CUDA out of memory in this cell" in seen and "1. capacity: live tensors fill the device" in seen, seen
    assert "(the traceback: %tb)" in seen
    assert not [o for o in outs if o["msg_type"] == "error"]
    rep, outs = cu.run(kc, "print(calls, x)")
    assert shown(outs).strip().endswith("['all', None] 1")  # on for the cell, off after; the cell ran
    rep, outs = cu.run(kc, "%tb")
    assert "OutOfMemoryError" in shown(outs)


def test_txwatch_without_history_reads_the_message(py):
    """Issue 40 item 5: nothing recorded (the stand-in's snapshot has no trace
    events): the bare OutOfMemoryError's message goes to the pasted-message
    reader (%%txadvise --from-error), the same answer as pasting it."""
    _, kc = py
    msg = ("CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of 14.75 GiB of which "
           "51.06 MiB is free. Process 2210 has 6.29 GiB memory in use. Process 3377 has 8.41 GiB memory in use. "
           "Of the allocated memory 5.95 GiB is allocated by PyTorch, and 80.00 MiB is reserved by PyTorch but "
           "unallocated.")
    cu.run(kc, "_snap = memory._snapshot\nmemory._snapshot = lambda: {'segments': [], 'device_traces': [[]]}")
    try:
        rep, outs = cu.run(kc, f"%%txwatch\nraise torch.cuda.OutOfMemoryError({msg!r})", timeout=120)
    finally:
        cu.run(kc, "memory._snapshot = _snap")
    seen = shown(outs)
    assert rep["status"] == "ok", seen
    assert "CUDA out of memory in this cell" in seen and "(the traceback: %tb)" in seen, seen
    assert "1. another process: process 3377 held 8.41 GiB" in seen, seen


def test_other_errors_pass_through(py):
    _, kc = py
    # stop_on_error=False: with it on, ipykernel aborts requests that reach it
    # before it leaves its abort state, and the next test's cell was, at times
    rep, outs = cu.u.run_cell(kc, "%%txwatch\n1/0", timeout=10, stop_on_error=False)
    assert rep["content"]["status"] == "error" and rep["content"]["ename"] == "ZeroDivisionError"


def test_txmem_torch_reads_the_live_snapshot(py):
    _, kc = py
    rep, outs = cu.run(kc, "%txmem --torch --json", timeout=120)
    assert rep["status"] == "ok", shown(outs)
    js = [o["content"]["data"]["application/json"] for o in outs
          if "application/json" in (o["content"].get("data") or {})]
    assert js and js[-1]["reserved"] == 11844714496 and js[-1]["allocated"] == 11840159744
    assert js[-1]["capacity"] == 11 * 2**30 + 2**29  # the device's, as torch reports it


def test_without_cuda_one_line(py):
    _, kc = py
    cu.run(kc, "AVAILABLE = False")
    rep, outs = cu.run(kc, "%txmem --torch")
    assert rep["status"] == "ok" and shown(outs).strip().count("\n") == 0
    assert "no CUDA device" in shown(outs)
    rep, outs = cu.run(kc, "%%txwatch\ny = 2\nprint(y)")
    assert rep["status"] == "ok" and "no CUDA device" in shown(outs) and "2" in shown(outs)
