"""One training step of any nn.Module, traced on fake tensors (issue 41).

The user's module is run as it is in their notebook (its own forward, its
gradient-checkpointing flag, its frozen parameters) through
torch.func.functional_call with fake parameters: FakeTensorMode gives every
tensor its shape, dtype and storage but no data, so no weight is read or
copied, no GPU is touched, and the user's process holds no more memory
afterwards. The batch itself (ids, mask, labels: a few KiB) is real, and so
is what is computed from it alone (a mask's processing, a check of the
labels), so that what transformers decides from those values (an all-ones
mask is dropped, DeBERTa's loss selects the labelled rows) is decided as in
the user's run.

Every storage's life is recorded: an allocation when an op first returns it
(its bytes, the module running, the category: param, input, act, temp,
grad, optim), a release when it dies (a weak reference on the storage).
Ops whose memory depends on the card are recorded as op events with their
shapes (dropout, scaled_dot_product_attention, each GEMM and whether
autograd's thread runs it), and the storages made inside them but not
returned (the CPU's float dropout noise, the math attention's scores) are
marked as the op's own, so the engine can size them by the card's kernel
(torchplan/torchtrace.c). A checkpointed layer's recomputation in
backward, which no torch function mode sees, is seen through F's dropout
and attention, replaced for the trace's length; its attention is an op
"of" the checkpointed one, which itself keeps nothing on a card. Two steps
are traced, as torch_reference.py runs them: the first (AdamW's state is
made) and a steady one.

What cannot be traced (a branch on a tensor's values, an op with no fake or
meta kernel, an autograd.Function that reads data) raises TraceError naming
the module and the op."""
import inspect
import time
import weakref

class TraceError(ValueError):
    """The step cannot be traced; the message names the module and the op."""


def _torch():
    import torch
    return torch


def _modelish(model):
    """The transformers config the module carries, or one of its submodules'."""
    cfg = getattr(model, "config", None)
    if cfg is not None:
        return cfg
    for _, m in model.named_modules():
        if getattr(m, "config", None) is not None:
            return m.config
    return None


def _vocab(model, torch):
    cfg = _modelish(model)
    if cfg is not None and getattr(cfg, "vocab_size", None):
        return int(cfg.vocab_size)
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding):
            return int(m.num_embeddings)
    return 2


def _is_hf(model):
    return hasattr(model, "config") and hasattr(model, "base_model_prefix")


def _labels(model, B, T, torch, gen):
    """HF labels for the head the class name says, or None (no labels argument)."""
    try:
        sig = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    name = type(model).__name__
    n = int(getattr(getattr(model, "config", None), "num_labels", 2) or 2)
    if "start_positions" in sig and "QuestionAnswering" in name:
        return {"start_positions": torch.randint(0, T, (B,), generator=gen),
                "end_positions": torch.randint(0, T, (B,), generator=gen)}
    if "labels" not in sig or not _is_hf(model):
        return {}
    if "TokenClassification" in name:
        return {"labels": torch.randint(0, n, (B, T), generator=gen)}
    if "SequenceClassification" in name or "MultipleChoice" in name:
        return {"labels": torch.randint(0, n, (B,), generator=gen)}
    if "MaskedLM" in name or "CausalLM" in name or "PreTraining" in name:
        return {"labels": torch.randint(0, _vocab(model, torch), (B, T), generator=gen)}
    return {}


