"""The `leak` diagnosis of `txk mem --snapshot`: memory that stays allocated
from one training iteration to the next and grows. The snapshots are built
here the way torch.cuda.memory._snapshot() lays them out (segments with
blocks, device_traces with alloc / free_requested / free_completed /
segment_alloc events and frames), pickled with builtin types only: a loop
that appends each step's logits to a list on the GPU, one that keeps each
step's graph (`total_loss += loss` in evaluation), and the same loop healthy,
event for event the same size. The two real snapshots hold one trace event
each (no iterations at all), so they must not show a leak."""
import json, os, pickle, subprocess, tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
REAL = os.path.join(ROOT, "tests", "data", "pytorch_snapshots")
MiB = 1 << 20
CELL = "/tmp/ipykernel_311/2051224879.py"
LINEAR = "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py"


def fr(line, lib=LINEAR):
    return [{"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"},
            {"filename": lib, "line": 116, "name": "forward"},
            {"filename": CELL, "line": line, "name": "<module>"}]


class Loop:
    """A small allocator: each tensor its own segment, so the end state is
    simply every block still live. Records the trace as PyTorch does."""

    def __init__(self):
        self.trace, self.live, self.addr, self.t = [], {}, 1 << 44, 0

    def ev(self, action, addr, size, frames):
        self.t += 1
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.t,
                           "frames": frames})

    def alloc(self, size, frames):
        a = self.addr
        self.addr += size
        self.ev("segment_alloc", a, size, [])
        self.ev("alloc", a, size, frames)
        self.live[a] = (size, frames)
        return a

    def free(self, a):
        size, frames = self.live.pop(a)
        self.ev("free_requested", a, size, frames)
        self.ev("free_completed", a, size, frames)

    def snapshot(self):
        segs = [{"device": 0, "address": a, "total_size": s, "allocated_size": s, "active_size": s,
                 "requested_size": s, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                 "is_expandable": False, "frames": [],
                 "blocks": [{"address": a, "size": s, "requested_size": s, "state": "active_allocated",
                             "frames": f}]} for a, (s, f) in sorted(self.live.items())]
        return {"segments": segs, "device_traces": [self.trace]}


def training(keep, iterations=12):
    """Weights (40 MiB) and a loop: 8 activations of 6 MiB and a 4 MiB
    scratch in forward, the scratch freed at its end, the activations in
    backward. keep="logits": the step's 2 MiB logits appended to a list
    (line 31) and never freed; keep="graph": the evaluation graph kept
    (`total_loss += loss` without no_grad): every activation stays; None:
    the logits freed at the end of the step, like the healthy loop."""
    lp = Loop()
    for i in range(4):
        lp.alloc(10 * MiB, fr(5))
    for it in range(iterations):
        acts = [lp.alloc(6 * MiB, fr(30)) for _ in range(8)]
        scratch = lp.alloc(4 * MiB, fr(30))
        logits = lp.alloc(2 * MiB, fr(31))
        lp.free(scratch)
        if keep != "graph":
            for a in reversed(acts):
                lp.free(a)
        if keep is None:
            lp.free(logits)
    return lp.snapshot()


def write(obj):
    f = tempfile.NamedTemporaryFile("wb", suffix=".pickle", delete=False)
    f.write(pickle.dumps(obj, protocol=4))
    f.close()
    return f.name


def summary(path, *extra):
    r = subprocess.run([TXK, "mem", "--snapshot", path, "--json", *extra], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def ids(j):
    return [d["id"] for d in j["diagnoses"]]


def test_logits_kept_in_a_list_is_a_leak_with_its_owner_and_fix():
    path = write(training("logits"))
    j = summary(path)
    assert ids(j)[0] == "leak", j["diagnoses"]
    text = j["diagnoses"][0]["text"]
    # 2 MiB stays per iteration: the troughs between the 12 peaks rise by it
    assert "grows by 2.00 MiB per iteration" in text, text
    assert "cell, line 31" in text and "torch/nn/modules/linear.py" in text, text
    assert j["leak"]["per_iteration"] == 2 * MiB and j["leak"]["iterations"] == 12, j["leak"]
    fix = j["fixes"][0]
    assert fix["id"] == "leak" and ".detach().cpu()" in fix["code"] and "loss.item()" in fix["code"], fix
    # what piled up between the second and the last trough
    assert fix["saves"] == j["leak"]["total"] == 2 * MiB * 9, fix
    rc = subprocess.run([TXK, "mem", "--snapshot", path], stdout=subprocess.PIPE, text=True).stdout
    assert "leak: allocated memory that stays" in rc and "total_loss += loss.item()" in rc, rc
    os.unlink(path)


def test_kept_graph_is_a_leak_of_the_whole_forward():
    path = write(training("graph"))
    j = summary(path)
    assert ids(j)[0] == "leak", j["diagnoses"]
    assert j["leak"]["per_iteration"] == 50 * MiB, j["leak"]  # 8 x 6 MiB + 2 MiB each step
    assert "Stop keeping each iteration's autograd graph" in j["fixes"][0]["text"], j["fixes"][0]
    os.unlink(path)


def test_healthy_loop_of_the_same_size_is_not_a_leak():
    healthy, leaking = training(None), training("logits")
    # the same loop: the healthy one has two more events per iteration (the
    # logits' free), nothing else differs
    assert len(healthy["device_traces"][0]) == len(leaking["device_traces"][0]) + 2 * 12
    path = write(healthy)
    j = summary(path)
    assert "leak" not in ids(j) and j["leak"]["iterations"] == 12, (j["diagnoses"], j["leak"])
    assert not [f for f in j["fixes"] if f["id"] == "leak"]
    os.unlink(path)


def test_a_step_up_once_is_not_a_leak():
    """The optimizer's state appears in the first step and stays: the troughs
    rise once, then stay flat."""
    lp = Loop()
    lp.alloc(40 * MiB, fr(5))
    for it in range(10):
        acts = [lp.alloc(6 * MiB, fr(30)) for _ in range(8)]
        for a in reversed(acts):
            lp.free(a)
        if it == 0:
            lp.alloc(80 * MiB, fr(40, "/usr/lib/python3/dist-packages/torch/optim/adamw.py"))
    path = write(lp.snapshot())
    j = summary(path)
    assert "leak" not in ids(j), j["diagnoses"]
    os.unlink(path)


@pytest.mark.parametrize("name", ["llm_oom.pickle", "llm_inference.pickle"])
def test_real_snapshots_show_no_leak(name):
    """Both real files carry one trace event (a 'snapshot' and a
    'free_completed'): no iterations, so nothing can be said to grow."""
    path = os.path.join(REAL, name)
    assert os.path.exists(path), f"{path} is missing: the real snapshots live in the repository"
    j = summary(path)
    assert j["timeline"]["events"] == 1, j["timeline"]
    assert "leak" not in ids(j) and j["leak"]["iterations"] == 0, j["diagnoses"]
