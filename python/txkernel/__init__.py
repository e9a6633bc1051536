"""txkernel's magics in any IPython kernel: `%load_ext txkernel`.

Registers every tx* magic of the C engine (%%txtrain, %txplan, %txmem,
%txdata, %txadvise, %txfix, %txdevice, %txreset, %txkeys, %txhelp, ...) with
the syntax and outputs they have in the txkernel kernel. Each output is the
engine's MIME bundle, shown with IPython's display machinery (progress as a
display updated in place through its display_id); an engine error is one
error line (ename: evalue, as in txkernel), not a traceback through the
binding; the stop button (SIGINT) sets the engine's cancel flag, so a run
stops at its next step with the same report. The shell habits (!cmd, %cd,
%env, %%bash) are IPython's own here, so the engine's are not registered."""
import sys

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


def _run(code):
    from IPython.display import display, clear_output
    result, error = [], []

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
    for m in _engine.magics():
        # only the tx* magics: %cd, %env, %%bash, %lsmagic ... are IPython's own
        if not m["name"].startswith("tx"):
            continue
        fn, kind = _make_magic(m["name"], m["kind"])
        fn.__doc__ = m["help"]
        ip.register_magic_function(fn, magic_kind=kind, magic_name=m["name"])
    ip.set_custom_exc((TxError,), _show_error)


def unload_ipython_extension(ip):
    if _engine is not None:
        _engine.reset()
    ip.set_custom_exc((), None)
