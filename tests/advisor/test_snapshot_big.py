"""A snapshot over 1 GB read by `txk mem --snapshot` in bounded memory: the
real gpt_lm_step.pickle (tests/data/pytorch_snapshots, a stacks="all" trace)
with its trace repeated 13 times and pickled without the memo, so every
event carries its frames in full (about 1.17 GB), made once per run in a
temporary folder. txk streams the trace: it must finish within 2 minutes
with at most 1 GiB resident (measured for the child alone with wait4), and
give the same figures as the real file (the trace's peak within 0.5 %: see
the test)."""
import json, os, pickle, subprocess, time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
REAL = os.path.join(ROOT, "tests", "data", "pytorch_snapshots", "gpt_lm_step.pickle")
GiB = 1 << 30


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    assert os.path.exists(REAL), f"{REAL} is missing: the real snapshots live in the repository"
    with open(REAL, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][0]
    reps = 13  # 13 x 89.9 MB of events without the memo: 1.17 GB
    snap["device_traces"] = [trace * reps]
    path = tmp_path_factory.mktemp("big") / "big.pickle"
    with open(path, "wb") as f:
        p = pickle.Pickler(f, protocol=4)
        p.fast = True  # no memo: each event's frames written out in full
        p.dump(snap)
    yield str(path), len(trace) * reps
    os.unlink(path)


def run_measured(args, out):
    """(exit status, wall seconds, max resident bytes) of one child."""
    t = time.monotonic()
    with open(out, "w") as f:
        proc = subprocess.Popen(args, stdout=f, stderr=subprocess.PIPE)
        _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, ru.ru_maxrss * 1024, proc.stderr.read().decode()


def test_over_1gb_in_bounded_memory_with_the_real_files_figures(big, tmp_path):
    path, events = big
    assert os.path.getsize(path) > 1_000_000_000
    rc, wall, rss, err = run_measured([TXK, "mem", "--snapshot", path, "--json"], tmp_path / "out.json")
    assert rc == 0, err
    print(f"\n{os.path.getsize(path)} bytes read in {wall:.1f} s, {rss / 2**20:.0f} MiB resident")
    assert wall <= 120, wall
    assert rss <= GiB, rss
    got = json.loads((tmp_path / "out.json").read_text())
    want = json.loads(subprocess.run([TXK, "mem", "--snapshot", REAL, "--json"], stdout=subprocess.PIPE,
                                     text=True, timeout=120).stdout)
    for k in ("reserved", "allocated", "requested", "largest_free_block", "devices", "top", "model"):
        assert got[k] == want[k], k
    assert got["timeline"]["events"] == events
    # The repeated trace allocates the real one's 221 surviving blocks again at addresses still live: no
    # allocator records that, so the replay (each request rounded and split into the block PyTorch's
    # allocator gave it, snapshot_trace.c) cannot lay later repetitions out as the real file, and says so.
    g, w = got["timeline"], want["timeline"]
    assert abs(g["peak_allocated"] - w["peak_allocated"]) <= w["peak_allocated"] // 200, (g, w)
    assert g["replay"]["unplaced"] > w["replay"]["unplaced"], (g["replay"], w["replay"])
