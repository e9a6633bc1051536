"""%%txwatch's OOM with recorded history, once the user has named their model
(`%txplan --torch-model NAME`, issue 41 point 6): the snapshot of that moment
is planned by tracing the named model when the snapshot's step (its batch and
length) is the traced config's, and the report says so (JSON `planned_by`,
the same words in the text); when the step is another, one line says which
figure differs and the plan is the one the snapshot got before.

The snapshot is a real one: tests/data/gpu_h200/mini-16x64-sdpa (two steps of
a BertForSequenceClassification of hidden 256, 4 layers, 4 heads,
intermediate 1024, vocab 4000, batch 16 x 64 tokens, on an H200). The named
model is a BertForSequenceClassification of that config, random init (the
trace never touches weights). torch.cuda is the real torch's with a stand-in
for what this machine has no GPU for: is_available (true until the cell
runs), memory._snapshot (the H200 file), memory._record_memory_history, the
device's properties (80 GiB), and torch.__version__ the file's (2.11: the
replay sizes cuBLAS's workspaces by the user's torch, and 2.15's rules differ
from the 2.11 that wrote the file: without it the traced plan is 18 % below the
file's peak and withheld). The traced route needs torch 2.1+: the cells
run in IPython in the Colab row's Python (.venv-colab), as
test_torch_model_trace.py's do, against this worktree's build."""
import os, textwrap

import pytest

from test_torch_model_trace import COLAB, ROOT, _cell, _run

SNAP = os.path.join(ROOT, "tests", "data", "gpu_h200", "mini-16x64-sdpa.pickle.xz")

CELLS = textwrap.dedent(f"""
    import lzma, pickle, types
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    mini = BertForSequenceClassification(BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                                    intermediate_size=1024, vocab_size=4000))
    SNAP = pickle.loads(lzma.decompress(open({SNAP!r}, "rb").read()))
    calls = []
    torch.cuda.memory._record_memory_history = lambda enabled="all", **kw: calls.append(enabled)
    torch.cuda.memory._snapshot = lambda: SNAP
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(total_memory=80 * 2**30)
    _available = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    torch.__version__ = "2.11.0+cu130"  # the torch the file ran (its README): its cuBLAS workspaces' rules
""")

# the watched cell: torch's own is_available back before the OOM, so the
# tracer's torch sees no GPU, as it is on this machine
OOM = ("torch.cuda.is_available = _available\n"
       "raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 MiB')")

WATCH = textwrap.dedent("""
    from IPython.utils.capture import capture_output

    def watch(key, line):
        ip.user_ns["torch"].cuda.is_available = lambda: True
        try:
            with capture_output() as cap:
                r = ip.run_cell_magic("txwatch", line, OOM)
            b = r._repr_mimebundle_()[0] if r is not None else (cap.outputs[-1].data if cap.outputs else {})
            out[key] = {"json": b.get("application/json"), "text": b.get("text/plain", ""), "stdout": cap.stdout}
        except Exception as e:
            out[key] = {"error": type(e).__name__, "message": str(e)}

    watch("before", "--json")                  # no model named yet: the BERT the blocks show
    plan("mini16", "--torch-model mini --batch 16 --seq 64 --gpu t4 --trace --json")
    watch("same", "--json")
    watch("same_text", "")
    plan("mini8", "--torch-model mini --batch 8 --seq 64 --gpu t4 --trace --json")
    watch("other", "--json")
    watch("other_text", "")
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def res():
    return _run(COLAB, _cell(CELLS) + f"OOM = {OOM!r}\n" + WATCH)


def test_its_own_step_is_planned_by_tracing_the_named_model(res):
    j, t = res["same"].get("json"), res["same_text"].get("text", "")
    assert j, res["same"]
    assert "CUDA out of memory in this cell" in res["same"]["stdout"], res["same"]
    by = j.get("planned_by", "")
    # the advice's words (tk_traced_summary): the run's step was %txplan's trace, kept: nothing traced anew
    assert by.startswith("Planned by tracing mini (BertForSequenceClassification): its own training step"), j
    assert "(0 traced in" in by and "1 replays on the cards" in by, by
    m = j["model"]
    # the card the file's 32 MiB cuBLAS workspaces show, not the t4 of %txplan
    assert "the h100-80 profile's" in m["plan"]["agreement"], m["plan"]
    # held to the device's 80 GiB less the card's CUDA context, as the BERT's plan of a given capacity is
    assert m["plan"]["capacity"] < 80 * 2**30 and m["plan"]["capacity_from"] == "the capacity given", m["plan"]
    assert (m["batch"], m["seq"]) == (16, 64) and m["planned"], m
    assert m["plan"]["engine_label"] == "engine: pytorch, traced mini (BertForSequenceClassification)", m["plan"]
    assert "traced_note" not in j, j
    assert "Planned by tracing mini (BertForSequenceClassification)" in t, t
    # the traced plan is held to the file as the BERT's is: within 15 % of the trace's peak allocated
    p = m["plan"]
    print(f"traced plan of the H200 mini step: peak allocated {p['peak_allocated']} against the trace's "
          f"{p['against']} ({p['peak_allocated'] / p['against']:.4f}); the BERT plan's: "
          f"{res['before']['json']['model']['plan']['peak_allocated']}")
    assert 0.85 <= p["peak_allocated"] / p["against"] <= 1.15, p


def test_another_step_says_which_figure_differs_and_keeps_the_plan(res):
    j, t, before = res["other"].get("json"), res["other_text"].get("text", ""), res["before"].get("json")
    assert j and before, (res["other"], res["before"])
    assert "planned_by" not in j and "planned_by" not in before, j
    note = j.get("traced_note", "")
    assert note.startswith("Not planned by tracing mini (BertForSequenceClassification): the snapshot's step is not "
                           "the traced one: batch 16 here, 8 traced (the snapshot's from"), note
    assert "length" not in note.split("(the snapshot's from")[0], note  # the length agrees: not named
    assert note in t and note.count("\n") == 0, t
    assert j["model"]["plan"] == before["model"]["plan"], (j["model"]["plan"], before["model"]["plan"])
    assert "traced" not in j["model"]["plan"]["engine_label"], j["model"]["plan"]