def make_batch(model, B, T, torch, seed=0):
    """The batch the step gets, as a data loader's collate makes it: ids,
    an all-ones mask, zero token types where the forward takes them, and
    the HF labels the head needs (real tensors: a few KiB)."""
    gen = torch.Generator().manual_seed(seed)
    try:
        sig = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        sig = {}
    b = {"input_ids": torch.randint(0, _vocab(model, torch), (B, T), generator=gen)}
    if "attention_mask" in sig:
        b["attention_mask"] = torch.ones(B, T, dtype=torch.long)
    cfg = _modelish(model)
    if "token_type_ids" in sig and cfg is not None and int(getattr(cfg, "type_vocab_size", 0) or 0) > 0:
        b["token_type_ids"] = torch.zeros(B, T, dtype=torch.long)
    missing = [n for n, p in sig.items() if n not in b and p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in ("self",)]
    if "input_ids" not in sig and not any(p.kind == p.VAR_KEYWORD for p in sig.values()):
        first = next(iter(sig), None)
        if first is None:
            raise TraceError(f"{type(model).__name__}.forward takes no argument to give the batch to")
        b[first] = b.pop("input_ids")
        missing = [n for n in missing if n != first]
    if missing:
        raise TraceError(f"{type(model).__name__}.forward needs {', '.join(missing)}: the tracer gives input_ids, "
                         "attention_mask, token_type_ids and HF labels only")
    b.update(_labels(model, B, T, torch, gen))
    return b


