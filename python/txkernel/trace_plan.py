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

USAGE = ("%txplan --torch-model NAME[.ATTR...] | --trainer NAME [--batch B] [--seq T] "
         "[--gpu PROFILE | --gpus colab|kaggle | "
         "--device cpu] [--precision fp32|fp16|bf16] [--optimizer adamw|adamw_torch_fused|adam|sgd] "
         "[--loss ce|mse|bce] [--checkpointing on|off] [--trace] [--json]")


def parse(words):
    """The traced route's flags, read with the engine's one option table
    (app/options.c, as torch_model.parse reads it) -> dict."""
    out = parse_flags(words, USAGE, {"json": False, "trace": False})
    if ("model" in out) == ("trainer" in out):
        raise PlanArgsError(f"give one of --torch-model NAME or --trainer NAME (usage: {USAGE})")
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


def trainer_settings(opts, user_ns):
    """--trainer NAME: the Trainer's model, and its TrainingArguments as the
    flags' defaults in opts (per-device batch, fp16/bf16, gradient
    checkpointing, optim; accumulation, output_dir and `api: trainer` for
    the session's config): the step the Trainer runs, traced. A flag given
    wins over the argument."""
    from .torch_model import OPTIMS
    name = opts["trainer"]
    if name not in user_ns:
        raise PlanArgsError(f"{name}: no such variable in this notebook")
    obj = user_ns[name]
    args, model = getattr(obj, "args", None), getattr(obj, "model", None)
    if args is None or model is None:
        raise PlanArgsError(f"{name} is a {type(obj).__name__}, not a transformers Trainer")
    opts["model"] = f"{name}.model"
    opts.setdefault("batch", str(args.per_device_train_batch_size))
    if args.fp16 or args.bf16:
        opts.setdefault("precision", "fp16" if args.fp16 else "bf16")
    if getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False):
        opts.setdefault("checkpointing", "on")
    optim = str(getattr(args.optim, "value", args.optim))
    mapped = OPTIMS.get(optim)
    if mapped not in ("adamw", "adamw_torch_fused"):
        raise PlanArgsError(f"optim {optim!r}: the traced route runs torch's AdamW (adamw_torch, adamw_torch_fused)")
    opts.setdefault("optimizer", mapped)
    opts["trainer_args"] = {"accumulate": int(args.gradient_accumulation_steps or 1),
                            "output_dir": str(args.output_dir) if args.output_dir else ""}
    return model


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
    it has, an attribute path, or a model (a Trainer's model) the YAML route
    does not describe."""
    flag = "--torch-model" if "--torch-model" in words else "--trainer" if "--trainer" in words else None
    if flag is None or ("--torch-model" in words and "--trainer" in words):
        return False  # the YAML route's parse names the mistake
    if any(w in words for w in ("--trace", "--loss", "--device", "--checkpointing")):
        return True
    i = words.index(flag)
    name = words[i + 1] if i + 1 < len(words) else ""
    if "." in name and flag == "--torch-model":
        return True
    obj = user_ns.get(name)
    if obj is None:
        return False  # the YAML route names the missing variable
    if flag == "--trainer":
        obj = getattr(obj, "model", None)
        args = getattr(user_ns.get(name), "args", None)
        if obj is None or getattr(args, "per_device_train_batch_size", None) is None:
            return False  # not a Trainer: the YAML route says so
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


def plan(words, user_ns, engine=None):
    """%txplan's traced route: the bundle to show (text/plain, text/html,
    application/json), or PlanArgsError naming the flag, the variable, or the
    module and op that could not be traced. With the engine (the companion's
    session), the model becomes the session's: advice on it is planned by
    tracing it (register)."""
    import torch
    opts = parse(words)
    if "trainer" in opts:
        model = trainer_settings(opts, user_ns)
    else:
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
        raise PlanArgsError(f"%txplan {'--trainer' if 'trainer' in opts else '--torch-model'} {opts['model']}: {e}") \
            from None
    bundle = plan_trace(tr, gpu=opts.get("gpu"), gpus=opts.get("gpus"), torch_version=torch_rules(torch.__version__))
    if engine is not None:
        register(engine, model, opts, tr, torch)
    if opts["json"]:
        j = bundle.get("application/json")
        return {"application/json": j, "text/plain": json.dumps(j, indent=1)}
    return bundle


# ---- the traced model as the session's: advice on it traces each candidate (issue 41, point 6)

# seconds of tracing one %txadvise may spend on candidates (bench/RESULTS.md "traced advice"); the tests raise it
# with TXK_TRACE_BUDGET_S so that which candidates are planned does not depend on the machine's load
TRACE_BUDGET_S = 20.0

_DIMS = (("hidden", "hidden_size"), ("layers", "num_hidden_layers"), ("heads", "num_attention_heads"),
         ("intermediate", "intermediate_size"), ("vocab_size", "vocab_size"),
         ("max_position", "max_position_embeddings"),
         ("type_vocab", "type_vocab_size"), ("num_labels", "num_labels"))


def _leading_frozen(model, layers):
    """How many of the first encoder layers have no parameter that requires grad."""
    if not layers:
        return 0
    k = 0
    for layer in model.get_submodule(layers):
        ps = list(layer.parameters())
        if not ps or any(p.requires_grad for p in ps):
            break
        k += 1
    return k


def model_calls(model):
    """What the fixes are called in this model (`model` standing for the
    user's variable): its checkpointing switch, embeddings and layers."""
    out = []
    tg = _trace.ckpt_targets(model)
    if tg:
        out.append("checkpointing: " + "; ".join(f"model{'.' + n if n else ''}.gradient_checkpointing_enable()"
                                                   for n, _ in tg))
    else:
        out.append(f"checkpointing: no module of {type(model).__name__} has gradient_checkpointing_enable, so it is "
                   "not offered (torch.utils.checkpoint inside your forward is traced as it runs)")
    emb = _trace.embeddings_of(model)
    if emb:
        out.append(f"frozen embeddings: model.{emb}.requires_grad_(False)")
    lay = _trace.layers_of(model)
    if lay:
        out.append(f"frozen layers: for layer in model.{lay}[:N]: layer.requires_grad_(False)")
    return f"In {type(model).__name__} (model: your variable), " + "; ".join(out) + "."


def config_of(model, opts, tr, torch):
    """The engine: pytorch config that stands for the traced model in the
    session: the settings it was traced with (batch, length, precision,
    optimizer, checkpointing, frozen embeddings and leading layers, the card)
    and the dimensions of its transformers config, which the advisor's costs
    (FLOPs per sample) are counted from."""
    cfg = _trace._modelish(model)
    lines = ["engine: pytorch", f"# {type(model).__name__}, traced: each plan of it is its own step", "init: random"]
    for key, attr in _DIMS:
        v = getattr(cfg, attr, None) if cfg is not None else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            lines.append(f"{key}: {v}")
    emb, lay = _trace.embeddings_of(model), _trace.layers_of(model)
    emb_frozen = bool(emb) and not any(p.requires_grad for p in model.get_submodule(emb).parameters())
    ckpt = {"on": True, "off": False}.get(opts.get("checkpointing"))
    if ckpt is None:
        ckpt = any(_trace.ckpt_on(m) for _, m in _trace.ckpt_targets(model))
    ta = opts.get("trainer_args")  # a Trainer's: advice on it is TrainingArguments lines, with its output_dir
    lines += [f"batch_size: {tr['batch']}", f"max_len: {tr['seq']}", f"accumulate: {ta['accumulate'] if ta else 1}",
              f"precision: {tr['precision']}", f"optimizer: {tr['optimizer']}",
              f"recompute: {'layers' if ckpt else 'none'}", f"freeze_embeddings: {1 if emb_frozen else 0}",
              f"freeze_layers: {_leading_frozen(model, lay)}", f"torch_version: {torch_rules(torch.__version__)}",
              f"api: {'trainer' if ta else 'loop'}"]
    if ta and ta["output_dir"]:
        lines.append(f"output_dir: {json.dumps(ta['output_dir'])}")
    if opts.get("gpu"):
        lines.append(f"gpu: {opts['gpu']}")
    elif opts.get("device"):
        lines.append("device: cpu")  # --gpus PLATFORM: no card; advice is for the platform's smallest (said)
    return "\n".join(lines) + "\n"


def register(engine, model, opts, tr, torch):
    """The traced model as the engine session's config, with a tracer the
    advice calls for each candidate's step, when its optimizer is one the
    config can name (AdamW, fused or not). After --gpus PLATFORM the advice
    is for the platform's smallest card, as after the YAML route's."""
    import weakref
    if tr["optimizer"] not in ("adamw", "adamw_torch_fused"):
        return False
    ref, name, loss = weakref.ref(model), opts["model"], opts.get("loss")

    def tracer(req, out_path):
        m = ref()
        if m is None:
            raise _trace.TraceError(f"{name} is no longer in this notebook: plan it again with %txplan --torch-model")
        frozen = []
        if req["freeze_embeddings"]:
            emb = _trace.embeddings_of(m)
            if not emb:
                raise _trace.TraceError(f"{type(m).__name__} has no module named embeddings to freeze")
            frozen.append(emb)
        if req["freeze_layers"]:
            lay = _trace.layers_of(m)
            if not lay:
                raise _trace.TraceError(f"{type(m).__name__} has no list of num_hidden_layers layers to freeze")
            frozen += [f"{lay}.{i}" for i in range(int(req["freeze_layers"]))]
        targets = _trace.ckpt_targets(m)
        if req["checkpointing"] and not targets:
            raise _trace.TraceError(f"{type(m).__name__} has no module with gradient_checkpointing_enable")
        t = _trace.trace_step(m, batch=int(req["batch"]), seq=int(req["seq"]), loss=loss, optimizer=req["optimizer"],
                              precision=req["precision"], target=req["target"],
                              checkpointing=bool(req["checkpointing"]) if targets else None, frozen=tuple(frozen))
        with open(out_path, "w") as f:
            json.dump(t, f, separators=(",", ":"))

    fd, path = tempfile.mkstemp(prefix="txk-trace-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(tr, f, separators=(",", ":"))
        engine.set_traced(config_of(model, opts, tr, torch), f"{name} ({type(model).__name__})", model_calls(model),
                          path, tracer, float(os.environ.get("TXK_TRACE_BUDGET_S", TRACE_BUDGET_S)), opts.get("gpus"))
    finally:
        os.unlink(path)
    return True
