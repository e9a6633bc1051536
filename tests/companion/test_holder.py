"""The user's PyTorch in the same process as the engine (the companion in the
stock python3 kernel), on the CPU with a stand-in for torch.cuda whose
caching allocator reports what the test sets: %txdevice, %txmem, the plan's
free, a planned OOM and the advisor's release fix all count it as a named
holder and give the Python that frees it; when it frees its cache the plan
fits again; torch not imported, or without CUDA, is said plainly. On a GPU,
make test-gpu (tests/gpu_cuda/gpu_txwatch.py) checks the same with the real
torch holding real memory."""
import os

import pytest

import companion_util as cu

DATA = os.path.join(cu.ROOT, "tests", "data")
GiB = 1 << 30

STAND_IN = """
import sys, types
HELD = [9 << 30, 8 << 30]   # reserved, allocated
cuda = types.SimpleNamespace(
    is_available=lambda: AVAILABLE, is_initialized=lambda: True, current_device=lambda: 0,
    memory_reserved=lambda dev=None: HELD[0], memory_allocated=lambda dev=None: HELD[1],
    empty_cache=lambda: HELD.__setitem__(0, HELD[1]))
torch = types.ModuleType("torch")
torch.cuda = cuda
AVAILABLE = True
sys.modules["torch"] = torch
"""

# bert-base on a (simulated) T4 with standard attention (as transformers'
# eager attention runs it; a card's default is fused): 8.00 GiB at its peak
# (its 32 MiB cuBLAS workspace included),
# which fits the card's 14.00 GiB but not what is left beside 9 GiB of
# PyTorch's cache
CFG = ("model: bert-base-cased\ninit: random\n"
       f"vocab: {DATA}/vocab_cased.txt\ntrain_file: {DATA}/reviews_train.csv\nmax_examples: 64\n"
       "max_len: 512\nbatch_size: 16\nattention: standard\ndevice: {gpu: t4}\n")


def shown(outs):
    return "\n".join(cu.text(outs))


def vendor_json(outs, key="application/vnd.txkernel"):
    out = []
    for o in outs:
        for mime, v in (o["content"].get("data") or {}).items():
            if mime.startswith(key) or mime == "application/json":
                out.append(v)
    return out


@pytest.fixture(scope="module")
def py():
    km, kc = cu.start(cu.python_kernel_name(), cu.ROOT)
    rep, outs = cu.run(kc, "%load_ext txkernel")
    assert rep["status"] == "ok", outs
    yield km, kc
    cu.u.stop(km, kc)


def test_torch_not_imported_is_said_plainly(py):
    _, kc = py
    rep, outs = cu.run(kc, "%txdevice")
    assert rep["status"] == "ok"
    assert "PyTorch is not imported in this process: it holds no device memory" in shown(outs)


def test_holder_named_in_device_mem_and_plan(py):
    _, kc = py
    rep, outs = cu.run(kc, STAND_IN)
    assert rep["status"] == "ok", shown(outs)
    line = "PyTorch caching allocator in this process: 9.00 GiB reserved, 8.00 GiB allocated"
    rep, outs = cu.run(kc, "%txdevice")
    assert line in shown(outs)
    rep, outs = cu.run(kc, "%txmem --json")
    j = vendor_json(outs)[-1]
    assert j["in_process"] == {"holder": "PyTorch caching allocator", "state": "holds",
                               "reserved": 9 * GiB, "allocated": 8 * GiB}, j
    rep, outs = cu.run(kc, "%%txplan\n" + CFG, timeout=120)
    seen = shown(outs)
    assert rep["status"] == "ok", seen
    # the T4's 14.00 GiB for the allocator less the 9 GiB PyTorch keeps
    assert "Predicted peak 8.00 GiB reserved (7.60 GiB allocated) vs 5.00 GiB free: DOES NOT FIT" in seen, seen
    assert line in seen
    html = [o["content"]["data"]["text/html"] for o in outs if "text/html" in (o["content"].get("data") or {})]
    assert any(line in h for h in html)


