"""`txk mem --snapshot` on snapshots built here the way PyTorch 2.x lays them
out (pickled with builtin types only), one for each shape the real world
showed the reader wrong: stacks="all" frames (C++ and CPython before the
Python ones, Windows paths), a block from the autograd engine's thread,
external_annotations, expandable segments on, three devices with the OOM on
device 1, an OOM trace with a BERT whose plan would fit a large card, one
training step whose activations rise layer by layer (growth, no leak) and a
loop that keeps its losses (a leak), BERT-large's MLM logits beside its word
embeddings, and a real file re-pickled with protocol 5."""
import os, pickle, sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REAL = os.path.join(ROOT, "tests", "data", "pytorch_snapshots")
MiB = 1 << 20
sys.path.insert(0, HERE)
import test_snapshot_bert as tsb  # noqa: E402  (BERT parameter shapes, txk mem)
import test_snapshot_leak as tsl  # noqa: E402  (a loop's trace as PyTorch records it)

LINEAR = "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py"
TRAIN = "/home/u/proj/train.py"
MODEL = "/home/u/proj/model.py"


def f(file, line, name):
    return {"filename": file, "line": line, "name": name}


# what PyTorch records with stacks="all": the allocator and ATen first, CPython's own C, then Python
CXX_HEAD = [f("??", 0, "torch::unwind::unwind()"), f("memory_snapshot.cpp", 0, "gather_with_cpp()"),
            f("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"),
            f("", 0, "at::detail::empty_generic"), f("Linear.cpp", 0, "at::native::linear"),
            f("", 0, "at::_ops::linear::call(at::Tensor const&, at::Tensor const&)"),
            f("methodobject.c", 543, "cfunction_call"), f("descrobject.c", 344, "method_vectorcall_VARARGS_KEYWORDS"),
            f("??", 0, "_PyEval_EvalFrameDefault")]
