#!/usr/bin/env python3
"""PyTorch's own figure for any model's training step, beside the traced
plan of the same step (issue 41).

torch_reference.py's way, extended to any nn.Module and to a loss outside
the model: two real training steps on the CPU under
torch.profiler.profile(profile_memory=True), the allocator's memory events
read back, each allocation rounded up to 512 B as the CUDA caching
allocator rounds, replayed between step marks: first_step_peak_allocated
(step 1, AdamW's state made) and peak_allocated (step 2, with what is live
when it starts). The model is built inside the profiled region, so its
weights count, as they do in torch_reference.py.

The step is the one python/txkernel/trace.py traces: trace.make_batch's
batch (ids, an all-ones mask, zero token types, HF labels), the model's own
loss when it takes labels and no loss is named, else the tracer's
(_user_loss), torch.optim.AdamW(lr=2e-5, weight_decay=0.01) as torch picks
it for CPU tensors, its zero_grad() as the version's default (torch 2 frees
the gradients, 1.13 zero-fills and keeps them), bf16 under
torch.autocast("cpu").

Each row: a model name from MODELS and its options. Prints one JSON object
per row: the reference's two peaks and the traced plan's (the engine's
--device cpu plan of trace_step's events, through build/libtxk.so).

    .venv-t2/bin/python tests/torchplan/trace_reference.py seed bert_bf16 ...

--shim reads the allocator's events from tests/torchplan/alloc_events.c
instead (c10's CPU allocator's posix_memalign/free), for the torch 1.13 row
whose profiler has no kineto:

    LD_PRELOAD=build/tests/torchplan/liballoc_events.so .venv/bin/python \
        tests/torchplan/trace_reference.py --shim bert roberta ...
"""
import json, os, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from torch_reference import MARK, mark_step, rounded, shim_events  # noqa: E402
import seed_model  # noqa: E402  (the seeds' SentimentClassifier)

B, T, LAYERS, VOCAB = 4, 128, 4, 8000


def _cfg(cls, **kw):
    return cls(num_hidden_layers=LAYERS, vocab_size=VOCAB, **kw)


def _encoder_heads(torch, tr):
    nn = torch.nn

    # the seeds' tutorial wrapper: a BertModel, dropout, a Linear; the loss outside (tests/seed_model.py)
    SentimentClassifier = seed_model.define(nn, tr.BertModel, _cfg(tr.BertConfig))

    class LSTMHead(nn.Module):
        """An LSTM over an HF encoder's sequence output, its last state classified."""
        def __init__(self):
            super().__init__()
            self.encoder = tr.BertModel(_cfg(tr.BertConfig), add_pooling_layer=False)
            self.lstm = nn.LSTM(self.encoder.config.hidden_size, 128, batch_first=True)
            self.out = nn.Linear(128, 3)

        def forward(self, input_ids, attention_mask=None):
            h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            _, (hn, _) = self.lstm(h)
            return self.out(hn[-1])

    class MeanPool(nn.Module):
        """Mean pooling over a RoBERTa encoder's tokens, then a Linear."""
        def __init__(self):
            super().__init__()
            self.encoder = tr.RobertaModel(_cfg(tr.RobertaConfig), add_pooling_layer=False)
            self.out = nn.Linear(self.encoder.config.hidden_size, 2)

        def forward(self, input_ids, attention_mask):
            h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            return self.out((h * m).sum(1) / m.sum(1))

    return SentimentClassifier, LSTMHead, MeanPool


def _no_init_weights(tr):
    """transformers' own switch that skips weight initialisation at
    construction: transformers.initialization's (5.x), modeling_utils' (4.x)."""
    import importlib
    try:
        return importlib.import_module("transformers.initialization").no_init_weights
    except (ImportError, AttributeError):
        return tr.modeling_utils.no_init_weights