def _logits(out, torch):
    """The tensor a loss is taken of: the output itself, an HF output's
    logits (or its first tensor), a tuple's first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits") and isinstance(out.logits, torch.Tensor):
        return out.logits
    vals = out.values() if hasattr(out, "values") else out if isinstance(out, (tuple, list)) else []
    for v in vals:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
    raise TraceError(f"the model returned a {type(out).__name__}: no tensor to take a loss of")


class _Storages:
    """Storage lives: id -> (bytes, event index), weak references firing the release."""

    def __init__(self, rec):
        self.rec = rec
        self.live = {}

    def see(self, t, cat, owner, op=-1):
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return self.live[key][0]
        sid = self.rec.next_id
        self.rec.next_id += 1
        nbytes = int(st.nbytes())
        ev = ["a", sid, nbytes, cat, self.rec.owner_index(owner), op]
        self.rec.events.append(ev)
        self.live[key] = (sid, ev)
        weakref.finalize(st, self._dead, key)
        return sid

    def _dead(self, key):
        sid, _ = self.live.pop(key, (None, None))
        if sid is not None and self.rec.recording:
            self.rec.events.append(["f", sid])

    def event_of(self, t):
        v = self.live.get(t.untyped_storage()._cdata)
        return v[1] if v else None


class _Recorder:
    def __init__(self, model, torch):
        self.torch = torch
        self.events, self.owners, self._own = [], [], {}
        self.ops = []
        self.next_id = 0
        self.recording = True
        self.stack = [""]           # module names (forward)
        self.phase = "act"          # act (forward), temp (backward), optim
        self.seq_map = []           # (grad_fn sequence number, module, op) in forward order
        self.op_now = -1            # the card-dependent op running in forward
        self.bwd_op = -1            # the op whose backward range is running
        self.op_seen_bwd = set()    # ops whose backward has begun
        self.open_bwd = set()       # ops whose backward is running
        self.last_op = None         # (op name, module) of the last op dispatched, for refusals
        self.st = _Storages(self)
        self.sdpa_out = {}          # an attention output's storage -> its op, until its first copy
        self.param_names = {}

    def owner_index(self, name):
        i = self._own.get(name)
        if i is None:
            i = self._own[name] = len(self.owners)
            self.owners.append(name)
        return i

    # -- which module and op an allocation belongs to ----------------------
    def _seq_lookup(self, seq):
        import bisect
        i = bisect.bisect_left(self.seq_map, (seq, "", -2))
        if i < len(self.seq_map):
            return self.seq_map[i][1], self.seq_map[i][2]
        return None, -1

    def where(self):
        """(module name, card-dependent op index or -1) for an allocation now."""
        if self.phase == "optim":
            return "optimizer", -1
        if self.phase != "temp" or self.op_now >= 0:
            # (in backward, an op running is a checkpointed layer's recomputation of it)
            return self.stack[-1], self.op_now
        node = self.torch._C._current_autograd_node()
        if node is None:
            return self.stack[-1], -1
        name = type(node).__name__
        if name == "AccumulateGrad":
            v = getattr(node, "variable", None)
            pn = self.param_names.get(id(v)) if v is not None else None
            return (pn.rpartition(".")[0] if pn else ""), -1
        try:
            seq = node._sequence_nr()
        except Exception:
            return "", -1
        mod, op = self._seq_lookup(seq)
        if op >= 0 and op not in self.op_seen_bwd:
            self.op_seen_bwd.add(op)
            self.events.append(["op", op, "bwd"])
            self.open_bwd.add(op)
        for o in list(self.open_bwd):
            if o != op:
                self.events.append(["op", o, "bwd_end"])
                self.open_bwd.discard(o)
        return (mod if mod is not None else ""), op

    def close_bwd(self):
        for o in sorted(self.open_bwd):
            self.events.append(["op", o, "bwd_end"])
        self.open_bwd = set()


def _modes(rec, torch):
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils import _pytree as pytree
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    from torch.overrides import TorchFunctionMode
    F = torch.nn.functional
    GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "matmul", "_addmm_activation"}
    card_fns = {F.dropout: "dropout", F.scaled_dot_product_attention: "sdpa"}
    top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)

    def in_checkpoint():
        return top_hooks is not None and top_hooks(False) is not None

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            mod, op = rec.where()
            schema = getattr(func, "_schema", None)
            rec.last_op = (schema.name if schema is not None else str(func), mod)
            leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if rec.phase == "act" and leaves and not any(isinstance(t, FakeTensor) for t in leaves):
                # computed from the batch alone in the forward (a mask's processing, a check of the labels):
                # real, as in the user's run, so that what the model decides from those values it decides the
                # same way (backward and a checkpointed layer's recomputation stay fake: real there made real
                # copies of what the recomputation keeps)
                with unset_fake_temporarily():
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            flat = out if isinstance(out, (tuple, list)) else [out]
            for t in flat:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    # the optimizer's own temporaries are temp; its state is found in opt.state at the end
                    rec.st.see(t, "temp" if rec.phase == "optim" else rec.phase, mod, op)
            name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else ""
            if name == "clone" and args and isinstance(args[0], torch.Tensor) and rec.sdpa_out:
                # the contiguous copy of an attention output: the CPU's output is (B, h, T, d), a fused CUDA
                # kernel's is laid out (B, T, h, d), so the transpose back needs no copy there
                k = rec.sdpa_out.pop(args[0].untyped_storage()._cdata, None)
                if k is not None and isinstance(out, torch.Tensor):
                    rec.ops[k].setdefault("copies", []).append(rec.st.live[out.untyped_storage()._cdata][0])
            if name in GEMMS:
                bias = name in ("addmm", "baddbmm", "addmv", "_addmm_activation")
                rec.events.append(["g", 1 if rec.phase == "temp" else 0, int(bias)])
            return out

    def _seq_hi():
        return rec.seq_map[-1][0] if rec.seq_map else -1

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return card_call(func, args, kwargs or {})

    originals = {"scaled_dot_product_attention": F.scaled_dot_product_attention, "dropout": F.dropout}

    def recomputing(name):
        orig = originals[name]

        def call(*args, **kwargs):
            # backward runs without the torch function mode: a checkpointed layer's recomputation is seen here
            if rec.phase == "temp":
                return card_call(orig, args, kwargs)
            return orig(*args, **kwargs)
        return call

    # F.dropout hands the torch function mode the function F names now: the wrapper, which is the same op
    wrappers = {n: recomputing(n) for n in originals}
    card_fns.update({wrappers["dropout"]: "dropout", wrappers["scaled_dot_product_attention"]: "sdpa"})

    class Recompute:
        """F's dropout and attention, seen in backward too (as long as the trace runs)."""

        def __enter__(self):
            for n in originals:
                setattr(F, n, wrappers[n])

        def __exit__(self, *exc):
            for n, f in originals.items():
                setattr(F, n, f)
            return False

    def card_call(func, args, kwargs):
        # the forward, and in backward a checkpointed layer's recomputation
        kind = card_fns.get(func) if rec.phase in ("act", "temp") and rec.op_now < 0 else None
        if kind is None:
            out = func(*args, **kwargs)
            if rec.phase in ("act", "temp"):
                _note_seq(out)
            return out
        x = args[0] if args else kwargs.get("input", kwargs.get("query"))
        if kind == "dropout":
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.get("training", args[2] if len(args) > 2 else True)
            if not training or p == 0:
                return func(*args, **kwargs)
            info = {"kind": "dropout", "shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
                    "p": float(p), "module": rec.stack[-1]}
        else:
            k = args[1] if len(args) > 1 else kwargs.get("key")
            mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
            p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
            info = {"kind": "sdpa", "shape": list(x.shape), "kv": list(k.shape),
                    "dtype": str(x.dtype).replace("torch.", ""), "p": float(p), "mask": mask is not None,
                    "mask_shape": list(mask.shape) if mask is not None else [],
                    "causal": bool(kwargs.get("is_causal", False)), "module": rec.stack[-1],
                    # run inside checkpoint's saved-tensor hooks (or without grad: reentrant checkpointing's
                    # forward): the card's kernel keeps nothing for its backward; the layer's recomputation
                    # in backward is its own op, "of" this one
                    "checkpointed": rec.phase == "act" and (in_checkpoint() or not torch.is_grad_enabled())}
        idx = len(rec.ops)
        if rec.phase == "temp":  # a recomputation: the checkpointed forward op of the same kind and module
            info["of"] = next((i for i in range(idx - 1, -1, -1) if rec.ops[i].get("checkpointed")
                               and rec.ops[i]["kind"] == info["kind"] and rec.ops[i]["module"] == info["module"]
                               and not rec.ops[i].get("recomputed")), -1)
            if info["of"] >= 0:
                rec.ops[info["of"]]["recomputed"] = True
        rec.ops.append(info)
        rec.op_now = idx
        first_ev = len(rec.events)
        try:
            out = func(*args, **kwargs)
        finally:
            rec.op_now = -1
        outs = out if isinstance(out, (tuple, list)) else [out]
        keep = set()
        for t in outs:
            if isinstance(t, torch.Tensor):
                ev = rec.st.event_of(t)
                if ev is not None:
                    keep.add(id(ev))
        for ev in rec.events[first_ev:]:  # the outputs are the model's, the rest the op's own
            if ev[0] == "a" and id(ev) in keep:
                ev[5] = -1
        if kind == "sdpa":  # what a fused kernel keeps for backward: q, k, v, the mask and its output
            keep = [args[i] if len(args) > i else kwargs.get(n) for i, n in enumerate(("query", "key", "value"))]
            keep += [mask] + [t for t in outs if isinstance(t, torch.Tensor)]
            for t in outs:
                if isinstance(t, torch.Tensor):
                    rec.sdpa_out[t.untyped_storage()._cdata] = idx
            info["keep"] = sorted({v[0] for v in (rec.st.live.get(t.untyped_storage()._cdata) for t in keep
                                                  if isinstance(t, torch.Tensor)) if v})
        rec.events.append(["op", idx, "fwd"])
        _note_seq(out, op=idx)
        return out

    def _note_seq(out, op=-1):
        outs = out if isinstance(out, (tuple, list)) else [out]
        hi = _seq_hi()
        for t in outs:
            g = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
            if g is not None:
                try:
                    s = g._sequence_nr()
                except Exception:
                    continue
                if s > hi:
                    hi = s
        if hi > _seq_hi():
            rec.seq_map.append((hi, rec.stack[-1], op))
        return hi

    return Dispatch, Function, Recompute


