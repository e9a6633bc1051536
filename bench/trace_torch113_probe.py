"""Can torch 1.13 (the old row: Debian's torch 1.13 + transformers 4.40 in
.venv) trace a training step the way python/txkernel/trace.py does on
torch 2.x? Each piece the tracer needs, tried on a 2-layer BERT under 1.13's
torch._subclasses.fake_tensor.FakeTensorMode and a TorchDispatchMode, with
the error each failure raises (issue 41, step 2; bench/RESULTS.md "the old
row").

    .venv/bin/python bench/trace_torch113_probe.py
"""
import traceback
import warnings
warnings.simplefilter("ignore")
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__)
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
print("has untyped_storage:", hasattr(torch.Tensor, "untyped_storage"), "_current_autograd_node:", hasattr(torch._C, "_current_autograd_node"),
      "torch.func:", hasattr(torch, "func"))
from transformers import BertConfig, BertForSequenceClassification
cfg = BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=256, vocab_size=1000)
m = BertForSequenceClassification(cfg); m.train()
def step(name, fn):
    try:
        r = fn(); print("OK  ", name, r if r is not None else ""); return True
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        print("FAIL", name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}  [{tb.filename.split('site-packages/')[-1]}:{tb.lineno}]")
        return False
import inspect; print("FakeTensorMode args:", inspect.signature(FakeTensorMode.__init__)); fm = FakeTensorMode()
fake = {}
def make_fake():
    with fm:
        for n, p in m.named_parameters():
            fake[n] = torch.nn.Parameter(fm.from_tensor(p), requires_grad=True)
        for n, b in m.named_buffers():
            fake[n] = fm.from_tensor(b)
step("fake parameters (fm.from_tensor)", make_fake)
ids = torch.randint(0, 1000, (2, 16)); mask = torch.ones(2, 16, dtype=torch.long); labels = torch.randint(0, 2, (2,))
from torch.nn.utils import stateless
out = {}
def fwd():
    with fm:
        o = stateless.functional_call(m, fake, (), {"input_ids": ids, "attention_mask": mask, "labels": labels})
        out["loss"] = o.loss
    return tuple(out["loss"].shape)
step("forward with real batch, fake weights (stateless.functional_call)", fwd)
def fwd_fake_batch():
    with fm:
        fi, fmk, fl = fm.from_tensor(ids), fm.from_tensor(mask), fm.from_tensor(labels)
        o = stateless.functional_call(m, fake, (), {"input_ids": fi, "attention_mask": fmk, "labels": fl})
        out["loss"] = o.loss
    return type(out["loss"]).__name__
step("forward, fake batch too", fwd_fake_batch)
def bwd():
    with fm:
        out["loss"].backward()
    g = [n for n, p in fake.items() if isinstance(p, torch.nn.Parameter) and p.grad is not None]
    return f"{len(g)} grads"
step("backward", bwd)
def opt():
    with fm:
        o = torch.optim.AdamW([p for p in fake.values() if isinstance(p, torch.nn.Parameter)], lr=1e-5, foreach=False)
        o.step()
    return "stepped"
step("AdamW step on fake params", opt)
def storage_release():
    import weakref
    fired = []
    with fm:
        t = torch.empty(4, 4)
        st = t.storage()
        weakref.finalize(st, lambda: fired.append(1))
        key = st._cdata if hasattr(st, "_cdata") else id(st)
        del t, st
    import gc; gc.collect()
    return f"storage finalizer fired: {bool(fired)}"
step("a weakref on a fake t.storage() fires after del (below: it fires with the tensor alive)", storage_release)
class Rec(TorchDispatchMode):
    def __init__(self): super().__init__(); self.n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))
def dispatch_under_fake():
    r = Rec()
    with fm, r:
        o = stateless.functional_call(m, fake, (), {"input_ids": ids, "attention_mask": mask, "labels": labels})
        o.loss.backward()
    return f"{r.n} ops dispatched"
step("TorchDispatchMode inside FakeTensorMode, forward+backward", dispatch_under_fake)
def node():
    return torch._C._current_autograd_node()
step("torch._C._current_autograd_node", node)
print("--- more")
def dispatch_fake_batch():
    r = Rec()
    with fm:
        fi, fmk, fl = fm.from_tensor(ids), fm.from_tensor(mask), fm.from_tensor(labels)
    with fm, r:
        o = stateless.functional_call(m, fake, (), {"input_ids": fi, "attention_mask": fmk, "labels": fl})
        o.loss.backward()
    return f"{r.n} ops seen by a TorchDispatchMode entered inside FakeTensorMode"
step("TorchDispatchMode inside FakeTensorMode, fake batch, forward+backward", dispatch_fake_batch)
def storage_identity():
    with fm:
        t = torch.empty(4, 4)
        a, b = t.storage(), t.storage()
        same_obj = a is b
        cd = (getattr(a, "_cdata", None), getattr(b, "_cdata", None))
        v = t.view(16)
        cv = getattr(v.storage(), "_cdata", None)
    return f"t.storage() is t.storage(): {same_obj}; _cdata equal: {cd[0] == cd[1]} (a view's too: {cv == cd[0]}); types {type(a).__name__}"
step("fake storage identity", storage_identity)
def finalize_while_alive():
    import weakref, gc
    fired = []
    with fm:
        t = torch.empty(4, 4)
        weakref.finalize(t.storage(), lambda: fired.append(1))
    gc.collect()
    alive = bool(fired)
    del t; gc.collect()
    return f"finalizer fired while the tensor is alive: {alive}"
step("weakref on a fake storage: release or the wrapper's death", finalize_while_alive)
def untyped():
    with fm:
        t = torch.empty(4, 4)
        return type(t.storage()._untyped()).__name__ if hasattr(t.storage(), "_untyped") else "no _untyped"
step("t.storage()._untyped()", untyped)
def opt_patched():
    import torch.autograd.profiler as prof
    class NoRF:
        def __init__(self, *a, **k): pass
        def __enter__(self): return self
        def __exit__(self, *a): return False
        def __call__(self, f): return f
    saved = prof.record_function
    prof.record_function = NoRF
    try:
        with fm:
            o = torch.optim.AdamW([p for p in fake.values() if isinstance(p, torch.nn.Parameter)], lr=1e-5, foreach=False)
            o.step()
        n = sum(len(s) for s in o.state.values())
    finally:
        prof.record_function = saved
    return f"AdamW stepped with record_function stubbed: {n} state tensors"
step("AdamW step, record_function stubbed", opt_patched)
def seq_nr():
    with fm:
        x = torch.nn.Parameter(fm.from_tensor(torch.ones(3)))
        y = (x * 2).sum()
    g = y.grad_fn
    return f"grad_fn._sequence_nr: {hasattr(g, '_sequence_nr') and g._sequence_nr()}"
step("autograd node sequence numbers", seq_nr)
