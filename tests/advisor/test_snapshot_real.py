"""`txk mem --snapshot` on the five real PyTorch snapshots in
tests/data/pytorch_snapshots (origin and licence in its README), with
expectations written from what each job was:

- llm_oom.pickle: FlexGen serving an OPT-class decoder (vocab 50272, hidden
  4096) at an OOM, its live blocks nearly all 16-bit weights;
- llm_inference.pickle: the same server with a smaller model;
- gpt_lm_step.pickle: one training step (forward, backward, AdamW) of a
  GPT-style LM, recorded with stacks="all", with allocator_settings and an
  Optimizer.step annotation;
- opt_zeroth_order.pickle: zeroth-order fine-tuning of OPT-125m on Windows;
- rl_vllm_rollout.pickle: a Megatron actor and a vLLM rollout of Qwen2,
  most of it vLLM's KV cache allocated at its __init__, no trace.

Figures are pickle.load sums; owners are Python frames (no C, C++ or
CPython file shown as code); the decoders are not called BERT and nothing is
planned for them; the first fix where weights or an engine's pool fill the
card is not `del`."""
import os, pickle, re, sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import test_snapshot_bert as tsb  # noqa: E402  (txk mem)

REAL = os.path.join(ROOT, "tests", "data", "pytorch_snapshots")
FILES = ["llm_oom.pickle", "llm_inference.pickle", "gpt_lm_step.pickle", "opt_zeroth_order.pickle",
         "rl_vllm_rollout.pickle"]
# a native file named as code: C/C++ sources and objects, "??"
NATIVE = re.compile(r"(\.(c|cc|cpp|cxx|h|hpp|o|so)\b|\?\?|\bat::|c10::)")


def real(name):
    path = os.path.join(REAL, name)
    assert os.path.exists(path), f"{path} is missing: the real snapshots live in the repository"
    return path


def mem(path, *extra):
    return tsb.mem(path, *extra).stdout


mem_json = tsb.mem_json


def python_sums(snap):
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    free = [b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "inactive"]
    return {"reserved": sum(s["total_size"] for s in snap["segments"]), "allocated": sum(b["size"] for b in live),
            "requested": sum(b.get("requested_size", 0) for b in live), "largest_free_block": max(free, default=0)}


@pytest.mark.parametrize("name", FILES)
def test_figures_exact_and_owners_are_python_frames(name):
    path = real(name)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    j = mem_json(path)
    for k, v in python_sums(snap).items():
        assert j[k] == v, (name, k, j[k], v)
    # one device in each: its row is the whole file's
    assert [d["device"] for d in j["devices"]] == [0], j["devices"]
    assert j["devices"][0]["reserved"] == j["reserved"] and j["devices"][0]["allocated"] == j["allocated"]
    owners = [t["owner"] for t in j["top"]]
    assert owners and not [o for o in owners if NATIVE.search(o)], owners
    # Windows paths shortened like POSIX ones
    assert not [o for o in owners if "\\" in o or "C:" in o], owners
    # every owner is a frame of Python code, the autograd engine's backward, or blocks allocated
    # before the history was recorded (gpt_lm_step's weights: PyTorch kept no frames for them)
    for o in owners:
        assert re.match(r"(cell, line \d+|[\w.-]+\.py, line \d+ \(|library: |backward \(autograd engine\)$|"
                        r"no frames \(allocated before the history was recorded\)$)", o), (name, owners)


@pytest.mark.parametrize("name,family", [("llm_oom.pickle", "opt"), ("opt_zeroth_order.pickle", "opt"),
                                         ("gpt_lm_step.pickle", "decoder"), ("rl_vllm_rollout.pickle", "qwen")])
def test_decoders_are_not_called_bert(name, family):
    path = real(name)
    m = mem_json(path)["model"]
    assert m["family"] == family and m["planned"] is False and "plan" not in m, m
    assert m["why"], m
    out = mem(path)
    assert "BERT-shaped" not in out and "BERT =" not in out and "planned as it ran" not in out, out


def test_llm_oom_weights_fill_the_card_first_fix_shrinks_them():
    """10.95 of the 11.03 GiB are 16-bit weights (about 5.9B parameters so
    far): judged against a card of 11.5 GiB, the fixes are 4/8-bit loading,
    offload, a smaller model or a bigger card, never `del`. The file holds no
    OOM event: without the card's size, capacity is not claimed."""
    assert mem_json(real("llm_oom.pickle"))["diagnoses"] == []
    assert "no device capacity was given" in mem(real("llm_oom.pickle"))
    j = mem_json(real("llm_oom.pickle"), "--capacity", "11.5GiB")
    assert j["diagnoses"][0]["id"] == "capacity", j["diagnoses"]
    assert j["model"]["param_bytes"] > 10.9 * 2**30 and j["model"]["dtype"] == "fp16/bf16", j["model"]
    ids = [f["id"] for f in j["fixes"]]
    assert ids[0] == "quantize" and "del" not in ids, ids
    assert "load_in_4bit=True" in j["fixes"][0]["code"] and j["fixes"][0]["saves"] > 8 * 2**30, j["fixes"][0]
    assert {"offload", "smaller_model", "gpu"} <= set(ids), ids


def test_vllm_rollout_first_fix_is_the_engines_memory_fraction():
    j = mem_json(real("rl_vllm_rollout.pickle"))
    assert j["diagnoses"][0]["id"] == "engine_pool", j["diagnoses"]
    f = j["fixes"][0]
    assert f["id"] == "memory_fraction" and "gpu_memory_utilization" in f["code"], f
    assert not any(x["id"] == "del" and "cache_engine" in x["text"] for x in j["fixes"]), j["fixes"]
    assert j["leak"]["found"] is False and j["timeline"]["events"] == 0


def test_gpt_lm_step_one_step_is_no_leak_and_its_phases_are_named():
    """One step: forward, backward, AdamW (whose state is made at its step):
    no leak; the owner table has a phase column from the Optimizer.step
    annotation and the frames; the gradients come from the autograd
    engine's thread (C++ frames only): "backward (autograd engine)"."""
    path = real("gpt_lm_step.pickle")
    j = mem_json(path)
    assert j["leak"]["found"] is False, j["leak"]
    assert "leak" not in [d["id"] for d in j["diagnoses"]]
    assert j["phase_at_peak"] == "backward", j["phase_at_peak"]
    phases = {t["owner"]: t["phase"] for t in j["top"]}
    assert phases.get("backward (autograd engine)") == "backward", phases
    assert [p for o, p in phases.items() if o.startswith("optimizer.py")] == ["Optimizer.step (AdamW)"] * 2, phases
    assert j["expandable_segments"] is False and j["fixes"][0]["id"] == "expandable_segments", j["fixes"]
    out = mem(path)
    assert "phase" in out and "during backward" in out, out


def test_opt_zeroth_order_windows_owners():
    j = mem_json(real("opt_zeroth_order.pickle"))
    owners = [t["owner"] for t in j["top"]]
    assert owners[0].startswith("client.py, line 176 (reset_model)"), owners
    assert "adam_forward.py, line 267 (update_K_param_paramwise)" in owners, owners