def _hooks(model, rec):
    hs = []
    for name, m in model.named_modules():
        def pre(mod, inp, _n=name):
            rec.stack.append(_n)

        def post(mod, inp, out, _n=name):
            if len(rec.stack) > 1:
                rec.stack.pop()
        hs.append(m.register_forward_pre_hook(pre))
        hs.append(m.register_forward_hook(post, always_call=True))
    return hs


def _escapes(rec):
    """Backward: a storage made in an op's backward range that outlives the
    range (a gradient the op hands on) is the model's, not the op's own."""
    open_at = {}
    owner_op = {}
    ended = set()
    for ev in rec.events:
        if ev[0] == "op" and ev[2] == "bwd":
            open_at[ev[1]] = True
        elif ev[0] == "op" and ev[2] == "bwd_end":
            ended.add(ev[1])
            for sid, e in list(owner_op.items()):
                if e[5] == ev[1]:
                    e[5] = -1  # still live at the range's end: handed on
                    del owner_op[sid]
        elif ev[0] == "a" and ev[3] == "temp" and ev[5] >= 0:
            owner_op[ev[1]] = ev
        elif ev[0] == "f":
            owner_op.pop(ev[1], None)


def trace_step(model, batch=8, seq=128, loss=None, optimizer="adamw", precision="fp32", target="cpu",
               checkpointing=None, steps=2, lr=2e-5, frozen=()):
    """Traces `steps` training steps of `model` (any nn.Module) at batch x
    seq and returns the event list as a dict (the engine's input). target:
    "cpu" or "cuda" (the optimizer as torch picks it there: foreach AdamW on
    CUDA). loss: None (the model's own with labels, else cross-entropy on its
    output), "ce", "mse" or "bce". checkpointing: None (as the model is),
    True or False (on the modules that have the switch: ckpt_targets).
    frozen: names (a parameter's, or a module's prefix) traced as frozen,
    beside what the model freezes itself; the model is not changed."""
    torch = _torch()
    major, minor = (int("".join(c for c in x if c.isdigit()) or 0) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 1):
        raise TraceError(f"torch {torch.__version__}: the tracer needs torch 2.1 or newer (fake tensors whose "
                         "storages report their own release, and autograd's current node); torch 1.13's "
                         "FakeTensorMode refuses the real batch, a weak reference on its t.storage() dies with the "
                         "wrapper, not the storage, and its autograd has no current node to name the module running "
                         "in backward. With this torch, BertForSequenceClassification and BertForQuestionAnswering "
                         "are planned from their config")
    from torch._subclasses.fake_tensor import FakeTensorMode
    t0 = time.perf_counter()
    if optimizer not in ("adamw", "adamw_torch_fused", "sgd", "adam"):
        raise TraceError(f"--optimizer {optimizer}: the tracer runs adamw, adamw_torch_fused, adam or sgd")
    if precision not in ("fp32", "bf16", "fp16"):
        raise TraceError(f"--precision {precision}: expected fp32, fp16 or bf16")
    if loss not in (None, "ce", "mse", "bce"):
        raise TraceError(f"--loss {loss}: expected ce, mse or bce")
    rec = _Recorder(model, torch)
    Dispatch, Function, Recompute = _modes(rec, torch)
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    was_training = model.training
    # checkpointing set for the trace on the modules that have the switch (the seeds' wrapper: clf.bert),
    # and set back as it was afterwards
    ckpt_was = []
    if checkpointing is not None:
        for _, m in ckpt_targets(model):
            was = ckpt_on(m)
            ckpt_was.append((m, was))
            if checkpointing and not was:
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            elif not checkpointing and was:
                m.gradient_checkpointing_disable()
    hooks = []
    names = {}
    try:
        # the weights, once per storage (tied weights are one), as fake tensors
        named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
        fake = {}
        with fm:
            for n, p in named:
                if id(p) not in names:
                    f = fm.from_tensor(p)
                    if isinstance(p, torch.nn.Parameter):
                        keep = p.requires_grad and not any(n == q or n.startswith(q + ".") for q in frozen)
                        f = torch.nn.Parameter(f, requires_grad=keep)
                    names[id(p)] = (n, f)
                fake[n] = names[id(p)][1]
        for n, f in {id(f): (n, f) for n, f in names.values()}.values():
            rec.param_names[id(f)] = n
            rec.st.see(f, "param", n.rpartition(".")[0])
        trainable = [f for n, f in {id(f): (n, f) for n, f in names.values()}.values()
                     if isinstance(f, torch.nn.Parameter) and f.requires_grad]
        if not trainable:
            raise TraceError(f"{type(model).__name__}: no parameter requires grad: there is no training step to plan")
        hooks = _hooks(model, rec)
        model.train()
        gen_batches = [make_batch(model, batch, seq, torch, seed=i) for i in range(steps)]
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        with fm, Function(), Dispatch(), Recompute():
            kw = {"lr": lr}
            if optimizer in ("adamw", "adam"):
                kw["foreach"] = target == "cuda"
            if optimizer == "adamw_torch_fused":
                kw["fused"] = True
            cls = {"adamw": torch.optim.AdamW, "adamw_torch_fused": torch.optim.AdamW, "adam": torch.optim.Adam,
                   "sgd": torch.optim.SGD}[optimizer]
            if optimizer in ("adamw", "adamw_torch_fused"):
                kw["weight_decay"] = 0.01
            opt = cls(trainable, **kw)
            for step in range(steps):
                rec.events.append(["s", step])
                rec.phase = "temp"
                opt.zero_grad(set_to_none=True)
                b = gen_batches[step]
                gen_batches[step] = None
                for t in b.values():
                    rec.st.see(t, "input", "")
                rec.phase = "act"
                labels = {k: b[k] for k in ("labels", "start_positions", "end_positions") if k in b}
                own_loss = bool(labels) and loss is None
                args = dict(b) if own_loss else {k: v for k, v in b.items() if k not in labels}
                with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                    out = torch.func.functional_call(model, fake, (), args, tie_weights=True, strict=False)
                    if own_loss:
                        lv = out.loss
                    else:
                        lv = _user_loss(_logits(out, torch), loss, b, torch)
                del out, args
                rec.phase = "temp"
                lv.backward()
                rec.close_bwd()
                del lv, b, labels
                rec.phase = "optim"
                opt.step()
                rec.phase = "temp"
            rec.events.append(["s", steps])
            rec.recording = False
            # what the step left: gradients and the optimizer's state
            for f in trainable:
                if f.grad is not None:
                    ev = rec.st.event_of(f.grad)
                    if ev is not None:
                        ev[3] = "grad"
                        ev[4] = rec.owner_index(rec.param_names.get(id(f), "").rpartition(".")[0])
            for f, stt in opt.state.items():
                for v in stt.values():
                    if isinstance(v, torch.Tensor):
                        ev = rec.st.event_of(v)
                        if ev is not None:
                            ev[3] = "optim"
                            ev[4] = rec.owner_index(rec.param_names.get(id(f), "").rpartition(".")[0])
            # gradients of the first step (freed at the second zero_grad) are grads too
            _categorise_grads(rec)
            n_params = sum(f.numel() for _, f in {id(f): (n, f) for n, f in names.values()}.values()
                           if isinstance(f, torch.nn.Parameter))
            n_train = sum(f.numel() for f in trainable)
            del opt, trainable, fake, names
    except TraceError:
        raise
    except Exception as e:  # noqa: BLE001: every failure is named for the user, with its module and op
        op, mod = rec.last_op or ("?", "")
        where = mod or type(model).__name__
        cls_name = _module_class(model, mod)
        raise TraceError(f"{where} ({cls_name}) cannot be traced at op {op}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        rec.recording = False
        for h in hooks:
            h.remove()
        model.train(was_training)
        for m, was in ckpt_was:
            if was and not ckpt_on(m):
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            elif not was and ckpt_on(m):
                m.gradient_checkpointing_disable()
    _escapes(rec)
    return {"version": 1, "model": type(model).__name__, "torch": torch.__version__, "target": target,
            "batch": batch, "seq": seq, "precision": precision, "optimizer": optimizer,
            "loss": loss or ("model" if _labels_given(model) else "ce"), "steps": steps,
            "n_params": int(n_params), "n_trainable": int(n_train), "owners": rec.owners, "ops": rec.ops,
            "events": rec.events, "trace_seconds": round(time.perf_counter() - t0, 3)}


def ckpt_targets(model):
    """(name, module) whose gradient_checkpointing_enable() turns
    checkpointing on: the model when it has the switch, else its outermost
    submodules that do (the seeds' wrapper: bert)."""
    if hasattr(model, "gradient_checkpointing_enable"):
        return [("", model)]
    out = []
    for n, m in model.named_modules():
        if n and hasattr(m, "gradient_checkpointing_enable") and not any(n.startswith(p + ".") for p, _ in out):
            out.append((n, m))
    return out


def ckpt_on(m):
    """Whether m checkpoints now (transformers 5's is_activation_checkpointing
    where it has it: is_gradient_checkpointing warns there)."""
    attr = ("is_activation_checkpointing" if hasattr(type(m), "is_activation_checkpointing")
            else "is_gradient_checkpointing")
    return bool(getattr(m, attr, False))


def embeddings_of(model):
    """The name of the module that embeds the tokens (bert.embeddings,
    distilbert.embeddings, model.embeddings), or None."""
    torch = _torch()
    names = [n for n, m in model.named_modules() if n.split(".")[-1] == "embeddings"]
    if names:
        return min(names, key=len)
    emb = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)]
    return emb[0] if len(emb) == 1 else None


