"""PyTorch's own snapshot reader, `torch.cuda._memory_viz`, on the files
`txk train --snapshot` writes and on the real snapshots in
tests/data/pytorch_snapshots, on both peer rows (tests/peers.py):

- torch 2.x: its command line, `python -m torch.cuda._memory_viz stats FILE`
  (segsum, which asserts that every segment's blocks add up) and `trace FILE`
  (run in the test's process through runpy, as `-m` runs it), exits 0; the
  totals stats prints equal txkernel's; trace prints every event of the
  file, and torch's own pairing of allocs and frees
  (filter_alloc_free_pairs) leaves unfreed exactly txkernel's allocated
  bytes; its flame-graph input (`memory`, `segments`, with the collapsed
  stacks kept as text instead of fetching flamegraph.pl) sums to
  txkernel's reserved and allocated bytes exactly; `compare`, `trace_plot` and `segment_plot` (the HTML viewer's
  page, which embeds the snapshot re-pickled) run, and the embedded snapshot
  is the file's;
- torch 1.13: its functions take the list of segments its own `_snapshot()`
  returned (its command line reads only that list, not the dict every 2.x
  snapshot is): `stats`, `memory`, `segments` and `compare` on the file's
  segments, with the same totals.

"Ours" is what txk says: the run's "snapshot written to" line and
`txk mem --snapshot FILE --json`."""
import base64, contextlib, copy, io, json, os, pickle, re, runpy, subprocess, sys

import pytest

torch = pytest.importorskip("torch")
from torch.cuda import _memory_viz as viz  # noqa: E402