AUTOGRAD = [f("??", 0, "torch::unwind::unwind()"),
            f("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"),
            f("", 0, "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
            f("engine.cpp", 0, "torch::autograd::Engine::evaluate_function(std::shared_ptr<GraphTask>&, Node*)"),
            f("engine.cpp", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)"),
            f("thread48.o", 0, "execute_native_thread_routine"), f("??", 0, "start_thread")]


def py(line=40, train=TRAIN, lib=LINEAR):
    return [f(lib, 116, "forward"), f(train, line, "step"), f(train, 90, "<module>")]


def seg(addr, blocks, device=0, expandable=False, stream=0):
    total = sum(b["size"] for b in blocks)
    return {"device": device, "address": addr, "total_size": total,
            "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
            "active_size": 0, "requested_size": 0, "stream": stream, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": expandable, "frames": [],
            "blocks": [dict(b, address=addr + sum(x["size"] for x in blocks[:i])) for i, b in enumerate(blocks)]}


def blk(size, state="active_allocated", frames=()):
    return {"size": size, "requested_size": size if state == "active_allocated" else 0, "state": state,
            "frames": list(frames)}


def write(tmp_path, obj, name="snap.pickle", proto=4):
    p = tmp_path / name
    p.write_bytes(pickle.dumps(obj, protocol=proto))
    return str(p)


def mem(path, *extra):
    return tsb.mem(path, *extra).stdout


mem_json = tsb.mem_json


def test_stacks_all_python_owner_windows_paths_and_autograd_thread(tmp_path):
    win = [f("C:\\Users\\me\\venv\\Lib\\site-packages\\torch\\nn\\modules\\linear.py", 116, "forward"),
           f("C:\\Users\\me\\proj\\train.py", 52, "step")]
    s = seg(0, [blk(40 * MiB, frames=CXX_HEAD + py(40)), blk(30 * MiB, frames=AUTOGRAD),
                blk(20 * MiB, frames=CXX_HEAD + win), blk(2 * MiB, "inactive")])
    path = write(tmp_path, {"segments": [s], "device_traces": [[]]})
    top = {t["owner"]: t["bytes"] for t in mem_json(path)["top"]}
    assert top == {"train.py, line 40 (step) · torch/nn/modules/linear.py": 40 * MiB,
                   "backward (autograd engine)": 30 * MiB,
                   "train.py, line 52 (step) · torch/nn/modules/linear.py": 20 * MiB}, top
    out = mem(path)
    for native in ("methodobject.c", "descrobject.c", "thread48.o", "Linear.cpp", "C:\\"):
        assert native not in out, (native, out)


class Trace(tsl.Loop):
    """test_snapshot_leak's Loop (each tensor its own segment, the trace as
    PyTorch records it) on a device of its own."""

    def __init__(self, device=0):
        super().__init__()
        self.addr, self.device = (1 << 40) * (device + 1), device

    def add(self, action, addr, size, frames, **kw):
        self.ev(action, addr, size, frames)
        self.trace[-1].update(kw)

    def segments(self, expandable=False):
        return [seg(a, [blk(s, frames=fr)], self.device, expandable) for a, (s, fr) in sorted(self.live.items())]


def test_phase_at_peak_from_annotations_and_phase_column(tmp_path):
    tr = Trace()
    weights = [tr.alloc(8 * MiB, py(5)) for _ in range(4)]
    ann = [{"name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "stage": "START", "device": 0,
            "time_us": tr.t + 1}]
    batch = tr.alloc(1 * MiB, py(30))
    ann.append(dict(ann[0], stage="END", time_us=tr.t + 1))
    acts = [tr.alloc(6 * MiB, py(31)) for _ in range(4)]
    for a in acts:
        tr.free(a)
    ann.append({"name": "Optimizer.step#AdamW.step", "stage": "START", "device": 0, "time_us": tr.t + 1})
    state = [tr.alloc(16 * MiB, py(33)) for _ in range(2)]  # AdamW's state: the peak, inside the step
    ann.append(dict(ann[-1], stage="END", time_us=tr.t + 1))
    snap = {"segments": tr.segments(), "device_traces": [tr.trace], "external_annotations": ann,
            "allocator_settings": {"expandable_segments": False}}
    path = write(tmp_path, snap)
    j = mem_json(path)
    assert j["phase_at_peak"] == "Optimizer.step (AdamW)", j["phase_at_peak"]
    phases = {t["owner"].split(" · ")[0]: t["phase"] for t in j["top"]}
    assert phases["train.py, line 33 (step)"] == "Optimizer.step (AdamW)", phases
    assert phases["train.py, line 30 (step)"] == "DataLoader", phases
    # no annotation open: the frames say what ran (nn.Linear's forward)
    assert phases["train.py, line 5 (step)"] == "forward (linear.py, line 116)", phases
    out = mem(path)
    assert "during Optimizer.step (AdamW)" in out and " phase " in out, out
    assert weights and batch and state


def fragmented(expandable):
    blocks = []
    for i in range(50):
        blocks += [blk(2 * MiB, frames=py(12)), blk(18 * MiB, "inactive")]
    return [seg(0, blocks, expandable=expandable)]


def test_expandable_segments_on_is_not_advised(tmp_path):
    oom = {"action": "oom", "addr": 0, "size": 40 * MiB, "stream": 0, "time_us": 1, "device_free": 0, "frames": []}
    off = mem_json(write(tmp_path, {"segments": fragmented(False), "device_traces": [[oom]]}, "off.pickle"))
    assert off["fixes"][0]["id"] == "expandable_segments", off["fixes"]
    for name, snap in (("settings", {"segments": fragmented(False), "device_traces": [[oom]],
                                     "allocator_settings": {"expandable_segments": True}}),
                       ("segments", {"segments": fragmented(True), "device_traces": [[oom]]})):
        j = mem_json(write(tmp_path, snap, name + ".pickle"))
        assert j["expandable_segments"] is True, name
        assert j["diagnoses"][0]["id"] == "fragmentation" and "already on" in j["diagnoses"][0]["text"], j
        assert "expandable_segments" not in [x["id"] for x in j["fixes"]], (name, j["fixes"])
        assert not any("expandable_segments:True" in x["code"] for x in j["fixes"]), j["fixes"]


def test_three_devices_oom_on_device_1(tmp_path):
    segs, traces = [], []
    for d, gib in enumerate((3, 9, 2)):
        tr = Trace(d)
        for _ in range(gib):
            tr.alloc(1 << 30, py(20))
        if d == 1:
            tr.add("oom", 0, 2 << 30, py(21), device_free=100 * MiB)
        segs += tr.segments()
        traces.append(tr.trace)
    path = write(tmp_path, {"segments": segs, "device_traces": traces})
    j = mem_json(path)
    assert j["reserved"] == j["allocated"] == 14 << 30  # the whole file's, as before
    assert [(d["device"], d["reserved"], d["allocated"]) for d in j["devices"]] == \
        [(0, 3 << 30, 3 << 30), (1, 9 << 30, 9 << 30), (2, 2 << 30, 2 << 30)], j["devices"]
    assert j["oom"]["device"] == 1 and j["oom"]["size"] == 2 << 30, j["oom"]
    cap = next(d for d in j["diagnoses"] if d["id"] == "capacity")
    assert "on device 1 (of 3)" in cap["text"] and "9.00 GiB of the 9.00 GiB" in cap["text"], cap
    out = mem(path)
    assert "out of memory on device 1" in out and "device 2: reserved 2.00 GiB" in out, out


def test_oom_trace_is_never_shown_as_fits(tmp_path):
    """bert-base at 32 x 512 ran out of memory; planned on an 80 GiB card it
    would fit, which disagrees with the file: withheld, never "fits"."""
    path = write(tmp_path, tsb.snapshot())
    j = mem_json(path, "--gpu", "a100-80")
    m = j["model"]
    assert m["family"] == "bert" and m["preset"] == "bert-base-uncased", m
    assert "plan" not in m and "ran out of memory; the plan fits" in m["plan_withheld"]["reason"], m
    out = mem(path, "--gpu", "a100-80")
    assert "-> fits" not in out and "withheld" in out, out
    # on the T4 it ran on, the plan agrees (does not fit) and is shown, with its engine
    m = mem_json(path, "--gpu", "t4")["model"]
    assert m["plan"]["fits"] is False and m["plan"]["engine"] == "pytorch", m


def step_frames(layer_line, outer):
    return [f(LINEAR, 116, "forward"), f(MODEL, layer_line, "forward"), f(TRAIN, outer, "main")]


def test_one_step_with_rising_activations_is_growth_not_a_leak(tmp_path):
    """One step's forward: 24 layers, each keeping 6 MiB for backward and
    freeing a 4 MiB scratch; the snapshot is taken at the end of forward."""
    tr = Trace()
    for _ in range(4):
        tr.alloc(10 * MiB, step_frames(8, 20))
    for layer in range(24):
        tr.alloc(6 * MiB, step_frames(40, 21))
        tr.free(tr.alloc(4 * MiB, step_frames(41, 21)))
    j = mem_json(write(tmp_path, {"segments": tr.segments(), "device_traces": [tr.trace]}))
    assert j["leak"]["found"] is False and "leak" not in [d["id"] for d in j["diagnoses"]], j["diagnoses"]
    assert j["growth"]["found"] is True and j["diagnoses"][0]["id"] == "growth", j["diagnoses"]
    assert "leak" not in [x["id"] for x in j["fixes"]], j["fixes"]


def test_loop_keeping_its_losses_is_a_leak(tmp_path):
    """for batch in loader: out = model(batch) (line 21, 4 activations, all
    freed), losses.append(loss) (line 22, 2 MiB kept each time)."""
    tr = Trace()
    for _ in range(4):
        tr.alloc(10 * MiB, step_frames(8, 20))
    for it in range(10):
        acts = [tr.alloc(6 * MiB, step_frames(40, 21)) for _ in range(4)]
        tr.alloc(2 * MiB, [f(TRAIN, 22, "main")])
        for a in acts:
            tr.free(a)
    j = mem_json(write(tmp_path, {"segments": tr.segments(), "device_traces": [tr.trace]}))
    assert j["leak"]["found"] is True and j["diagnoses"][0]["id"] == "leak", j["diagnoses"]
    assert j["leak"]["owner"] == "train.py, line 22 (main)" and j["leak"]["per_iteration"] == 2 * MiB, j["leak"]
    assert j["growth"]["found"] is False


def test_bert_large_logits_are_not_its_vocab(tmp_path):
    """BERT-large in a no_grad forward with its MLM logits [8, 512, 30522]
    live: the vocab is the word embeddings' 30522, not the logits' rows."""
    segs, addr = [], 1 << 40
    for name, n in tsb.bert_params(H=1024, L=24, I=4096):
        segs.append(seg(addr, [blk(max(512, n * 4), frames=CXX_HEAD)]))
        addr += 1 << 30
    segs.append(seg(addr, [blk(8 * 512 * 30522 * 4, frames=CXX_HEAD + py(60))]))
    j = mem_json(write(tmp_path, {"segments": segs, "device_traces": [[]]}))
    m = j["model"]
    assert m["family"] == "bert" and (m["hidden"], m["layers"], m["vocab"]) == (1024, 24, 30522), m
    assert m["preset"] and m["preset"].startswith("bert-large"), m


def test_protocol_5_gives_the_same_figures(tmp_path):
    src = os.path.join(REAL, "gpt_lm_step.pickle")
    assert os.path.exists(src), f"{src} is missing: the real snapshots live in the repository"
    with open(src, "rb") as fh:
        snap = pickle.load(fh)
    p5 = write(tmp_path, snap, "p5.pickle", proto=5)
    with open(p5, "rb") as fh:
        assert fh.read(2) == b"\x80\x05"
    a, b = mem_json(src), mem_json(p5)
    for k in ("reserved", "allocated", "requested", "largest_free_block", "top", "devices", "timeline", "model",
              "diagnoses", "phase_at_peak"):
        assert a[k] == b[k], k


def decoder_blocks(H, L, I, V, gated, positions=0, frames=CXX_HEAD, elem=2, kv=None):
    """One copy of a decoder's weights: embeddings (and an untied head),
    q/k/v/o (k and v kv x H with grouped heads), the MLP (gate/up/down, or
    fc1/fc2), learned positions when given."""
    sizes = [V * H, V * H] + ([positions * H] if positions else [])
    for _ in range(L):
        sizes += [H * H, (kv or H) * H, (kv or H) * H, H * H] + [H * I] * (3 if gated else 2) + [H, H]
    return [seg(i << 30, [blk(n * elem, frames=frames)]) for i, n in enumerate(sizes)]


@pytest.mark.parametrize("name,blocks,family", [
    ("llama", dict(H=512, L=4, I=1376, V=32000, gated=True), "llama"),
    ("mistral", dict(H=512, L=4, I=1792, V=32768, gated=True, kv=128), "mistral"),
    ("qwen", dict(H=512, L=4, I=1376, V=151936, gated=True), "qwen"),
    ("gpt2", dict(H=256, L=6, I=1024, V=50257, gated=False, positions=1024), "gpt2"),
    ("opt", dict(H=256, L=6, I=1024, V=50272, gated=False, positions=2050), "opt"),
    ("other", dict(H=512, L=4, I=1376, V=12000, gated=True), "decoder"),
    ("qwen-frames", dict(H=512, L=4, I=1376, V=12000, gated=True,
                         frames=CXX_HEAD + [f("/venv/lib/python3.12/site-packages/transformers/models/qwen3/"
                                              "modeling_qwen3.py", 216, "forward")] + py(12)), "qwen"),
])
def test_decoders_named_with_their_evidence(tmp_path, name, blocks, family):
    j = mem_json(write(tmp_path, {"segments": decoder_blocks(**blocks), "device_traces": [[]]}))
    m = j["model"]
    assert m["family"] == family and m["planned"] is False and "plan" not in m, (name, m)
    assert m["why"] and ("modeling_qwen3.py" in m["why"]) == (name == "qwen-frames"), m["why"]


def test_nothing_parameter_shaped_is_unknown_with_why(tmp_path):
    s = seg(0, [blk(3 * MiB + 512 * i, frames=py(5)) for i in range(5)])
    m = mem_json(write(tmp_path, {"segments": [s], "device_traces": [[]]}))["model"]
    assert m["family"] == "unknown" and "no set of parameter-shaped blocks" in m["why"], m


def test_one_line_loop_body_keeping_its_losses_is_a_leak(tmp_path):
    """`for b in loader: losses.append(model(b).loss)`: every allocation
    comes from line 21, so the lines cannot show the rounds; each round
    gives back most of what it took, which a step's growth does not."""
    tr = Trace()
    for _ in range(4):
        tr.alloc(10 * MiB, step_frames(8, 20))
    for it in range(10):
        acts = [tr.alloc(6 * MiB, step_frames(40, 21)) for _ in range(4)]
        tr.alloc(2 * MiB, step_frames(44, 21))
        for a in acts:
            tr.free(a)
    j = mem_json(write(tmp_path, {"segments": tr.segments(), "device_traces": [tr.trace]}))
    assert j["leak"]["found"] is True and j["growth"]["found"] is False, (j["leak"], j["growth"])
    assert j["leak"]["per_iteration"] == 2 * MiB, j["leak"]