def test_planned_oom_and_release_fix_give_the_python(py):
    _, kc = py
    rep, outs = cu.run(kc, "%%txtrain\n" + CFG, timeout=120)
    errs = cu.errors(outs)
    assert rep["status"] == "error" and len(errs) == 1 and errs[0]["ename"] == "OutOfMemoryPlanned", shown(outs)
    assert "PyTorch's caching allocator in this process holds 9.00 GiB" in errs[0]["evalue"]
    assert "torch.cuda.empty_cache()" in errs[0]["evalue"]
    rep, outs = cu.run(kc, "%txadvise --json", timeout=120)
    adv = vendor_json(outs)[-1]
    assert adv["available"] == adv["capacity"] - 9 * GiB
    head = [d for d in adv["diagnoses"] if d["kind"] == "headroom"]
    assert head and "PyTorch's caching allocator in this process holds 9.00 GiB" in head[0]["evidence"], adv["diagnoses"]
    # the live torch state is a fact of the advice (issue 40): cache that empty_cache() returns, tensors only del frees
    assert ("read live: torch.cuda.memory_reserved() 9.00 GiB, memory_allocated() 8.00 GiB: 1024.00 MiB is cache"
            in head[0]["evidence"]), head[0]["evidence"]
    rel = [i for i, c in enumerate(adv["candidates"]) if c["label"] == "release: free PyTorch's cache"]
    assert rel, [c["label"] for c in adv["candidates"]]
    cand = adv["candidates"][rel[0]]
    assert "gc.collect(); torch.cuda.empty_cache()" in cand["reason"]
    # freeing the cache gives back its 9 GiB: the config as it is fits the card
    assert cand["action_only"] and cand["peak"] == adv["peak"]
    assert cand["fits"] and cand["margin"] == adv["capacity"] - adv["peak"]
    rep, outs = cu.run(kc, f"%txfix {rel[0] + 1} --run", timeout=120)
    seen = shown(outs)
    assert rep["status"] == "ok", seen
    assert "only your Python can free" in seen and "torch.cuda.empty_cache()" in seen
    assert "Not training now" in seen


def test_pasted_message_reads_the_live_state(py):
    """A pasted OOM message in the companion (issue 40): the live torch state
    is a fact of the message's diagnosis too, so "held outside the step"
    says what PyTorch in this process holds now."""
    _, kc = py
    cu.run(kc, "HELD[:] = [14 << 30, 13 << 30]")
    with open(os.path.join(DATA, "oom_messages", "22_colab_rerun_t4.txt"), encoding="utf-8") as fh:
        msg = fh.read()
    rep, outs = cu.run(kc, "%%txadvise --from-error --json\n" + msg, timeout=120)
    j = vendor_json(outs)[-1]
    assert rep["status"] == "ok", shown(outs)
    held = [d for d in j["diagnoses"] if d["id"] == "held"]
    assert held and j["diagnoses"][0]["id"] == "held", [d["id"] for d in j["diagnoses"]]
    assert ("read live: torch.cuda.memory_reserved() 14.00 GiB, memory_allocated() 13.00 GiB: 1024.00 MiB is cache"
            in held[0]["text"]), held[0]


def test_after_empty_cache_the_plan_fits(py):
    _, kc = py
    rep, outs = cu.run(kc, "HELD[:] = [0, 0]")
    rep, outs = cu.run(kc, "%%txplan\n" + CFG, timeout=120)
    seen = shown(outs)
    assert "Predicted peak 8.00 GiB reserved (7.60 GiB allocated) vs 14.00 GiB capacity: FITS" in seen, seen
    assert "PyTorch caching allocator" not in seen  # nothing held: no line in the plan
    assert "DOES NOT FIT" not in seen, seen
    rep, outs = cu.run(kc, "%txdevice")
    assert "PyTorch caching allocator in this process: 0 bytes reserved, 0 bytes allocated" in shown(outs)


def test_without_cuda_said_plainly(py):
    _, kc = py
    cu.run(kc, "AVAILABLE = False")
    rep, outs = cu.run(kc, "%txdevice")
    assert "PyTorch in this process sees no CUDA device (torch.cuda.is_available() is False): " \
           "it holds no GPU memory" in shown(outs)