pytestmark = pytest.mark.peer  # on both rows: torch 1.13 and torch 2.x (tests/peers.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data")
REAL = os.path.join(ROOT, "tests", "data", "pytorch_snapshots")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def txk_train(tmp_path, *extra):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"model: bert-tiny\ninit: random\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"
                   f"vocab: {DATA}/vocab_cased.txt\ntrain_file: {DATA}/reviews_train.csv\n"
                   f"dev_split: 0\nmax_examples: 16\nmax_len: 32\nbatch_size: 8\nmax_steps: 2\ndevice: cpu\n")
    snap = str(tmp_path / ("snap%d.pickle" % len(list(tmp_path.glob("snap*")))))
    r = subprocess.run([TXK, "train", str(cfg), *extra, "--snapshot", snap], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    m = re.search(r"snapshot written to (\S+): reserved (\d+) B, allocated (\d+) B, peak allocated (\d+) B", r.stderr)
    assert m, r.stderr
    return r, snap, {"reserved": int(m.group(2)), "allocated": int(m.group(3))}


def txk_mem(path):
    r = subprocess.run([TXK, "mem", "--snapshot", path, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def flame_sums(text):
    """Collapsed stacks ("stream_0;...;STATE;frames BYTES" a line) summed: all, and active_allocated."""
    total = live = 0
    for line in text.splitlines():
        stack, n = line.rsplit(" ", 1)
        total += int(n)
        if ";active_allocated" in stack:
            live += int(n)
    return total, live


def cli(*args):
    """`python -m torch.cuda._memory_viz ARGS` run in this process (the same
    module code as __main__, without a second torch import): (exit status, stdout)."""
    out, argv, rc = io.StringIO(), sys.argv, 0
    sys.argv = ["_memory_viz.py", *args]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
    except SystemExit as e:
        rc = e.code or 0
    finally:
        sys.argv = argv
    return rc, out.getvalue()


def as_text(lines):
    return lines  # format_flamegraph's stand-in: the collapsed stacks themselves, no flamegraph.pl download


def fmt(n):
    """A byte count as _memory_viz prints it (its own formatter)."""
    return repr(viz.Bytes(n)) if not TORCH2 else viz._format_size(n)


def torch_reads(path, ours, whole_trace=True):
    """Every check PyTorch's reader of this row allows, against txk's figures
    `ours` (reserved, allocated, requested); returns the loaded snapshot.
    whole_trace: the trace holds every event since the allocator started (a
    txk file; PyTorch keeps only its last max_entries)."""
    with open(path, "rb") as f:
        snap = pickle.load(f)
    segs = snap["segments"]
    for fn in (viz.memory, viz.segments):
        total, live = flame_sums(fn(snap if TORCH2 else segs, format_flamegraph=as_text))
        assert (total, live) == (ours["reserved"], ours["allocated"]), (fn.__name__, total, live, ours)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the segments only one side has
        viz.compare(segs, segs[: len(segs) // 2], format_flamegraph=as_text)
    if not TORCH2:
        st = viz.stats(segs)
        assert st["total_size"].value == ours["reserved"] and st["segments"] == len(segs), st
        assert st.get("active_allocated", viz.Bytes(0)).value == ours["allocated"], st
        return snap
    rc, out = cli("stats", path)
    assert rc == 0, out
    # segsum counts an allocated block by its requested bytes (the rest is "internal" free)
    assert f"segments: {len(segs)}\n" in out, out
    assert f"total_reserved: {fmt(ours['reserved'])}\n" in out, (ours, out[-800:])
    assert f"total_allocated: {fmt(ours['requested'])}\n" in out, (ours, out[-800:])
    # the same sum to the byte, through the accessor segsum uses for a block's bytes
    live = [b for sg in segs for b in sg["blocks"] if b["state"] == "active_allocated"]
    assert sum(viz._block_extra(b)[1] for b in live) == ours["requested"]
    rc, out = cli("trace", path)
    assert rc == 0, out[-800:]
    trace = [e for t in snap["device_traces"] for e in t]
    assert f"{len(trace)} entries" in out, out[:400]
    # each event as trace() printed it, counted by kind, against the file's events
    printed = {"alloc": len(re.findall(r"^\S+ = \S+\[\d+:", out, re.M)), "free_requested": out.count("\ndel "),
               "free_completed": out.count("# free completed for "), "segment_alloc": out.count(" = cudaMalloc("),
               "segment_free": out.count("\ncudaFree("), "oom": out.count("raise OutOfMemoryError")}
    assert printed == {k: sum(e["action"] == k for e in trace) for k in printed}, printed
    # torch's own pairing of allocs and frees: what it leaves unfreed is what is allocated at the end
    with contextlib.redirect_stdout(io.StringIO()) as said:  # it prints a free_completed with no request
        kept = viz.filter_alloc_free_pairs(copy.deepcopy(snap))
    assert said.getvalue() == "", said.getvalue()[:400]
    if whole_trace:
        assert sum(e["size"] for t in kept["device_traces"] for e in t if e["action"] == "alloc") == ours["allocated"]
    # the HTML viewer's pages carry the snapshot itself, re-pickled
    for page in (viz.trace_plot(snap), viz.segment_plot(snap)):
        b64 = json.loads(re.search(r"const local_files = (\[.*\])", page).group(1))[0]["base64"]
        assert pickle.loads(base64.b64decode(b64).rstrip(b"\0")) == snap  # padding NULs follow STOP
    return snap


def test_a_txk_train_snapshot_reads_in_pytorchs_memory_viz(tmp_path):
    """A finished run: every segment released (reserved 0), its history in the trace."""
    r, path, said = txk_train(tmp_path)
    assert r.returncode == 0, r.stderr
    back = txk_mem(path)
    assert (back["reserved"], back["allocated"]) == (said["reserved"], said["allocated"])
    snap = torch_reads(path, back)
    assert len(snap["device_traces"][0]) > 100, "the run's trace is in the file"


def test_an_oom_snapshot_reads_in_pytorchs_memory_viz(tmp_path):
    """A run stopped by its capacity: the file holds the allocator at the OOM."""
    r, path, said = txk_train(tmp_path, "capacity=21MiB", "--no-plan", "--json")
    assert r.returncode == 4, r.stderr
    rec = json.loads(r.stdout)
    back = txk_mem(path)
    assert back["allocated"] == rec["allocated"] and back["reserved"] == rec["reserved"] > 0
    torch_reads(path, back)
    if TORCH2:
        out = cli("trace", path)[1]
        want = f"raise OutOfMemoryError # {fmt(rec['requested'])} requested, {fmt(rec['free'])} free in CUDA"
        assert want in out, out[-600:]


@pytest.mark.parametrize("name", ["llm_oom.pickle", "gpt_lm_step.pickle"])
def test_real_snapshots_totals_equal_pytorchs_reader(name):
    path = os.path.join(REAL, name)
    assert os.path.exists(path), f"{path} is missing: the real snapshots live in the repository"
    torch_reads(path, txk_mem(path), whole_trace=False)
