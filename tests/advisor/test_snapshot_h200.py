"""`txk mem --snapshot` on five real PyTorch BERT training snapshots from an
H200 (tests/data/gpu_h200, xz-compressed; origin in its README): two
training steps of transformers' BertFor* models (bert-tiny's shape to
bert-base's, eager and SDPA, classification and QA, torch 2.11), dumped after
the steps, when only the cuBLAS workspaces were left.

The file is read as a whole, not only by the blocks left at the end: the
model is recognised from the blocks live at the trace's peak, with the sizes
the run had (gpu_torchplan.py's ROWS made these files); the peak's phase and
step are named and what was live then is split by category; the 32 MiB
blocks are cuBLAS workspaces; nothing is diagnosed (no OOM, no capacity
given, no leak); the trace's allocated peak is PyTorch's own
max_memory_allocated() (measured.json) within 0.1 %; and the plan as it ran
(engine: pytorch) sits beside that peak (its figure follows torchplan, so
only its presence and label are held here)."""
import json, lzma, os, re, subprocess, sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data", "gpu_h200")
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu_cuda"))
sys.path.insert(0, HERE)
import gpu_torchplan  # noqa: E402  (the rows these files ran)
import test_snapshot_bert as tsb  # noqa: E402  (a BERT snapshot at an OOM)

