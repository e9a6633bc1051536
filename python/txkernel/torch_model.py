"""%txplan --torch-model NAME / --trainer NAME: the user's live transformers
model (or Trainer) as an `engine: pytorch` config.

Reads the model's config (shape, dropouts, attention implementation, labels),
its head class, dtype, gradient-checkpointing flag (the current attribute:
is_activation_checkpointing where transformers has it, so no FutureWarning)
and which parameters require grad, and for a Trainer its TrainingArguments
(per-device batch, accumulation, fp16/bf16, gradient checkpointing, optim,
output_dir) and `api: trainer`, so advice on it is TrainingArguments lines.
The model is described by its shape alone (every dimension from its config,
`init: random`): no preset name stands for it. Nothing is allocated and no
GPU is needed: the engine plans the step (torchplan/). The card is the
engine's --gpu flag (so a bad name is the flag's error) or --gpus PLATFORM
(every card the platform hands out). The YAML is printed by
`--show-config`, and `txk plan` of it gives the same plan byte for byte."""

import json

HEADS = {"BertForSequenceClassification": "task: classify\nhead: pooled",
         "BertForQuestionAnswering": "task: qa\nhead: span"}
# TrainingArguments.optim -> the config's optimizer (adamw_torch_fused is
# transformers 5's default with torch >= 2.8: torch.optim.AdamW(fused=True))
OPTIMS = {"adamw": "adamw", "adamw8bit": "adamw8bit", "adamw_torch": "adamw",
          "adamw_torch_fused": "adamw_torch_fused", "adamw_hf": "adamw", "adamw_bnb_8bit": "adamw8bit",
          "adamw_8bit": "adamw8bit"}


class PlanArgsError(ValueError):
    """A flag or a model this path cannot plan; the message says which."""


USAGE = ("%txplan --torch-model NAME | --trainer NAME [--batch B] [--seq T] [--gpu PROFILE | --gpus colab|kaggle] "
         "[--precision fp32|fp16|bf16] [--optimizer adamw|adamw8bit|adamw_torch_fused] [--json] [--show-config]")


# the key parse() keeps a flag under, where it is not the flag's name without "--"
_KEYS = {"--torch-model": "model", "--show-config": "show"}


def _flags():
    """{flag: takes a value} for %txplan in the companion, from the engine's
    one option table (app/options.c): the same flags, values and help as
    `txk` and the cells."""
    from ._engine import options
    return {o["name"]: o["metavar"] is not None and "companion" not in o["bare_in"] for o in options()
            if any("plan" in u["verbs"] and "companion" in u["doors"] for u in o["uses"])}


def parse_flags(words, usage, out):
    """The companion's %txplan words into out, read with the engine's one
    option table (each flag's key: _KEYS, else its name without "--")."""
    flags = _flags()
    i = 0
    while i < len(words):
        w = words[i]
        key = _KEYS.get(w, w[2:])
        if flags.get(w):
            if i + 1 >= len(words):
                raise PlanArgsError(f"{w} needs a value")
            out[key] = words[i + 1]
            i += 2
        elif w in flags:
            out[key] = True
            i += 1
        else:
            raise PlanArgsError(f"%txplan --torch-model: unexpected '{w}' (usage: {usage})")
    return out


def parse(words):
    """--torch-model NAME | --trainer NAME, --batch, --seq, --gpu, --gpus,
    --precision, --optimizer, --json, --show-config -> dict."""
    out = parse_flags(words, USAGE, {"json": False, "show": False})
    if "gpu" in out and "gpus" in out:
        raise PlanArgsError("give --gpu PROFILE (one card) or --gpus PLATFORM (each of its cards), not both")
    if ("model" in out) == ("trainer" in out):
        raise PlanArgsError("give one of --torch-model NAME or --trainer NAME (a variable of this notebook)")
    for k in ("batch", "seq"):
        if k in out and (not out[k].isdigit() or int(out[k]) < 1):
            raise PlanArgsError(f"--{k} {out[k]}: expected a positive integer")
    if out.get("precision") not in (None, "fp32", "fp16", "bf16"):
        raise PlanArgsError(f"--precision {out['precision']}: expected fp32, fp16 or bf16")
    if out.get("optimizer") not in (None, "adamw", "adamw8bit", "adamw_torch_fused"):
        raise PlanArgsError(f"--optimizer {out['optimizer']}: expected adamw, adamw8bit or adamw_torch_fused")
    return out


