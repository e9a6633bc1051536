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
the module and the op.

torch 1.13 (the old row) is traced too, its own way where its fake tensors
differ (_old_torch): the batch is fake with real twins (_twin_call),
storages are released when their last seen tensor dies (_Storages), the
fake weights are set on the model for the trace (_swapped), the optimizer
runs without record_function (_no_record_function), and backward's
temporaries are not attributed to a module (no current autograd node)."""
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


def _old_torch(torch):
    """torch 1.13 (the old row): its own ways, below (_Storages, _modes, trace_step)."""
    major, minor = (int("".join(c for c in x if c.isdigit()) or 0) for x in torch.__version__.split(".")[:2])
    return (major, minor) < (2, 0)


def _skey(t):
    """A storage's identity: its StorageImpl (torch 1.13's t.storage() is a
    fresh wrapper each call, with the same _cdata)."""
    return t.untyped_storage()._cdata if hasattr(t, "untyped_storage") else t.storage()._cdata


def _gone_of(storages, tid, key):
    st = storages()
    if st is not None:
        st._gone(tid, key)


class _Storages:
    """Storage lives: id -> (bytes, event index), weak references firing the
    release. torch 2.x: a weak reference on the untyped storage. torch 1.13,
    whose t.storage() is a fresh wrapper each call: the live tensors seen on
    each storage are counted (a finalizer on each; a fake tensor's Python
    object lives as long as its TensorImpl, autograd's saved tensors too),
    and the storage is released when its last one dies. Every tensor the
    step makes comes out of an op the dispatch mode sees (views, autograd's
    detach and alias included), so each is counted."""

    def __init__(self, rec, old=False):
        self.rec = rec
        self.live = {}
        self.old = old
        self.count = {}             # torch 1.13: storage key -> live tensors seen on it
        self.tracked = set()        # torch 1.13: id() of the tensors counted

    def see(self, t, cat, owner, op=-1):
        key = _skey(t)
        if key in self.live:
            if self.old:
                self._track(t, key)
            return self.live[key][0]
        sid = self.rec.next_id
        self.rec.next_id += 1
        st = t.storage() if self.old else t.untyped_storage()
        nbytes = int(st.nbytes())
        ev = ["a", sid, nbytes, cat, self.rec.owner_index(owner), op]
        self.rec.events.append(ev)
        self.live[key] = (sid, ev)
        if self.old:
            self.count[key] = 0
            self._track(t, key)
        else:
            weakref.finalize(st, self._dead, key)
        return sid

    def _track(self, t, key):
        if id(t) in self.tracked:
            return
        self.tracked.add(id(t))
        self.count[key] += 1
        # through a weak reference: a tensor that outlives the trace (1.13's fake AdamW step counters, kept by
        # its fake mode's memo) must not keep the recorder and its events
        weakref.finalize(t, _gone_of, weakref.ref(self), id(t), key)

    def _gone(self, tid, key):
        self.tracked.discard(tid)
        n = self.count.get(key, 0) - 1
        if n > 0:
            self.count[key] = n
            return
        self.count.pop(key, None)
        self._dead(key)

    def _dead(self, key):
        sid, _ = self.live.pop(key, (None, None))
        if sid is not None and self.rec.recording:
            self.rec.events.append(["f", sid])

    def event_of(self, t):
        v = self.live.get(_skey(t))
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
        self.st = _Storages(self, old=_old_torch(torch))
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
        if self.st.old:
            # torch 1.13's autograd names no current node: backward's temporaries are the model's ("")
            return "", -1
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
    tree_leaves = getattr(pytree, "tree_leaves", None) or (lambda x: pytree.tree_flatten(x)[0])  # 1.13: none
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode
    old = rec.st.old
    if old:
        from torch.utils._mode_utils import no_dispatch
    else:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    F = torch.nn.functional
    GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "matmul", "_addmm_activation"}
    card_fns = {F.dropout: "dropout"}
    if hasattr(F, "scaled_dot_product_attention"):  # torch 1.13 has none
        card_fns[F.scaled_dot_product_attention] = "sdpa"
    top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)

    def in_checkpoint():
        return top_hooks is not None and top_hooks(False) is not None

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            mod, op = rec.where()
            schema = getattr(func, "_schema", None)
            rec.last_op = (schema.name if schema is not None else str(func), mod)
            leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if old and func is torch.ops.aten.detach.default and args and isinstance(args[0], (int, float, bool)):
                # 1.13: checkpointing's recomputation detaches what autograd saves, a Python scalar's wrapped
                # tensor too (x / 8.0), which the dispatch hands over as the number: its tensor again (a
                # 0-dim scalar, as autograd saved; not seen: no storage of the model's)
                return torch.tensor(args[0], dtype=torch.float64 if isinstance(args[0], float) else torch.int64)
            if old:
                out = _twin_call(func, args, kwargs, leaves)
            elif rec.phase == "act" and leaves and not any(isinstance(t, FakeTensor) for t in leaves):
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
                k = rec.sdpa_out.pop(_skey(args[0]), None)
                if k is not None and isinstance(out, torch.Tensor):
                    rec.ops[k].setdefault("copies", []).append(rec.st.live[_skey(out)][0])
            if name in GEMMS:
                bias = name in ("addmm", "baddbmm", "addmv", "_addmm_activation")
                rec.events.append(["g", 1 if rec.phase == "temp" else 0, int(bias)])
            return out

    def _twin_call(func, args, kwargs, leaves):
        """torch 1.13, whose FakeTensorMode takes no real tensor: the batch is
        fake, each of its tensors with its real twin (._txk_real), and in the
        forward an op of twinned tensors alone (a mask's processing, a check
        of the labels) is also run on the twins, so that what the model
        decides from those values (.item(), nonzero's length) it decides as
        in the user's run: the fake op's result where it has one, else (a
        data-dependent op) the real result's shape, made fake."""
        twins = rec.phase == "act" and all(getattr(t, "_txk_real", None) is not None for t in leaves)
        rout = None
        if twins:
            real = pytree.tree_map(lambda t: t._txk_real if isinstance(t, torch.Tensor) else t, (args, kwargs))
            try:
                with no_dispatch():
                    rout = func(*real[0], **real[1])
            except Exception:  # noqa: BLE001: the fake op alone says (or refuses)
                rout = None
        if rout is None:
            out = func(*args, **kwargs)
            if rec.phase == "act":  # an input changed in place by an op of untwinned tensors: its twin is stale
                for f in tree_leaves(out):
                    if isinstance(f, torch.Tensor) and getattr(f, "_txk_real", None) is not None:
                        f._txk_real = None
            return out
        try:
            out = func(*args, **kwargs)
        except Exception:  # noqa: BLE001: a data-dependent op (nonzero, .item()): its real result decides
            out = pytree.tree_map(lambda r: torch.empty_strided(r.shape, r.stride(), dtype=r.dtype)
                                  if isinstance(r, torch.Tensor) else r, rout)
        if not isinstance(out, (torch.Tensor, tuple, list)):
            return rout  # a scalar (.item()): the real one
        for f, r in zip(tree_leaves(out), tree_leaves(rout)):
            if isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor):
                f._txk_real = r
        return out

    def _seq_hi():
        return rec.seq_map[-1][0] if rec.seq_map else -1

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return card_call(func, args, kwargs or {})

    originals = {n: getattr(F, n) for n in ("scaled_dot_product_attention", "dropout") if hasattr(F, n)}

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
    card_fns.update({wrappers[n]: {"dropout": "dropout"}.get(n, "sdpa") for n in wrappers})

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
                    rec.sdpa_out[_skey(t)] = idx
            info["keep"] = sorted({v[0] for v in (rec.st.live.get(_skey(t)) for t in keep
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
        try:
            hs.append(m.register_forward_hook(post, always_call=True))
        except TypeError:  # torch 1.13: no always_call (a forward that raises ends the trace anyway)
            hs.append(m.register_forward_hook(post))
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
    old = (major, minor) == (1, 13)
    if (major, minor) < (2, 1) and not old:
        raise TraceError(f"torch {torch.__version__}: the tracer needs torch 1.13, or 2.1 or newer (fake tensors "
                         "and a dispatch mode that sees every op; 2.0's storages do not report their release). "
                         "With this torch, BertForSequenceClassification and BertForQuestionAnswering are planned "
                         "from their config")
    if old and optimizer == "adamw_torch_fused":
        raise TraceError(f"--optimizer adamw_torch_fused: torch {torch.__version__} has no fused AdamW")
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
    # 1.13: a fake tensor's .item() is 0 unless told to refuse it (a branch on the weights' values is refused)
    fm = FakeTensorMode(throw_on_data_dependent_ops=True) if old else FakeTensorMode(allow_non_fake_inputs=True)
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
        named = _named_tensors(model) if old else (list(model.named_parameters(remove_duplicate=False))
                                                   + list(model.named_buffers(remove_duplicate=False)))
        fake = {}
        with fm:
            for n, p in named:
                if id(p) not in names:
                    # 1.13: made by an op, not fm.from_tensor, whose memo puts a finalizer on the user's real
                    # tensor, left there after the trace
                    f = _fake_like(p, fm, torch) if old else fm.from_tensor(p)
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
        if old:  # 1.13's FakeTensorMode takes no real tensor: the batch is fake, each tensor with its real twin
            gen_batches = [{k: _twinned(v, fm, torch) for k, v in b.items()} for b in gen_batches]
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if old and dtype is torch.float16:
            # 1.13's CPU autocast takes bfloat16 only ("AutocastCPU only support Bfloat16"): fp16 is traced as
            # the other 16-bit type, the same bytes an element; the trace still says fp16 (its scaler's steps)
            dtype = torch.bfloat16
        # torch 1.13: the fake weights set on the model for both steps (a checkpointed layer's recomputation
        # in backward runs the module as it is then)
        with _swapped(model, fake if old else {}), fm, Function(), Dispatch(), Recompute():
            kw = {"lr": lr}
            if optimizer in ("adamw", "adam"):
                # as torch picks it: foreach for CUDA tensors from 2.0; 1.13's default is single-tensor everywhere
                kw["foreach"] = target == "cuda" and not old
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
                with _no_record_function(torch, old):
                    # the version's default, as the user's loop calls it: torch 2 frees the gradients,
                    # 1.13 zero-fills and keeps them
                    opt.zero_grad(set_to_none=not old)
                b = gen_batches[step]
                gen_batches[step] = None
                for t in b.values():
                    rec.st.see(t, "input", "")
                rec.phase = "act"
                labels = {k: b[k] for k in ("labels", "start_positions", "end_positions") if k in b}
                own_loss = bool(labels) and loss is None
                args = dict(b) if own_loss else {k: v for k, v in b.items() if k not in labels}
                with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                    if old:
                        out = model(**args)
                    else:
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
                with _no_record_function(torch, old):
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
        if old:
            _forget_memos(fm)
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
            "foreach": optimizer in ("adamw", "adam") and target == "cuda" and not old,
            "loss": loss or ("model" if _labels_given(model) else "ce"), "steps": steps,
            "n_params": int(n_params), "n_trainable": int(n_train), "owners": rec.owners, "ops": rec.ops,
            "events": rec.events, "trace_seconds": round(time.perf_counter() - t0, 3)}


def _named_tensors(model):
    """torch 1.13 (no remove_duplicate=False): every (name, parameter or
    buffer), a tied one under each of its names."""
    out = []
    for mn, m in model.named_modules(remove_duplicate=False):
        pre = mn + "." if mn else ""
        out += [(pre + n, p) for n, p in m._parameters.items() if p is not None]
    for mn, m in model.named_modules(remove_duplicate=False):
        pre = mn + "." if mn else ""
        out += [(pre + n, b) for n, b in m._buffers.items() if b is not None]
    return out


class _swapped:
    """torch 1.13: the fake parameters and buffers set on the model for its
    forward by setattr (1.13's stateless.functional_call parametrizes, and a
    module that keeps its own list of its weights, as nn.LSTM's
    _flat_weights, would run its real ones), set back afterwards."""

    def __init__(self, model, tensors):
        self.model, self.tensors, self.saved = model, tensors, []

    def __enter__(self):
        for n, f in self.tensors.items():
            mn, _, attr = n.rpartition(".")
            m = self.model.get_submodule(mn) if mn else self.model
            buf = attr in m._buffers
            self.saved.append((m, attr, buf, m._buffers[attr] if buf else m._parameters[attr]))
            if buf:
                m._buffers[attr] = f
            else:
                setattr(m, attr, f)
        return self

    def __exit__(self, *exc):
        for m, attr, buf, orig in reversed(self.saved):
            if buf:
                m._buffers[attr] = orig
            else:
                setattr(m, attr, orig)
        return False


def _forget_memos(fm):
    """torch 1.13: the fake mode's converters remember each real tensor they
    made a fake of (AdamW's step counters, made by torch.tensor under the
    mode); through C++ that cycle is not collected, and it keeps the mode and
    the fakes past the trace. Forgotten once the trace is done."""
    conv = getattr(fm, "fake_tensor_converter", None)
    for memo in (conv, getattr(conv, "meta_converter", None)):
        for attr in ("tensor_memo", "storage_memo"):
            d = getattr(memo, attr, None)
            if hasattr(d, "clear"):
                d.clear()


def _fake_like(t, fm, torch):
    """torch 1.13: a fake tensor of t's shape, strides and dtype, made by an
    op under the mode (nothing kept on t)."""
    with fm:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)


def _twinned(t, fm, torch):
    """torch 1.13: a fake tensor like t (made by an op: fm.from_tensor's memo
    would keep it alive), t its real twin."""
    f = _fake_like(t, fm, torch)
    f._txk_real = t
    return f


class _no_record_function:
    """torch 1.13: the optimizer's record_function fails under FakeTensorMode
    (profiler::_record_function_enter takes two arguments, the mode passes
    three); a no-op in its place for zero_grad and step (it allocates
    nothing). torch 2.x: nothing changed."""

    def __init__(self, torch, old):
        self.prof = torch.autograd.profiler if old else None

    def __enter__(self):
        if self.prof is not None:
            self.saved = self.prof.record_function
            self.prof.record_function = _NoRecordFunction

    def __exit__(self, *exc):
        if self.prof is not None:
            self.prof.record_function = self.saved
        return False


class _NoRecordFunction:
    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __call__(self, f):
        return f


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
