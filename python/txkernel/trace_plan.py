"""%txplan --torch-model NAME for any model: the traced route (issue 41).

torch_model.py turns a BertFor{SequenceClassification, QuestionAnswering}
into an engine: pytorch YAML config (the hand-written BERT graph). Every
other module (the user's own wrapper, clf.bert, RoBERTa, DistilBERT,
DeBERTa, ModernBERT, a custom head) is traced instead (trace.py) and the
trace planned by the engine (torchplan/torchtrace.c through libtxk.so's
tk_embed_plan_trace). --trace takes this route for a BERT head too, and so
do the flags only it has (--loss, --device cpu, --checkpointing).

NAME may be an attribute path from a notebook variable: clf.bert."""
import ctypes
import json
import os
import tempfile

from . import trace as _trace
from .torch_model import PlanArgsError, torch_rules, HEADS, parse_flags

USAGE = ("%txplan --torch-model NAME[.ATTR...] [--batch B] [--seq T] [--gpu PROFILE | --gpus colab|kaggle | "
         "--device cpu] [--precision fp32|fp16|bf16] [--optimizer adamw|adamw_torch_fused|adam|sgd] "
         "[--loss ce|mse|bce] [--checkpointing on|off] [--trace] [--json]")


def parse(words):
    """The traced route's flags, read with the engine's one option table
    (app/options.c, as torch_model.parse reads it) -> dict."""
    out = parse_flags(words, USAGE, {"json": False, "trace": False})
    if "model" not in out:
        raise PlanArgsError(f"give --torch-model NAME (usage: {USAGE})")
    if "show" in out:
        raise PlanArgsError("--show-config: a traced model has no engine: pytorch YAML (that is the BertFor... route)")
    if sum(k in out for k in ("gpu", "gpus", "device")) > 1:
        raise PlanArgsError("give one of --gpu PROFILE, --gpus PLATFORM or --device cpu")
    if out.get("device") not in (None, "cpu"):
        raise PlanArgsError(f"--device {out['device']}: the traced plan takes --device cpu, or a card with --gpu")
    for k in ("batch", "seq"):
        if k in out and (not out[k].isdigit() or int(out[k]) < 1):
            raise PlanArgsError(f"--{k} {out[k]}: expected a positive integer")
    if out.get("checkpointing") not in (None, "on", "off"):
        raise PlanArgsError(f"--checkpointing {out['checkpointing']}: expected on or off")
    return out


def resolve(name, user_ns):
    """The object NAME names: a notebook variable, or an attribute path from one (clf.bert)."""
    head, *rest = name.split(".")
    if head not in user_ns:
        raise PlanArgsError(f"{head}: no such variable in this notebook")
    obj = user_ns[head]
    for i, part in enumerate(rest):
        if not hasattr(obj, part):
            raise PlanArgsError(f"{'.'.join([head] + rest[:i])} is a {type(obj).__name__} with no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def wants_trace(words, user_ns):
    """Whether `%txplan` with these words takes the traced route: a flag only
    it has, an attribute path, or a model the YAML route does not describe."""
    if "--torch-model" not in words or "--trainer" in words:
        return False
    if any(w in words for w in ("--trace", "--loss", "--device", "--checkpointing")):
        return True
    i = words.index("--torch-model")
    name = words[i + 1] if i + 1 < len(words) else ""
    if "." in name:
        return True
    obj = user_ns.get(name)
    if obj is None:
        return False  # the YAML route names the missing variable
    cfg = getattr(obj, "config", None)
    return not (type(obj).__name__ in HEADS and getattr(cfg, "model_type", "") == "bert")


def _lib():
    from ._engine import lib
    lb = lib()
    fn = lb.tk_embed_plan_trace
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    return lb


def plan_trace(trace, gpu=None, gpus=None, torch_version="2"):
    """The engine's bundle (dict) for a trace (trace.trace_step's dict)."""
    lb = _lib()
    fd, path = tempfile.mkstemp(prefix="txk-trace-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(trace, f, separators=(",", ":"))
        err = ctypes.create_string_buffer(512)
        enc = lambda s: s.encode() if s else None  # noqa: E731
        p = lb.tk_embed_plan_trace(path.encode(), enc(gpu), enc(gpus), enc(torch_version), err, len(err))
        if not p:
            raise PlanArgsError(err.value.decode("utf-8", "replace"))
        try:
            return json.loads(ctypes.string_at(p).decode("utf-8"))
        finally:
            lb.tk_embed_free(p)
    finally:
        os.unlink(path)


def plan(words, user_ns):
    """%txplan's traced route: the bundle to show (text/plain, text/html,
    application/json), or PlanArgsError naming the flag, the variable, or the
    module and op that could not be traced."""
    import torch
    opts = parse(words)
    model = resolve(opts["model"], user_ns)
    if not isinstance(model, torch.nn.Module):
        raise PlanArgsError(f"{opts['model']} is a {type(model).__name__}, not a torch.nn.Module")
    if not (opts.get("gpu") or opts.get("gpus") or opts.get("device")):
        raise PlanArgsError("name the card to plan for with --gpu PROFILE (t4, l4, a100-40, ...) or --gpus "
                            "colab|kaggle, or plan the step as this CPU runs it with --device cpu")
    cfg = _trace._modelish(model)
    seq = int(opts.get("seq", min(512, int(getattr(cfg, "max_position_embeddings", 512) or 512))))
    ckpt = {"on": True, "off": False}.get(opts.get("checkpointing"))
    try:
        tr = _trace.trace_step(model, batch=int(opts.get("batch", 8)), seq=seq, loss=opts.get("loss"),
                               optimizer=opts.get("optimizer", "adamw"), precision=opts.get("precision", "fp32"),
                               target="cpu" if opts.get("device") else "cuda", checkpointing=ckpt)
    except _trace.TraceError as e:
        raise PlanArgsError(f"%txplan --torch-model {opts['model']}: {e}") from None
    bundle = plan_trace(tr, gpu=opts.get("gpu"), gpus=opts.get("gpus"), torch_version=torch_rules(torch.__version__))
    if opts["json"]:
        j = bundle.get("application/json")
        return {"application/json": j, "text/plain": json.dumps(j, indent=1)}
    return bundle
