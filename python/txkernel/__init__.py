"""txkernel's magics in any IPython kernel: `%load_ext txkernel`.

Registers every tx* magic of the C engine (%%txtrain, %txplan, %txmem,
%txdata, %txadvise, %txfix, %txdevice, %txreset, %txkeys, %txhelp, ...) with
the syntax and outputs they have in the txkernel kernel, plus what only a
Python kernel can do: %txmem --torch reads this process' own PyTorch memory
(its live snapshot), and %%txwatch runs a cell with PyTorch's memory history
on and, at a CUDA out-of-memory, shows the diagnosis of that moment. Each output is the
engine's MIME bundle, shown with IPython's display machinery (progress as a
display updated in place through its display_id); an engine error is one
error line (ename: evalue, as in txkernel), not a traceback through the
binding; the stop button (SIGINT) sets the engine's cancel flag, so a run
stops at its next step with the same report. Before each cell the engine is
told what the user's PyTorch in this process holds on the GPU (its caching
allocator's reserved and allocated bytes), which %txdevice, %txmem, the
plans' free and the advisor's release fix count. The shell habits (!cmd, %cd,
%env, %%bash) are IPython's own here, so the engine's are not registered."""
import os
import pickle
import sys
import tempfile

from ._engine import Engine, version

__all__ = ["load_ipython_extension", "unload_ipython_extension", "Engine", "version"]

_engine = None
_errors = {}


class TxError(Exception):
    """An error the engine reported; shown as its one line."""

    def __init__(self, ename, evalue, traceback):
        super().__init__(evalue)
        self.ename, self.evalue, self.tb_lines = ename, evalue, traceback


def _error_class(ename):
    # the error output's ename is the exception class's name: one subclass
    # per engine ename keeps it equal to txkernel's
    if ename not in _errors:
        _errors[ename] = type(ename, (TxError,), {"__module__": "txkernel"})
    return _errors[ename]


def _show_error(shell, etype, value, tb, tb_offset=None):
    stb = list(value.tb_lines) or [f"{value.ename}: {value.evalue}"]
    shell._showtraceback(etype, value, stb)
    return stb


class _Result:
    """The engine's execute_result, handed to IPython as the magic's value."""

    def __init__(self, data, metadata):
        self.data, self.metadata = data, metadata

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.data, self.metadata

    def __repr__(self):
        return self.data.get("text/plain", "")


# tk_embed_set_holder's states
_NOT_REPORTED, _NO_TORCH, _NO_CUDA, _CUDA_IDLE, _HOLDS = range(5)


def _torch_holder():
    """What the user's PyTorch in this process holds on the GPU the engine
    uses, read without importing torch or initialising CUDA for it: the
    caching allocator's reserved and allocated bytes on torch's current
    device. The engine decides what that means for plans and fixes."""
    torch = sys.modules.get("torch")
    if torch is None:
        return _NO_TORCH, 0, 0
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_available():
            return _NO_CUDA, 0, 0
        if hasattr(cuda, "is_initialized") and not cuda.is_initialized():
            return _CUDA_IDLE, 0, 0
        dev = cuda.current_device()
        reserved, allocated = int(cuda.memory_reserved(dev)), int(cuda.memory_allocated(dev))
        return _HOLDS, reserved, min(allocated, reserved)
    except Exception:  # a torch in a state we cannot read: report nothing
        return _NOT_REPORTED, 0, 0


def _run(code):
    from IPython.display import display, clear_output
    result, error = [], []
    _engine.set_holder(*_torch_holder())

    def on_output(msg):
        t = msg["msg_type"]
        if t == "stream":
            f = sys.stderr if msg["name"] == "stderr" else sys.stdout
            f.write(msg["text"])
            f.flush()
        elif t in ("display_data", "update_display_data"):
            sys.stdout.flush()
            kw = {"display_id": msg["display_id"]} if msg.get("display_id") else {}
            if t == "update_display_data":
                kw["update"] = True
            display(msg["data"], raw=True, metadata=msg.get("metadata") or {}, **kw)
        elif t == "execute_result":
            result.append(_Result(msg["data"], msg.get("metadata") or {}))
        elif t == "clear_output":
            clear_output(wait=msg.get("wait", False))
        elif t == "error":
            error.append(msg)
        elif t == "page":
            from IPython.core import page
            page.page(msg["data"])

    rc = _engine.execute(code, on_output)
    sys.stdout.flush()
    sys.stderr.flush()
    if rc == -2:
        raise _error_class("UsageError")("UsageError", "the txkernel engine is still running another cell", [])
    if error:
        e = error[0]
        raise _error_class(e["ename"])(e["ename"], e["evalue"], e.get("traceback") or [])
    return result[-1] if result else None


# ---- the user's own PyTorch: %txmem --torch and %%txwatch -------------------

