"""engine: pytorch against five real PyTorch BERT training runs on an H200
(issue 33): tests/data/gpu_h200/ (torch 2.11.0+cu130, transformers 5.17.0,
sm90; README there).

For each row, `txk plan CFG --json` of tests/gpu_cuda/gpu_torchplan.py's
config with `engine: pytorch`, `gpu: h100-80` (compute capability 9.0, the
H200's) and `torch_version: 2.11` must give
  - peak allocated within 2 % of the measured steady-step and first-step
    torch.cuda.max_memory_allocated(), never more than 1 % under;
  - peak reserved within 5 % of the larger of the two steps'
    max_memory_reserved, never more than 2 % under.
And the cuBLAS workspaces the plan holds are the ones the snapshots show:
two 32 MiB blocks (the forward's thread and autograd's device thread, each
in a segment of its own, never freed) and cuBLASLt's 1 MiB, allocated in
the first forward Linear right after the forward's 32 MiB (tiny's trace,
the only one that records them being allocated).

The files are in the repository: their absence is a failure, not a skip.
Runs once (its peer is the card's own record, not a venv row).
"""
import json, lzma, os, pickle, subprocess, sys, tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "tests", "data", "gpu_h200")
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu_cuda"))
sys.path.insert(0, HERE)
import gpu_torchplan  # noqa: E402  (the rows' configs, as the GPU suite plans them)

ROWS = ("tiny-16x128-eager", "mini-16x64-sdpa", "small-4x256-sdpa-qa", "base-4x512-eager", "base-8x512-sdpa")
MIB = 1 << 20


def load(name):
    path = os.path.join(DATA, name + ".xz")
    assert os.path.exists(path), f"{path} is missing: the H200's runs are part of the repository (README there)"
    with lzma.open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def measured():
    return json.loads(load("measured.json"))


def plan(row):
    y = gpu_torchplan.grid.config_yaml(gpu_torchplan.ROWS[row]).replace("device: cpu", "gpu: h100-80")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(y + "torch_version: 2.11\n")
    try:
        p = subprocess.run([os.path.join(BUILD, "txk"), "plan", f.name, "--json"], capture_output=True, text=True,
                           timeout=120)
    finally:
        os.unlink(f.name)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("row", ROWS)
def test_plan_within_the_cards_peaks(row, measured):
    (a1, r1), (a2, r2) = measured[row]
    got = plan(row)
    assert got["torch_version"] == "2.11" and got["device"] == "cuda"
    steady, first = got["peak_allocated"] / a2, got["first_step_peak_allocated"] / a1
    reserved = got["peak_reserved"] / max(r1, r2)
    print(f"{row}: allocated {steady:.4f} (first step {first:.4f}), reserved {reserved:.4f}")
    for what, r in (("steady-step allocated", steady), ("first-step allocated", first)):
        assert 0.99 <= r <= 1.02, f"{row}: {what} planned / measured = {r:.4f}"
    assert 0.98 <= reserved <= 1.05, f"{row}: reserved planned / measured = {reserved:.4f}"


def snapshot(row):
    return pickle.loads(load(row + ".pickle"))


@pytest.mark.parametrize("row", ROWS)
def test_workspaces_are_the_snapshots(row):
    """Every snapshot holds the two 32 MiB workspaces, each alone in its
    segment, and a 1 MiB cuBLASLt workspace; the plan holds the same."""
    snap = snapshot(row)
    got = plan(row)
    whole = [s for s in snap["segments"] if s["total_size"] == 32 * MIB and len(s["blocks"]) == 1
             and s["blocks"][0]["state"] == "active_allocated" and s["blocks"][0]["size"] == 32 * MIB]
    assert len(whole) == 2, f"{row}: {len(whole)} 32 MiB workspace segments"
    assert got["workspace_bytes"] == 32 * MIB and got["n_workspaces"] == 2
    lt = [b for s in snap["segments"] if s["segment_type"] == "small" for b in s["blocks"]
          if b["state"] == "active_allocated" and b["size"] == MIB]
    assert len(lt) >= 1, f"{row}: no 1 MiB cuBLASLt block"
    assert got["lt_workspace_bytes"] == MIB


def test_tiny_trace_allocates_them_where_the_plan_does():
    """tiny's trace: the forward's 32 MiB and cuBLASLt's 1 MiB in the first
    Linear (linear.py, after its output), the second 32 MiB with no Python
    frames (autograd's thread) at the first backward GEMM; none is freed.
    The plan's events (TXK_TORCHPLAN_EVENTS) put them in the same places."""
    tr = snapshot("tiny-16x128-eager")["device_traces"][0]
    allocs = [(k, e) for k, e in enumerate(tr) if e["action"] == "alloc"]
    big = [i for i, (_, e) in enumerate(allocs) if e["size"] == 32 * MIB]
    assert len(big) == 2
    (kf, fwd), (kb, bwd), (kl, lt) = allocs[big[0]], allocs[big[1]], allocs[big[0] + 1]
    assert any(f["filename"].endswith("linear.py") for f in fwd["frames"])
    assert lt["size"] == MIB and lt["frames"] == fwd["frames"]
    assert not any(f["filename"].endswith(".py") for f in bwd["frames"])
    for k, e in ((kf, fwd), (kb, bwd), (kl, lt)):
        assert not any(x["action"] == "free_completed" and x["addr"] == e["addr"] for x in tr[k:]), "freed"

    y = gpu_torchplan.grid.config_yaml(gpu_torchplan.ROWS["tiny-16x128-eager"]).replace("device: cpu", "gpu: h100-80")
    with tempfile.TemporaryDirectory() as d:
        cfg, ev = os.path.join(d, "c.yaml"), os.path.join(d, "events.txt")
        with open(cfg, "w") as f:
            f.write(y + "torch_version: 2.11\n")
        p = subprocess.run([os.path.join(BUILD, "txk"), "plan", cfg, "--json"], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, TXK_TORCHPLAN_EVENTS=ev))
        assert p.returncode == 0, p.stderr
        events = [line.split() for line in open(ev)]
    mine = [(k, e) for k, e in enumerate(events) if len(e) > 3 and e[3] in ("cublas", "cublasLt")]
    assert [(e[0], e[1], e[3]) for _, e in mine] == [("0", "+33554432", "cublas"), ("0", "+1048576", "cublasLt"),
                                                       ("0", "+33554432", "cublas")]
    # the first one comes right after the first Linear's output (layer 0's query)
    k0 = mine[0][0]
    assert events[k0 - 1][3].startswith("bert.encoder.layer.0")