def build(name, torch):
    """(model, trace options) for a row name."""
    import transformers as tr
    Sentiment, LSTMHead, MeanPool = _encoder_heads(torch, tr)
    opts = {}
    base, _, variant = name.partition("_")
    simple = {
        "bert": lambda: tr.BertForSequenceClassification(_cfg(tr.BertConfig)),
        "bertqa": lambda: tr.BertForQuestionAnswering(_cfg(tr.BertConfig)),
        "berttok": lambda: tr.BertForTokenClassification(_cfg(tr.BertConfig, num_labels=5)),
        "roberta": lambda: tr.RobertaForSequenceClassification(_cfg(tr.RobertaConfig)),
        "electra": lambda: tr.ElectraForSequenceClassification(_cfg(tr.ElectraConfig)),
        "xlmr": lambda: tr.XLMRobertaForSequenceClassification(_cfg(tr.XLMRobertaConfig)),
        "debertav2": lambda: tr.DebertaV2ForSequenceClassification(_cfg(tr.DebertaV2Config)),
        "distilbert": lambda: tr.DistilBertForSequenceClassification(
            tr.DistilBertConfig(n_layers=LAYERS, vocab_size=VOCAB)),
        "modernbert": lambda: tr.ModernBertForSequenceClassification(
            _cfg(tr.ModernBertConfig, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                 sep_token_id=2)),
        "seed": lambda: Sentiment(3),
        "lstm": lambda: LSTMHead(),
        "meanpool": lambda: MeanPool(),
    }
    if base not in simple:
        raise SystemExit(f"{name}: no such row (the models: {', '.join(sorted(simple))}, each with _bf16, _ckpt, "
                         "_frozen)")
    # transformers' and torch's initialisers skipped (1.5-2.5 s a model on this CPU, twice a row), then every
    # weight drawn uniform in one op: a random init, whose values no figure here depends on
    with _no_init_weights(tr)():
        model = simple[base]()
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.05, 0.05)
    if variant == "bf16":
        opts["precision"] = "bf16"
    elif variant == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif variant == "frozen":
        emb = model.get_input_embeddings()
        for p in model.base_model.embeddings.parameters() if hasattr(model, "base_model") else emb.parameters():
            p.requires_grad_(False)
    elif variant:
        raise SystemExit(f"{name}: variant {variant!r}: expected bf16, ckpt or frozen")
    model.train()
    return model, opts


def reference(name, torch, shim=False):
    """The real step's peaks, from the profiler's memory events (shim: from
    alloc_events.c's, LD_PRELOAD'ed: torch 1.13's profiler has no kineto)."""
    from txkernel import trace as tr
    holder = {}

    def mark(i):
        m = torch.empty(MARK + 2 * i, dtype=torch.uint8)
        del m

    def steps():
        torch.manual_seed(0)
        model, opts = build(name, torch)
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=2e-5, weight_decay=0.01, foreach=False)
        dtype = torch.bfloat16 if opts.get("precision") == "bf16" else None
        batches = [tr.make_batch(model, B, T, torch, seed=i) for i in range(2)]
        for step in range(2):
            mark(step)
            opt.zero_grad()  # the version's default, as trace.py runs it (1.13: zero-filled and kept)
            b = batches[step]
            batches[step] = None
            labels = {k: b[k] for k in ("labels", "start_positions", "end_positions") if k in b}
            args = dict(b) if labels else b
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out = model(**args)
                loss = out.loss if labels else tr._user_loss(tr._logits(out, torch), None, b, torch)
            del out, args
            loss.backward()
            del loss, b, labels
            opt.step()
        mark(2)
        holder["n"] = sum(p.numel() for p in model.parameters())

    if shim:
        events = shim_events(steps)
    else:
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                        profile_memory=True) as prof:
                steps()
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)
        finally:
            os.unlink(path)
        events = events["traceEvents"] if isinstance(events, dict) else events
    live, cur, step, peaks = {}, 0, -1, [0, 0]
    for e in events:
        if e.get("name") != "[memory]" or e.get("args", {}).get("Device Type", 0) != 0:
            continue
        addr, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
        m = mark_step(abs(nbytes), 2)
        if m is not None:
            if nbytes > 0:
                step = m
                if step < 2:
                    peaks[step] = cur
            continue
        if nbytes > 0:
            live[addr] = rounded(nbytes)
            cur += live[addr]
            if 0 <= step < 2:
                peaks[step] = max(peaks[step], cur)
        elif addr in live:
            cur -= live.pop(addr)
    if step != 2:
        raise SystemExit(f"{name}: the step marks were not all found in the profiler's trace")
    return {"first_step_peak_allocated": peaks[0], "peak_allocated": peaks[1], "n_params": holder["n"]}


def traced(name, torch):
    """The traced plan's peaks (the engine's --device cpu plan) and the trace's time."""
    from txkernel import trace as tr, trace_plan
    torch.manual_seed(0)
    model, opts = build(name, torch)
    t0 = time.perf_counter()
    events = tr.trace_step(model, batch=B, seq=T, target="cpu", **opts)
    t1 = time.perf_counter()
    j = trace_plan.plan_trace(events)["application/json"]
    return {"first_step_peak_allocated": j["first_step_peak_allocated"], "peak_allocated": j["peak_allocated"],
            "n_params": j["n_params"], "trace_s": round(t1 - t0, 2)}


def main(names):
    shim = "--shim" in names
    names = [n for n in names if n != "--shim"]
    import torch
    torch.set_num_threads(int(os.environ.get("TXK_TORCH_THREADS", "2")))
    os.environ.setdefault("TXK_ENGINE_LIB", os.path.join(os.environ.get("BUILD", os.path.join(ROOT, "build")),
                                                         "libtxk.so"))
    import transformers
    for n in names:
        try:
            row = {"row": n, "reference": reference(n, torch, shim=shim), "traced": traced(n, torch)}
        except AttributeError as e:  # this transformers has no such model
            row = {"row": n, "missing": str(e)}
        row.update(torch=torch.__version__, transformers=transformers.__version__)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