def _model_yaml(model, torch):
    cls = type(model).__name__
    if cls not in HEADS:
        raise PlanArgsError(f"{cls}: engine: pytorch plans BertForSequenceClassification and "
                            "BertForQuestionAnswering")
    cfg = model.config
    if getattr(cfg, "model_type", "") != "bert":
        raise PlanArgsError(f"model_type {getattr(cfg, 'model_type', '?')!r}: engine: pytorch plans BERT")
    attn = getattr(cfg, "_attn_implementation", None) or "eager"
    if attn not in ("eager", "sdpa"):
        raise PlanArgsError(f"attn_implementation {attn!r}: engine: pytorch plans eager and sdpa")
    params = list(model.named_parameters())
    dtypes = {p.dtype for _, p in params}
    if dtypes != {torch.float32}:
        raise PlanArgsError(f"the model's weights are {sorted(str(d) for d in dtypes)}: engine: pytorch plans fp32 "
                            "weights (with autocast for fp16/bf16: --precision)")
    frozen = [n for n, p in params if not p.requires_grad]
    emb = [n for n, _ in params if n.startswith("bert.embeddings.")]
    if frozen and sorted(frozen) != sorted(emb):
        raise PlanArgsError(f"{len(frozen)} frozen parameters beyond the embeddings (first: {frozen[0]}): engine: "
                            "pytorch models frozen embeddings only")
    # the current attribute where transformers has it: 5.x's is_gradient_checkpointing warns (FutureWarning)
    ckpt_attr = ("is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing")
                 else "is_gradient_checkpointing")
    lines = ["engine: pytorch",
             f"# the shape of {getattr(cfg, '_name_or_path', '') or cls}, every dimension from its config",
             "init: random",
             f"hidden: {cfg.hidden_size}", f"layers: {cfg.num_hidden_layers}", f"heads: {cfg.num_attention_heads}",
             f"intermediate: {cfg.intermediate_size}", f"vocab_size: {cfg.vocab_size}",
             f"max_position: {cfg.max_position_embeddings}", f"type_vocab: {cfg.type_vocab_size}",
             f"num_labels: {getattr(cfg, 'num_labels', 2)}", HEADS[cls],
             f"dropout: {cfg.hidden_dropout_prob}", f"attention_dropout: {cfg.attention_probs_dropout_prob}",
             f"attn_implementation: {attn}",
             f"torch_version: {torch_rules(torch.__version__)}",
             *([torch_rules_note(torch.__version__)] if torch_rules_note(torch.__version__) else []),
             f"recompute: {'layers' if getattr(model, ckpt_attr, False) else 'none'}"]
    if frozen:
        lines.append("freeze: embeddings")
    return lines


def torch_rules(version):
    """Which engine: pytorch rules a torch version follows: its own 2.x minor
    (2.0 .. 2.15: where cuBLAS keeps its workspaces changed across them);
    1.13 for 1.11-1.13; 1.10 for 1.10 and older (softmax kept its input
    until 1.11). A newer torch than the rules were read for gets 2.15's, and
    a YAML comment saying so (torch_rules_note)."""
    major, _, rest = version.partition(".")
    minor = int("".join(ch for ch in rest.split(".")[0] if ch.isdigit()) or 0)
    if major == "1":
        return "1.13" if minor >= 11 else "1.10"
    if major != "2" or minor > LAST_MINOR:
        return f"2.{LAST_MINOR}"
    return f"2.{minor}"


LAST_MINOR = 15  # the newest torch whose cuBLAS workspace rules torchplan/blas_rules.c read


def torch_rules_note(version):
    """A YAML comment line when `version` is newer than the rules read, else ''."""
    major, _, rest = version.partition(".")
    minor = int("".join(ch for ch in rest.split(".")[0] if ch.isdigit()) or 0)
    if major == "2" and minor <= LAST_MINOR or major == "1":
        return ""
    return (f"# torch {version} is newer than the releases engine: pytorch was read against (up to 2.{LAST_MINOR}): "
            f"planned with 2.{LAST_MINOR}'s rules")


def config_yaml(opts, user_ns):
    """The engine: pytorch YAML for the parsed flags and the named variable,
    and the flags the engine's %%txplan gets (the card: --gpu / --gpus)."""
    import torch
    name = opts.get("model") or opts.get("trainer")
    if name not in user_ns:
        raise PlanArgsError(f"{name}: no such variable in this notebook")
    obj = user_ns[name]
    batch, acc, precision, optim, ckpt, extra = 8, 1, "fp32", "adamw", False, []
    if "trainer" in opts:
        args, model = getattr(obj, "args", None), getattr(obj, "model", None)
        if args is None or model is None:
            raise PlanArgsError(f"{name} is a {type(obj).__name__}, not a transformers Trainer")
        batch = args.per_device_train_batch_size
        acc = args.gradient_accumulation_steps
        precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
        # transformers 5 names it activation_checkpointing (gradient_checkpointing its deprecated alias)
        ckpt = bool(getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False))
        # advice on a Trainer is written as TrainingArguments lines, with the user's output_dir
        extra = ["api: trainer"] + ([f"output_dir: {json.dumps(str(args.output_dir))}"] if args.output_dir else [])
        optim_name = str(getattr(args.optim, "value", args.optim))
        if optim_name not in OPTIMS:
            raise PlanArgsError(f"optim {optim_name!r}: engine: pytorch plans {', '.join(sorted(OPTIMS))}")
        optim = OPTIMS[optim_name]
    else:
        model = obj
        if not hasattr(model, "config") or not hasattr(model, "named_parameters"):
            raise PlanArgsError(f"{name} is a {type(obj).__name__}, not a transformers model")
    lines = _model_yaml(model, torch)
    if ckpt:
        lines = [ln for ln in lines if not ln.startswith("recompute:")] + ["recompute: layers"]
    batch = int(opts.get("batch", batch))
    seq = int(opts.get("seq", min(512, model.config.max_position_embeddings)))
    lines += [f"batch_size: {batch}", f"max_len: {seq}", f"accumulate: {acc}",
              f"precision: {opts.get('precision', precision)}", f"optimizer: {opts.get('optimizer', optim)}"] + extra
    flags = []
    if opts.get("gpu"):
        flags = ["--gpu", opts["gpu"]]
    elif opts.get("gpus"):
        flags = ["--gpus", opts["gpus"]]
    elif torch.cuda.is_available():
        # the card torch sees: its capacity as torch reports it (its context
        # is then not known: name a profile with --gpu for that)
        lines += ["device: cuda", f"capacity: {torch.cuda.get_device_properties(0).total_memory}"]
    else:
        raise PlanArgsError("torch sees no GPU here: name the card to plan for with --gpu PROFILE "
                            "(t4, l4, a100-40, a100-80, h100-80, v100-16, ...) or --gpus colab|kaggle")
    return "\n".join(lines) + "\n", flags