def _torch_cuda():
    """torch.cuda of this process, or (None, why not) in one line."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return None, "torch is not installed in this kernel: there is no PyTorch memory to read"
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available():
        return None, "torch sees no CUDA device here (torch.cuda.is_available() is False): no GPU memory to read"
    return cuda, None


def _snapshot_file(cuda):
    """The live torch.cuda.memory._snapshot() pickled to a temporary file for
    the engine's reader (the same file _dump_snapshot would write)."""
    fd, path = tempfile.mkstemp(prefix="txk-torch-", suffix=".pickle")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(cuda.memory._snapshot(), f)
    return path


def _has_history(cuda):
    """1 when the live snapshot holds any recorded trace event."""
    try:
        snap = cuda.memory._snapshot()
    except Exception:  # a build without snapshots: nothing recorded
        return False
    traces = snap.get("device_traces") if isinstance(snap, dict) else None
    return bool(traces) and any(len(t) for t in traces)


def _with_capacity(cuda, line):
    """line, with this device's total memory as --capacity when the user gave
    neither --gpu nor --capacity: the snapshot is judged against the card it
    came from (a snapshot alone does not say how large the card was)."""
    words = line.split()
    if "--gpu" in words or "--capacity" in words:
        return line
    try:
        total = cuda.get_device_properties(cuda.current_device()).total_memory
    except Exception:  # a build or stand-in without device properties: judged without the card
        return line
    return f"{line} --capacity {int(total)}".strip()


def _txmem(line):
    """%txmem, with --torch: this process' PyTorch caching allocator, read
    from its live snapshot and diagnosed like a snapshot file."""
    words = line.split()
    if "--torch" not in words:
        return _run(f"%txmem {line}".rstrip())
    cuda, why = _torch_cuda()
    if cuda is None:
        print(why)
        return None
    path = _snapshot_file(cuda)
    try:
        rest = _with_capacity(cuda, " ".join(w for w in words if w != "--torch"))
        return _run(f"%txmem --snapshot {path} {rest}".rstrip())
    finally:
        os.unlink(path)