MiB = 1 << 20
NAMES = ["tiny-16x128-eager", "mini-16x64-sdpa", "small-4x256-sdpa-qa", "base-4x512-eager", "base-8x512-sdpa"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_h200")
    for f in sorted(os.listdir(DATA)):
        if f.endswith(".xz"):
            (out / f[:-3]).write_bytes(lzma.decompress(open(os.path.join(DATA, f), "rb").read()))
    return out


@pytest.fixture(scope="module")
def read(files):
    """Each file's `txk mem --snapshot --json` and text, read once."""
    got = {}
    for name in NAMES:
        path = str(files / f"{name}.pickle")
        j = subprocess.run([TXK, "mem", "--snapshot", path, "--json"], capture_output=True, text=True, timeout=60)
        t = subprocess.run([TXK, "mem", "--snapshot", path], capture_output=True, text=True, timeout=60)
        assert j.returncode == 0 and t.returncode == 0, (name, j.stderr, t.stderr)
        got[name] = (json.loads(j.stdout), t.stdout)
    return got


@pytest.fixture(scope="module")
def measured(files):
    return json.loads((files / "measured.json").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_bert_recognised_with_the_sizes_it_ran(read, name):
    j, _ = read[name]
    r, m = gpu_torchplan.ROWS[name], j["model"]
    assert m["family"] == "bert" and "peak" in m["recognised_from"], m
    assert (m["hidden"], m["layers"], m["heads"], m["intermediate"], m["vocab"]) == \
        (r["hidden"], r["layers"], r["heads"], r["intermediate"], r.get("vocab", 30522)), m
    assert (m["batch"], m["seq"]) == (r["batch"], r["seq"]), m
    assert m["dtype"] == "fp32", m


@pytest.mark.parametrize("name", NAMES)
def test_allocated_peak_is_pytorchs_max_memory_allocated(read, measured, name):
    """The trace records requests; PyTorch counts blocks (rounded to 512 B,
    a free block taken whole when what remains is too small to split) and
    the blocks live before the recording began (the later files'
    workspaces): replayed so, the peak is max_memory_allocated()."""
    j, _ = read[name]
    want = max(a for a, _ in measured[name])
    got = j["timeline"]["peak_allocated"]
    assert abs(got - want) <= want / 1000, (got, want)
    rp = j["timeline"]["replay"]
    assert rp["rounded"] and rp["unplaced"] == 0 and rp["end_mismatch"] == 0, rp
    # the tiny row ran first: its recording saw every block; the others began with the workspaces live
    assert (rp["before_blocks"] == 0) == (name == "tiny-16x128-eager"), rp
    p = j["peak"]
    assert p["allocated"] == got and sum(c["bytes"] for c in p["by_category"]) == got, p


@pytest.mark.parametrize("name", NAMES)
def test_the_peak_moment_is_diagnosed(read, name):
    j, out = read[name]
    p = j["peak"]
    # small's optimizer step of its first step (AdamW's states made, its foreach temporaries) tops its backward;
    # the others peak early in the second step's backward
    if name == "small-4x256-sdpa-qa":
        assert (p["phase"], p["step"], p["where"]) == ("optimizer step", 1, "Optimizer.step (AdamW)"), p
    else:
        assert (p["phase"], p["step"]) == ("backward", 2), p
    assert p["steps"] == 2, p
    cats = {c["id"]: c["bytes"] for c in p["by_category"]}
    assert cats["workspace"] == 64 * MiB + (MiB if name in ("tiny-16x128-eager", "mini-16x64-sdpa") else 0), cats
    assert {"optim", "workspace"} <= set(cats) and ("param" in cats or "before_recording" in cats), cats
    if p["phase"] == "backward":
        assert max(cats, key=cats.get) == "act" or name.startswith(("tiny", "mini")), cats
        # the activations by the forward's layer: one entry per layer the model has
        layers = [x["id"] for x in p["by_layer"] if x["id"].startswith("layer_")]
        assert p["layers_seen"] == gpu_torchplan.ROWS[name]["layers"] == len(layers), p
    assert f"during {p['phase']}" in out and "step" in out, out


@pytest.mark.parametrize("name", NAMES)
def test_workspaces_named_and_nothing_claimed_without_figures(read, name):
    j, out = read[name]
    ws = [w for w in j["workspaces"] if w["bytes"] == 32 * MiB]
    assert len(ws) == 2 and all("cuBLAS workspace" in w["name"] and w["at_peak"] for w in ws), j["workspaces"]
    # at the end only the workspaces (and 1 MiB blocks beside them) are live: owned by cuBLAS, not linear.py
    owners = {t["owner"]: t["bytes"] for t in j["top"]}
    assert sum(b for o, b in owners.items() if o.startswith("library: cuBLAS workspace")) == 64 * MiB, owners
    assert not [o for o in owners if "linear.py" in o and "cuBLAS" not in o], owners
    ids = {d["id"] for d in j["diagnoses"]}
    assert not ids & {"capacity", "fragmentation", "leak", "dominant_layer"}, j["diagnoses"]
    assert j["leak"]["found"] is False and j["fixes"] == [], j
    assert "capacity:" not in out and "cuBLAS workspace" in out, out


def test_tiny_names_each_threads_workspace(read):
    """Recorded from the model's load: the forward's first matmul allocates
    its thread's cuBLAS workspace (and 1 MiB right after it in the same
    call, never freed), the autograd thread its own in backward (no Python
    frames there)."""
    j, _ = read["tiny-16x128-eager"]
    names = sorted(w["name"] for w in j["workspaces"])
    assert any("autograd thread" in n for n in names) and any("ran the forward" in n for n in names), names
    assert any(n.startswith("library: 1 MiB the same matmul") for n in names), names


@pytest.mark.parametrize("name", NAMES)
def test_plan_as_it_ran_sits_beside_the_peak(read, name):
    m = read[name][0]["model"]
    plan = m.get("plan") or m.get("plan_withheld")
    assert plan and plan["engine"] == "pytorch" and plan["engine_label"].startswith("engine: pytorch"), m
    assert plan["against"] == read[name][0]["timeline"]["peak_allocated"] and plan["peak_allocated"] > 0, plan
    assert "planned as it ran by engine: pytorch" in read[name][1] or "plan as it ran by engine: pytorch" in read[name][1]


def test_fix_code_carries_no_number_the_file_did_not_give():
    """A BERT at an OOM with no --data: the max_length fix names N as the
    user's data's p99, never a length of its own."""
    j = tsb.mem_json(tsb.write(tsb.snapshot()))
    ml = tsb.fix(j, "max_length")
    assert "max_length=N" in ml["code"] and "p99" in ml["code"], ml
    assert not re.search(r"max_length=\d", ml["code"]), ml


def test_a_given_capacity_holds_when_the_workspaces_pick_the_profile(files):
    """No --gpu: the file's 32 MiB cuBLAS workspaces plan it on the h100-80
    profile for its kernels alone. --capacity (the device's total, as the
    companion passes it) is what the plan is held to, less the card's CUDA
    context, never the profile's 80 GB."""
    path = str(files / "mini-16x64-sdpa.pickle")
    got = {}
    for cap in ("16GiB", "17GiB"):
        j = subprocess.run([TXK, "mem", "--snapshot", path, "--capacity", cap, "--json"], capture_output=True,
                           text=True, timeout=60)
        assert j.returncode == 0, j.stderr
        got[cap] = json.loads(j.stdout)["model"]["plan"]
    p = got["16GiB"]
    assert p["capacity_from"] == "the capacity given" and p["fits"] is True, p
    assert 15 << 30 < p["capacity"] < 16 << 30, p
    assert got["17GiB"]["capacity"] - p["capacity"] == 1 << 30, (got["17GiB"], p)
