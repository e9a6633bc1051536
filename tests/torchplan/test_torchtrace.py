"""The traced plan of any model against PyTorch itself (issue 41): the
accuracy table.

Each row is a model at batch 4 x 128 with a 4-layer config of its own
(random init; vocabulary 8000, so the activations weigh beside AdamW's step
over the embeddings). tests/torchplan/trace_reference.py runs two real
training steps of it on the CPU under PyTorch's profiler (its allocator
events, each rounded to 512 B: torch_reference.py's way, extended to any
module and to a loss outside it) and, in the same process, traces the same
step on fake tensors (python/txkernel/trace.py) and plans it with the engine
as the CPU runs it (build/libtxk.so, tk_embed_plan_trace). The plan's
steady and first-step peaks must be within 3 % of PyTorch's and never under
it by more than 1 %, and the parameter counts equal. (On the cpu the plan's
peak is the live sum of the storages rounded to 512 B, the reference's own
measure; on a card the caching allocator's block accounting adds the
unsplit remainders, as PyTorch's CUDA allocator does.)

The rows: the seeds' SentimentClassifier (a BertModel wrapper, the loss
outside), an LSTM head and a mean-pooling head over HF encoders,
BertFor{SequenceClassification, QuestionAnswering, TokenClassification},
RoBERTa, DistilBERT, ELECTRA, XLM-R, DeBERTa-v2 and ModernBERT, and BERT and
RoBERTa in bf16, with checkpointing and with a frozen embedding.

The torch 2 row only: the torch 1.13 row's torch cannot be traced (the
tracer needs 2.1's storages that report their release); there the tracer's
refusal is what is tested (test_old_torch_is_refused)."""
import json, os, subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
T2 = os.path.join(ROOT, ".venv-t2", "bin", "python")
T1 = os.path.join(ROOT, ".venv", "bin", "python")
REF = os.path.join(ROOT, "tests", "torchplan", "trace_reference.py")

ROWS = ["seed", "lstm", "meanpool", "bert", "bertqa", "berttok", "roberta", "distilbert", "electra", "xlmr",
        "debertav2", "modernbert", "bert_bf16", "roberta_bf16", "bert_ckpt", "roberta_ckpt", "bert_frozen",
        "roberta_frozen"]


@pytest.fixture(scope="module")
def table():
    assert os.path.exists(T2), f"{T2} is missing (scripts/deps.sh makes the torch 2 row)"
    assert os.path.exists(os.path.join(BUILD, "libtxk.so")), "build/libtxk.so is missing: make build/libtxk.so"
    env = dict(os.environ, TXK_ENGINE_LIB=os.path.join(BUILD, "libtxk.so"))
    p = subprocess.run([T2, REF] + ROWS, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["row"]] = r
    return rows


@pytest.mark.parametrize("row", ROWS)
def test_traced_plan_within_3_percent(table, row):
    r = table.get(row)
    assert r is not None, f"{row}: no result"
    assert "missing" not in r, f"{row}: transformers {r.get('transformers')} has no such model: {r['missing']}"
    ref, tr = r["reference"], r["traced"]
    assert tr["n_params"] == ref["n_params"], (row, tr, ref)
    for k in ("peak_allocated", "first_step_peak_allocated"):
        ratio = tr[k] / ref[k]
        print(f"{row} {k}: traced {tr[k]} / PyTorch {ref[k]} = {ratio:.4f} (trace {tr['trace_s']} s)")
        assert 0.99 <= ratio <= 1.03, (row, k, tr[k], ref[k], ratio)


def test_old_torch_is_refused():
    """torch 1.13 (the old row): a clear refusal naming the version, not a wrong plan."""
    assert os.path.exists(T1), f"{T1} is missing"
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import torch\nfrom txkernel import trace\n"
            "m = torch.nn.Linear(4, 2)\n"
            "try:\n    trace.trace_step(m, batch=2, seq=4)\nexcept trace.TraceError as e:\n    print('REFUSED', e)\n"
            % os.path.join(ROOT, "python"))
    p = subprocess.run([T1, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    if p.stdout.startswith("REFUSED"):
        assert "needs torch 2.1 or newer" in p.stdout, p.stdout
    else:
        pytest.fail(f"the old row's torch was traced: {p.stdout}")
