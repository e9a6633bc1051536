"""`txk train --snapshot FILE` writes txkernel's allocator as a PyTorch memory
snapshot: Python's pickle loads it with builtin types only (a find_class that
refuses everything), only the opcodes PyTorch's web viewer decodes appear,
each segment's blocks add up to its total_size, replaying alloc/free_completed
reaches the run's peak allocated to the byte, frames name layers with their
category and phase; at a run-time OOM the file holds the state at the OOM and an `oom`
event, and `txk mem --snapshot` reads back the OOM record's own figures."""
import io, json, os, pickle, pickletools, re, subprocess, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data")

# the opcodes MemoryViz.js's unpickler decodes (issue 19)
VIEWER_OPS = {"PROTO", "FRAME", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "MARK", "SETITEM", "SETITEMS", "APPEND",
              "APPENDS", "SHORT_BINUNICODE", "BINUNICODE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "NONE",
              "NEWTRUE", "NEWFALSE", "TUPLE1", "TUPLE2", "TUPLE3", "MEMOIZE", "BINPUT", "BINGET", "LONG_BINGET", "STOP"}


class BuiltinsOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise AssertionError(f"the snapshot asks for a global: {module}.{name}")


def config():
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(f"model: bert-tiny\ninit: random\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"
            f"vocab: {DATA}/vocab_cased.txt\ntrain_file: {DATA}/reviews_train.csv\n"
            f"dev_split: 0\nmax_examples: 16\nmax_len: 32\nbatch_size: 8\nmax_steps: 2\ndevice: cpu\n")
    f.close()
    return f.name


def train(*extra):
    snap = tempfile.mktemp(suffix=".pickle")
    r = subprocess.run([TXK, "train", config(), *extra, "--snapshot", snap], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    m = re.search(r"snapshot written to (\S+): reserved (\d+) B, allocated (\d+) B, peak allocated (\d+) B", r.stderr)
    assert m, r.stderr
    return r, snap, {"reserved": int(m.group(2)), "allocated": int(m.group(3)), "peak": int(m.group(4))}


def load_checked(path):
    raw = open(path, "rb").read()
    ops = {op.name for op, _, _ in pickletools.genops(raw)}
    assert ops <= VIEWER_OPS, ops - VIEWER_OPS
    snap = BuiltinsOnly(io.BytesIO(raw)).load()
    for s in snap["segments"]:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"], s
        assert s["allocated_size"] == sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
    return snap


def replay_peak(trace):
    cur = peak = 0
    for e in trace:
        if e["action"] == "alloc":
            cur += e["size"]
        elif e["action"] == "free_completed":
            cur -= e["size"]
        peak = max(peak, cur)
    return cur, peak


def read_back(path):
    r = subprocess.run([TXK, "mem", "--snapshot", path, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_train_snapshot_loads_and_replays_to_the_peak():
    r, path, said = train()
    assert r.returncode == 0, r.stderr
    snap = load_checked(path)
    trace = snap["device_traces"][0]
    end, peak = replay_peak(trace)
    # the run's peak as its own report prints it, and the allocator's, to the byte
    m = re.search(r"peak ([\d.]+ \w+) allocated", r.stdout)
    assert m and m.group(1) == f"{peak / 2**20:.2f} MiB", (peak, r.stdout)
    assert peak == said["peak"] and end == said["allocated"] == 0, (peak, said)
    names = {f["name"] for e in trace for f in e["frames"]}
    assert "bert.encoder.layer.0.attention.self · act · forward" in names, sorted(names)[:40]
    assert any(n.endswith(" · temp · backward") for n in names)
    assert any(n.endswith(" · optim · optimizer") for n in names)
    assert any(n.endswith(" · param") for n in names)  # weights load before any step: no phase
    acts = {e["action"] for e in trace}
    assert {"segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"} <= acts, acts
    back = read_back(path)
    assert (back["reserved"], back["allocated"]) == (said["reserved"], said["allocated"])
    assert back["timeline"]["peak_allocated"] == said["peak"]
    os.unlink(path)


def test_oom_snapshot_holds_the_state_at_the_oom():
    r, path, said = train("capacity=21MiB", "--no-plan", "--json")
    assert r.returncode == 4, r.stderr
    rec = json.loads(r.stdout)  # the run's own OOM record
    snap = load_checked(path)
    assert snap["segments"], "the state at the OOM has the segment the run held"
    trace = snap["device_traces"][0]
    oom = [e for e in trace if e["action"] == "oom"]
    assert len(oom) == 1 and trace[-1] is oom[0]
    assert oom[0]["size"] == rec["requested"] and oom[0]["device_free"] == rec["free"]
    assert oom[0]["frames"][0]["name"] == f"{rec['owner']} · {rec['category']}"
    _, peak = replay_peak(trace)
    assert peak == said["peak"]
    back = read_back(path)
    for k in ("reserved", "allocated", "largest_free_block"):
        assert back[k] == rec[k], (k, back[k], rec[k])
    assert back["oom"] == {"size": rec["requested"], "device_free": rec["free"], "device": 0, "phase": None}
    assert back["diagnoses"][0]["id"] == "capacity"
    assert back["top"][0]["owner"] == "bert.embeddings.word_embeddings · param"
    os.unlink(path)


def test_plan_snapshot_is_the_planned_step():
    """`txk plan --snapshot`: the planned step (meta device, before anything
    runs) as a snapshot the viewer opens: the same checks, its replay peaks at
    the plan's peak allocated to the byte, and a plan that does not fit ends
    with the `oom` event of the planned step."""
    path = tempfile.mktemp(suffix=".pickle")
    r = subprocess.run([TXK, "plan", config(), "--snapshot", path, "--json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    snap = load_checked(path)
    trace = snap["device_traces"][0]
    _, peak = replay_peak(trace)
    assert peak == plan["peak_allocated"]
    names = {f["name"] for e in trace for f in e["frames"]}
    assert "bert.encoder.layer.0.attention.self · act · forward" in names
    assert any(n.endswith(" · optim · optimizer") for n in names)
    assert not any(e["action"] == "oom" for e in trace)
    os.unlink(path)

    r = subprocess.run([TXK, "plan", config(), "capacity=12MiB", "--snapshot", path, "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 3, r.stderr  # the plan does not fit
    snap = load_checked(path)
    ooms = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert len(ooms) == 1 and ooms[0]["size"] > 0
    os.unlink(path)


def test_txmem_save_pickle_after_a_run():
    """%txmem --save FILE.pickle after a %%txtrain: the viewer's format, and
    its trace is the run (recorded since %txmem --record: the allocator's
    history is off unless asked): replaying it reaches the device's peak
    allocated."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
    import txk_util as u
    km, kc = u.start()
    try:
        cfg = open(config()).read()
        reply, outs = u.run_cell(kc, "%txmem --record", timeout=30)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "Recording the allocator's last 262144 events" in outs[0]["content"]["text"], outs
        reply, _ = u.run_cell(kc, "%%txtrain\n" + cfg, timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        path = tempfile.mktemp(suffix=".pickle")
        reply, outs = u.run_cell(kc, f"%txmem --json --save {path}", timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        mem = [o["content"]["data"]["application/json"] for o in outs
               if "application/json" in (o["content"].get("data") or {})][-1]
        snap = load_checked(path)
        end, peak = replay_peak(snap["device_traces"][0])
        assert peak == mem["allocated_peak"] and end == mem["allocated"] == 0, (peak, mem)
        os.unlink(path)
    finally:
        u.stop(km, kc)
