"""PyTorch memory snapshots read by `txk mem --snapshot` and `%txmem --snapshot`:
the figures equal a Python summation over the same file (pickle.load), for the
two real snapshots in tests/data/pytorch_snapshots and for snapshots written
here by Python's pickle with builtin types only; the real OOM is diagnosed as
live tensors filling the device, a cache of small free blocks as
fragmentation; bad files are one-line errors naming the file, and a pickled
global (os.system) is refused without being run."""
import json, os, pickle, subprocess, sys, tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
REAL = os.path.join(ROOT, "tests", "data", "pytorch_snapshots")
MiB = 1 << 20


def txk(*args):
    r = subprocess.run([TXK, "mem", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def summary(path, *extra):
    rc, out, err = txk("--snapshot", path, "--json", *extra)
    assert rc == 0, err
    return json.loads(out)


def python_sums(snap):
    """The figures as PyTorch defines them, summed in Python."""
    segs = snap["segments"] if isinstance(snap, dict) else snap
    blocks = [b for s in segs for b in s["blocks"]]
    live = [b for b in blocks if b["state"] == "active_allocated"]
    free = [b["size"] for b in blocks if b["state"] == "inactive"]
    return {"reserved": sum(s["total_size"] for s in segs),
            "allocated": sum(b["size"] for b in live),
            "requested": sum(b.get("requested_size", 0) for b in live),
            "largest_free_block": max(free, default=0)}


def write(obj, suffix=".pickle", proto=4):
    f = tempfile.NamedTemporaryFile("wb", suffix=suffix, delete=False)
    f.write(json.dumps(obj).encode() if suffix == ".json" else pickle.dumps(obj, protocol=proto))
    f.close()
    return f.name


def frames(*fs):
    return [{"filename": f, "line": line, "name": n} for f, line, n in fs]


CELL = "/tmp/ipykernel_114/3105878423.py"
LINEAR = "/usr/local/lib/python3.10/dist-packages/torch/nn/modules/linear.py"


def fragmented():
    """100 segments of 20 MiB, each 2 MiB live and 2 MiB free in turn: 1 GiB
    free in the cache, no free block above 2 MiB, and an OOM for 40 MiB."""
    segs, trace, addr = [], [], 1 << 40
    for i in range(100):
        blocks, a = [], addr
        for k in range(10):
            live = k % 2 == 0
            fr = frames(("??", 0, "malloc"), (LINEAR, 125, "forward"), (CELL, 7 + (i % 2), "<module>")) if live else []
            blocks.append({"address": a, "size": 2 * MiB, "requested_size": 2 * MiB - 512 if live else 0,
                           "state": "active_allocated" if live else "inactive", "frames": fr})
            if live:
                trace.append({"action": "alloc", "addr": a, "size": 2 * MiB, "stream": 0, "time_us": len(trace),
                              "frames": fr})
            a += 2 * MiB
        segs.append({"device": 0, "address": addr, "total_size": 20 * MiB, "allocated_size": 10 * MiB,
                     "active_size": 10 * MiB, "requested_size": 10 * MiB, "stream": 0, "segment_type": "large",
                     "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
        trace.insert(len(trace) - 5, {"action": "segment_alloc", "addr": addr, "size": 20 * MiB, "stream": 0,
                                      "time_us": 0, "frames": []})
        addr += 20 * MiB
    # a transient 8 MiB tensor alloc'd and freed: the trace's peak is above the end
    trace.append({"action": "alloc", "addr": 1, "size": 8 * MiB, "stream": 0, "time_us": 9, "frames": []})
    trace.append({"action": "free_requested", "addr": 1, "size": 8 * MiB, "stream": 0, "time_us": 10, "frames": []})
    trace.append({"action": "free_completed", "addr": 1, "size": 8 * MiB, "stream": 0, "time_us": 11, "frames": []})
    trace.append({"action": "oom", "addr": 0, "size": 40 * MiB, "stream": 0, "time_us": 12, "device_free": 10 * MiB,
                  "frames": []})
    return {"segments": segs, "device_traces": [trace]}


def test_real_snapshots_figures_equal_python_sums():
    assert os.path.isdir(REAL), f"{REAL} is missing: the real snapshots live in the repository"
    for name in ("llm_oom.pickle", "llm_inference.pickle"):
        path = os.path.join(REAL, name)
        with open(path, "rb") as f:
            want = python_sums(pickle.load(f))
        got = summary(path)
        for k, v in want.items():
            assert got[k] == v, (name, k, got[k], v)
        assert got["form"] == "pickle (dict)"
        assert sum(p["reserved"] for p in got["segments"]) == want["reserved"]
        assert sum(t["bytes"] for t in got["top"]) == want["allocated"]  # fewer owners than the top's 20


def test_real_oom_is_capacity_not_fragmentation():
    assert os.path.isdir(REAL), f"{REAL} is missing: the real snapshots live in the repository"
    got = summary(os.path.join(REAL, "llm_oom.pickle"), "--capacity", "11.5GiB")
    ids = [d["id"] for d in got["diagnoses"]]
    assert ids[0] == "capacity" and "fragmentation" not in ids, ids
    assert got["fixes"] and all(f["code"] for f in got["fixes"])
    # FlexGen's allocate() at line 190 of its own file holds it all: user code, not a library
    assert got["top"][0]["owner"] == "pytorch_backend.py, line 190 (allocate)"


def test_fragmented_cache_is_fragmentation_first_in_every_form():
    snap = fragmented()
    want = python_sums(snap)
    assert want["reserved"] - want["allocated"] == 1000 * MiB and want["largest_free_block"] == 2 * MiB
    results = []
    for path in (write(snap), write(snap, proto=2), write(snap, suffix=".json"), write(snap["segments"])):
        got = summary(path)
        os.unlink(path)
        for k, v in want.items():
            assert got[k] == v, (path, k, got[k], v)
        results.append(got)
    full = results[0]
    assert full["diagnoses"][0]["id"] == "fragmentation", full["diagnoses"]
    assert "capacity" not in [d["id"] for d in full["diagnoses"]]
    assert full["fixes"][0]["id"] == "expandable_segments"
    assert "expandable_segments:True" in full["fixes"][0]["code"]
    assert full["oom"] == {"size": 40 * MiB, "device_free": 10 * MiB, "device": 0, "phase": None}
    # owners: the notebook cell that called nn.Linear, two lines of it
    owners = {t["owner"]: t["bytes"] for t in full["top"]}
    assert owners == {f"cell, line 7 · torch/nn/modules/linear.py": 500 * MiB,
                      f"cell, line 8 · torch/nn/modules/linear.py": 500 * MiB}, owners
    # the trace is anchored at the end's figures; its peak adds the transient 8 MiB
    assert full["timeline"]["peak_allocated"] == want["allocated"] + 8 * MiB
    assert results[3]["form"] == "pickle (list of segments)" and results[2]["form"] == "json"


def test_bad_inputs_are_one_line_errors_naming_the_file(tmp_path):
    marker = tmp_path / "ran"
    cases = {
        # a global: Python's pickle.load would run os.system here
        "global.pickle": b"\x80\x02cos\nsystem\nX" + len(f"touch {marker}").to_bytes(4, "little")
                         + f"touch {marker}".encode() + b"\x85R.",
        "stack_global.pickle": b"\x80\x04\x8c\x02os\x8c\x06system\x93N\x85R.",
        "huge.pickle": b"\x80\x04\x8d" + (2 << 30).to_bytes(8, "little") + b"abc.",
        "huge4.pickle": b"\x80\x04X" + (2 << 30).to_bytes(4, "little", signed=False)[:4] + b"abc.",
        "wrong.json": b'{"segments": [{"total_size": "big", "blocks": []}]}',
        "shape.json": b'{"weights": [1, 2, 3]}',
        "notsnap.txt": b"hello",
    }
    real = os.path.join(REAL, "llm_inference.pickle")
    if os.path.isfile(real):
        with open(real, "rb") as f:
            cases["truncated.pickle"] = f.read()[:100000]
    else:
        cases["truncated.pickle"] = pickle.dumps(fragmented(), protocol=4)[:50000]
    expect = {"global.pickle": "global 'os.system' is not allowed", "stack_global.pickle": "'os.system'",
              "huge.pickle": "length field larger than the rest", "huge4.pickle": "ends inside",
              "wrong.json": "segments[0].total_size", "shape.json": "segments", "notsnap.txt": "not a PyTorch",
              "truncated.pickle": "truncated"}
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        rc, out, err = txk("--snapshot", str(p), "--json")
        assert rc == 1 and out == "", (name, rc, out)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and str(p) in lines[0] and expect[name] in lines[0], (name, err)
    assert not marker.exists()


def test_txmem_snapshot_in_the_kernel():
    sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
    import txk_util as u
    path = write(fragmented())
    km, kc = u.start()
    try:
        reply, outs = u.run_cell(kc, f"%txmem --snapshot {path}", timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        data = [o["content"]["data"] for o in outs if o["msg_type"] in ("display_data", "execute_result")]
        assert data, outs
        d = data[-1]
        assert "fragmentation" in d["text/plain"] and "expandable_segments" in d["text/html"]
        assert d["image/svg+xml"].startswith("<svg") and "<svg" in d["text/html"]
        # the figures travel under txkernel's own type, so a notebook shows the HTML
        js = [v for k, v in d.items() if k.startswith("application/vnd.txkernel.") and k.endswith("+json")]
        assert "application/json" not in d and js and js[0]["allocated"] == python_sums(fragmented())["allocated"]
        reply, outs = u.run_cell(kc, "%txmem --snapshot /nonexistent/snap.pickle", timeout=30)
        errs = [o["content"] for o in outs if o["msg_type"] == "error"]
        assert reply["content"]["status"] == "error" and "/nonexistent/snap.pickle" in errs[0]["evalue"]
    finally:
        u.stop(km, kc)
        os.unlink(path)


def test_owner_rows_no_python_frame_and_library_only():
    blocks = [{"address": 0, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated", "frames": []},
              {"address": 4 * MiB, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated",
               "frames": frames(("??", 0, "c10::cuda::CUDACachingAllocator::malloc"),
                                ("/opt/torch/lib/libtorch_cuda.so", 0, "x"))},
              {"address": 6 * MiB, "size": 8 * MiB, "requested_size": 8 * MiB, "state": "active_allocated",
               "frames": frames(("??", 0, "malloc"), (LINEAR, 125, "forward"),
                                ("/usr/lib/python3/dist-packages/transformers/trainer.py", 3000, "train"))},
              {"address": 14 * MiB, "size": 6 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]
    seg = {"device": 0, "address": 0, "total_size": 20 * MiB, "stream": 0, "segment_type": "large", "blocks": blocks}
    path = write({"segments": [seg], "device_traces": [[]]})
    got = summary(path)
    os.unlink(path)
    assert {t["owner"]: t["bytes"] for t in got["top"]} == {
        "library: torch/nn/modules/linear.py": 8 * MiB, "no Python frame": 2 * MiB,
        "no frames (allocated before the history was recorded)": 4 * MiB}, got["top"]