def layers_of(model):
    """The name of the list of encoder layers (bert.encoder.layer,
    distilbert.transformer.layer, model.layers): the ModuleList as long as
    the config's num_hidden_layers, or None."""
    torch = _torch()
    cfg = _modelish(model)
    n = int(getattr(cfg, "num_hidden_layers", 0) or 0) if cfg is not None else 0
    lists = [name for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and n and len(m) == n]
    return min(lists, key=len) if lists else None


def _labels_given(model):
    try:
        return "labels" in inspect.signature(model.forward).parameters and _is_hf(model)
    except (TypeError, ValueError):
        return False


def _module_class(model, name):
    try:
        return type(model.get_submodule(name)).__name__ if name else type(model).__name__
    except AttributeError:
        return type(model).__name__


def _categorise_grads(rec):
    """The gradients of an earlier step (the last step's are found through
    .grad): storages made in backward that the next step's zero_grad
    releases, after its step mark and before its batch arrives."""
    born = {}
    in_zero = False
    for ev in rec.events:
        if ev[0] == "s":
            in_zero = True
        elif ev[0] == "a":
            if ev[3] == "input":
                in_zero = False
            if ev[3] == "temp":
                born[ev[1]] = ev
        elif ev[0] == "f" and in_zero and ev[1] in born:
            born[ev[1]][3] = "grad"


def _user_loss(logits, loss, batch, torch):
    F = torch.nn.functional
    B = batch[next(iter(batch))].shape[0]
    if loss == "mse":
        return F.mse_loss(logits.float(), torch.zeros_like(logits, dtype=torch.float32))
    if loss == "bce":
        return F.binary_cross_entropy_with_logits(logits.float(), torch.zeros_like(logits, dtype=torch.float32))
    if logits.dim() == 3:  # (B, T, C): a label per token
        C = logits.shape[-1]
        target = torch.randint(0, C, (logits.shape[0] * logits.shape[1],))
        return F.cross_entropy(logits.reshape(-1, C), target)
    if logits.dim() != 2:
        raise TraceError(f"the model's output is {tuple(logits.shape)}: cross-entropy takes (batch, classes); "
                         "name the loss with --loss mse|bce")
    target = torch.randint(0, logits.shape[-1], (B,))
    return F.cross_entropy(logits, target)