def _txwatch(ip, line, cell):
    """%%txwatch: runs the cell with PyTorch's memory history recording on;
    when it raises torch.cuda.OutOfMemoryError, the snapshot of that moment
    is diagnosed (%txmem --snapshot) in place of the bare traceback, which
    stays available (%tb, sys.last_traceback); when no history was recorded,
    the error's message is read as a pasted one (%%txadvise --from-error).
    Once %txplan --torch-model NAME has traced your model, both plan by
    tracing it: the snapshot's run and fixes when its batch and length are
    the traced ones (else one line says which differ)."""
    cuda, why = _torch_cuda()
    if cuda is None:
        print(f"%%txwatch: {why}; the cell runs without watching")
    else:
        cuda.memory._record_memory_history(max_entries=100000)
    code = ip.compile(ip.transform_cell(cell), ip.compile.cache(cell), "exec")
    try:
        exec(code, ip.user_ns)
    except BaseException as e:
        oom = getattr(cuda, "OutOfMemoryError", None) if cuda is not None else None
        if oom is None or not isinstance(e, oom):
            raise
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, e.__traceback__
        print(f"CUDA out of memory in this cell: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        if not _has_history(cuda):
            # nothing recorded (history off, or a build that records none): the
            # bare message goes to the pasted-message reader, as %%txadvise --from-error
            print("(the traceback: %tb)")
            return _run("%%txadvise --from-error\n" + str(e))
        path = _snapshot_file(cuda)
        try:
            return _run(f"%txmem --snapshot {path} {_with_capacity(cuda, line)}".rstrip())
        finally:
            os.unlink(path)
            print("(the traceback: %tb)")
    finally:
        if cuda is not None:
            cuda.memory._record_memory_history(enabled=None)


def _txplan_torch(ip, line):
    """%txplan --torch-model NAME / --trainer NAME: the live model (or
    Trainer) planned with engine: pytorch (python/txkernel/torch_model.py).
    The card goes to the engine as its --gpu / --gpus flag, so a bad name is
    that flag's error; --show-config prints the config with its gpu: line,
    which `txk plan` plans the same."""
    from . import torch_model, trace_plan
    if trace_plan.wants_trace(line.split(), ip.user_ns):
        # any other module, or an attribute path: its own step, traced (issue 41)
        try:
            return _Result(trace_plan.plan(line.split(), ip.user_ns, _engine), {})
        except torch_model.PlanArgsError as e:
            raise _error_class("UsageError")("UsageError", str(e), [])
    try:
        opts = torch_model.parse(line.split())
        yaml, flags = torch_model.config_yaml(opts, ip.user_ns)
    except torch_model.PlanArgsError as e:
        raise _error_class("UsageError")("UsageError", str(e), [])
    if opts["show"]:
        print(yaml + (f"gpu: {flags[1]}\n" if flags[:1] == ["--gpu"] else ""), end="")
    return _run(" ".join(["%%txplan"] + flags + (["--json"] if opts["json"] else [])) + "\n" + yaml)


# ---- %txhelp: the companion's own magics -----------------------------------

_COMPANION_HELP = {
    "txmem": "in this Python kernel, %txmem --torch [--json] reads this process' own PyTorch memory (its live "
             "torch.cuda.memory snapshot) and diagnoses it like %txmem --snapshot FILE.",
    "txplan": "in this Python kernel, " + "%txplan --torch-model NAME / --trainer NAME plans a live transformers model "
              "or Trainer of this notebook as PyTorch runs its step (engine: pytorch), reading its shape, "
              "checkpointing, frozen weights and (a Trainer) its TrainingArguments; advice on it is then written as "
              "TrainingArguments lines.\nusage: ",
}


def _txhelp(line):
    """%txhelp [NAME]: the magics of this Python kernel (the engine's tx*
    magics, %%txwatch and what only a Python kernel adds), or one's help."""
    name = line.strip().lstrip("%")
    magics = {m["name"]: m for m in _engine.magics() if m["name"].startswith("tx")}
    if not name:
        print("txkernel in this Python kernel (%load_ext txkernel): Python cells run as usual; these magics plan, "
              "train and explain memory:")
        rows = [("%%" if m["kind"] == "cell" else "%") + n + "  " + m["summary"] for n, m in magics.items()]
        rows.append("%%txwatch  run the cell with PyTorch's memory history on; at a CUDA out-of-memory, the diagnosis "
                    "of that moment")
        for r in rows:
            print("  " + r)
        print("%txhelp NAME shows one magic's help; !cmd, %cd, %env and %%bash are IPython's own here.")
        return None
    if name == "txwatch":
        print("%%txwatch [--json]\n" + " ".join(_txwatch.__doc__.split()))
        return None
    if name not in magics:
        known = sorted(list(magics) + ["txwatch"])
        raise _error_class("UsageError")("UsageError", f"no magic named {name} here (the magics: "
                                         + ", ".join(known) + ")", [])
    print(magics[name]["help"])
    if name in _COMPANION_HELP:
        from .torch_model import USAGE
        print("\n" + _COMPANION_HELP[name] + (USAGE if name == "txplan" else ""))
    return None


def _make_magic(name, kind):
    from IPython.core.magic import no_var_expand

    # no_var_expand: the engine's syntax ({gpu: t4}, $ in paths) reaches it
    # unchanged, as in txkernel
    if kind == "line":
        @no_var_expand
        def line_magic(line):
            return _run(f"%{name} {line}".rstrip())
        return line_magic, "line"
    if kind == "cell":
        @no_var_expand
        def cell_magic(line, cell):
            return _run(f"%%{name} {line}".rstrip() + "\n" + cell)
        return cell_magic, "cell"

    @no_var_expand
    def both(line, cell=None):
        if cell is None:
            return _run(f"%{name} {line}".rstrip())
        return _run(f"%%{name} {line}".rstrip() + "\n" + cell)
    return both, "line_cell"


def load_ipython_extension(ip):
    global _engine
    if _engine is None:
        _engine = Engine()
        from ._engine import OPENMP_NOTE
        if OPENMP_NOTE:
            print("txkernel: " + OPENMP_NOTE, file=sys.stderr)
    for m in _engine.magics():
        # only the tx* magics: %cd, %env, %%bash, %lsmagic ... are IPython's own
        if not m["name"].startswith("tx"):
            continue
        fn, kind = _make_magic(m["name"], m["kind"])
        if m["name"] == "txmem":
            from IPython.core.magic import no_var_expand
            fn = no_var_expand(lambda line: _txmem(line))
        if m["name"] == "txhelp":
            from IPython.core.magic import no_var_expand
            fn = no_var_expand(lambda line: _txhelp(line))
        if m["name"] == "txplan":
            from IPython.core.magic import no_var_expand
            engine_txplan = fn

            @no_var_expand
            def txplan(line, cell=None, _engine_txplan=engine_txplan):
                words = line.split()
                if cell is None and ("--torch-model" in words or "--trainer" in words):
                    return _txplan_torch(ip, line)
                return _engine_txplan(line, cell) if cell is not None else _engine_txplan(line)
            fn = txplan
        fn.__doc__ = m["help"]
        ip.register_magic_function(fn, magic_kind=kind, magic_name=m["name"])

    def txwatch(line, cell):
        return _txwatch(ip, line, cell)
    txwatch.__doc__ = _txwatch.__doc__
    ip.register_magic_function(txwatch, magic_kind="cell", magic_name="txwatch")
    ip.set_custom_exc((TxError,), _show_error)


def unload_ipython_extension(ip):
    if _engine is not None:
        _engine.reset()
    ip.set_custom_exc((), None)
