"""The binding: ctypes over the C engine's embedding API (magics/tk_embed.h)
in libtxk.so, which `pip install .` builds and puts next to this file.

ctypes, not cffi or a CPython extension: it is in every Python (Colab's and
Debian's alike), needs no compiler at install time beyond the one that builds
the engine, and a ctypes.CDLL call releases the GIL for its whole duration,
so IPython's control and heartbeat threads keep answering while the engine
plans or trains. Output callbacks take the GIL back only while one output is
handed over. Nothing of the engine's logic lives here: the engine parses the
cell, runs it, and says what to show."""
import ctypes
import json
import os

from ._cudalibs import export_env

_HERE = os.path.dirname(os.path.abspath(__file__))
EMIT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
# tk_trace_fn (app/tk_embed_trace.h): (user, request JSON, out path, errbuf, errlen) -> 0 | -1
TRACE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p,
                         ctypes.c_size_t)
CATCH_SIGINT = 1


# Set when libgomp was already in this process, with its spin-wait default,
# before the engine came: the line %load_ext prints.
OPENMP_NOTE = None


def _open_passive(path):
    """Opens the engine with libgomp's workers sleeping, not spinning, between
    parallel regions. libgomp reads OMP_WAIT_POLICY once, when it is loaded;
    left at its default, each worker spins ~3 ms after every region, which on
    a busy or small machine takes the cores the next region needs (the
    companion trained at 0.4x `txk train`, which re-execs with the passive
    policy, on 2 shared cores). So the policy is set for this dlopen only and
    the environment restored: the user's own processes and later imports see
    what they saw. When libgomp is already loaded (torch loads its copy, same
    soname, on import) its policy is fixed; then, unless the user chose one,
    OPENMP_NOTE says so and what to do."""
    global OPENMP_NOTE
    if "OMP_WAIT_POLICY" in os.environ:
        return ctypes.CDLL(path)
    try:
        ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
        loaded = True
    except OSError:
        loaded = False
    if loaded and _own_libgomp(path):
        loaded = False  # the engine loads its own copy, which reads the policy afresh
    if loaded:
        OPENMP_NOTE = ("OpenMP (libgomp) was already loaded here (torch loads it on import) with its default "
                       "spin-waiting, which txkernel cannot change now: on a busy machine CPU training runs "
                       "slower than `txk train` (a quarter of its speed on 2 shared cores). To avoid it, "
                       "restart the kernel and run `%load_ext txkernel` before `import torch`, or set "
                       "os.environ['OMP_WAIT_POLICY'] = 'passive' before importing torch")
        return ctypes.CDLL(path)
    os.environ["OMP_WAIT_POLICY"] = "passive"
    try:
        return ctypes.CDLL(path)
    finally:
        del os.environ["OMP_WAIT_POLICY"]


def _own_libgomp(path):
    """True when the engine carries its own libgomp: the wheel's copy (auditwheel
    renames it libgomp-<hash>.so.1.0.0, so it is not the libgomp.so.1 torch loaded)."""
    libs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), "txkernel_bert.libs")
    return os.path.isdir(libs) and any(f.startswith("libgomp-") for f in os.listdir(libs))


def _load():
    path = os.environ.get("TXK_ENGINE_LIB") or os.path.join(_HERE, "libtxk.so")
    # the cuda plugin is found through $TXK_CUDA_PLUGIN when it is not next to
    # the executable (here the executable is python), and the CUDA libraries
    # it opens through $TXK_CUDA_LIBDIRS (_cudalibs.py)
    export_env(os.path.join(_HERE, "libtk_cuda.so"))
    lib = _open_passive(path)
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    lib.tk_embed_new.restype = vp
    lib.tk_embed_new.argtypes = []
    lib.tk_embed_destroy.restype = None
    lib.tk_embed_destroy.argtypes = [ctypes.POINTER(vp)]
    lib.tk_embed_execute.restype = ctypes.c_int
    lib.tk_embed_execute.argtypes = [vp, cp, ctypes.c_int, EMIT, vp]
    lib.tk_embed_cancel.restype = None
    lib.tk_embed_cancel.argtypes = [vp]
    lib.tk_embed_reset.restype = None
    lib.tk_embed_reset.argtypes = [vp]
    # returned strings are freed by tk_embed_free, so they come back as void *
    lib.tk_embed_magics_json.restype = vp
    lib.tk_embed_magics_json.argtypes = [vp]
    lib.tk_embed_complete_json.restype = vp
    lib.tk_embed_complete_json.argtypes = [vp, cp, ctypes.c_int]
    lib.tk_embed_set_holder.restype = ctypes.c_int
    lib.tk_embed_set_holder.argtypes = [vp, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong]
    lib.tk_embed_options_json.restype = vp
    lib.tk_embed_options_json.argtypes = []
    lib.tk_embed_set_traced.restype = ctypes.c_int
    lib.tk_embed_set_traced.argtypes = [vp, cp, cp, cp, cp, TRACE, vp, ctypes.c_double, cp, ctypes.c_char_p,
                                        ctypes.c_size_t]
    lib.tk_embed_free.restype = None
    lib.tk_embed_free.argtypes = [vp]
    lib.tk_embed_version.restype = cp
    lib.tk_embed_version.argtypes = []
    return lib


_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def _taken_json(ptr):
    """The JSON of a string the engine returned (tk_embed_free'd here)."""
    if not ptr:
        raise MemoryError("txkernel: out of memory in the engine")
    try:
        return json.loads(ctypes.string_at(ptr).decode("utf-8"))
    finally:
        lib().tk_embed_free(ptr)


class Engine:
    """One engine session (the state a txkernel kernel keeps between cells)."""

    def __init__(self):
        self._h = lib().tk_embed_new()
        if not self._h:
            raise MemoryError("txkernel: out of memory creating the engine")

    def execute(self, code, on_output, catch_sigint=True):
        """Runs one cell's text; on_output(dict) gets each output in order.
        Returns 0 (ok), -1 (the engine sent an error), -2 (busy)."""
        def emit(_user, raw):
            on_output(json.loads(raw.decode("utf-8")))
        cb = EMIT(emit)  # kept alive for the call
        return lib().tk_embed_execute(self._h, code.encode("utf-8"), CATCH_SIGINT if catch_sigint else 0, cb, None)

    def cancel(self):
        lib().tk_embed_cancel(self._h)

    def reset(self):
        lib().tk_embed_reset(self._h)

    def set_holder(self, state, reserved=0, allocated=0):
        """What this process' PyTorch holds on the GPU (tk_embed.h's states)."""
        if lib().tk_embed_set_holder(self._h, state, reserved, allocated):
            raise ValueError(f"txkernel: bad holder report {state} {reserved} {allocated}")

    def set_traced(self, config_yaml, label, note, trace_path, tracer, budget_s=20.0, platform=None):
        """The named model as the session's config, its advice planned by
        tracing (tk_embed.h's tk_embed_set_traced). tracer(request: dict,
        out_path: str) writes the trace or raises with the reason; it is kept
        here while the session keeps the model."""
        def cb(_user, request, out_path, errbuf, errlen):
            try:
                tracer(json.loads(request.decode("utf-8")), out_path.decode("utf-8"))
                return 0
            except BaseException as e:  # noqa: BLE001: a callback from C must not raise; the reason goes back
                msg = (str(e) or type(e).__name__).encode("utf-8", "replace")[: max(0, errlen - 1)]
                ctypes.memmove(errbuf, msg + b"\0", len(msg) + 1)
                return -1
        keep = TRACE(cb)
        err = ctypes.create_string_buffer(512)
        enc = lambda s: s.encode("utf-8") if s else None  # noqa: E731
        if lib().tk_embed_set_traced(self._h, config_yaml.encode("utf-8"), enc(label), enc(note), enc(trace_path), keep,
                                     None, budget_s, enc(platform), err, len(err)):
            raise ValueError(err.value.decode("utf-8", "replace"))
        self._tracer = keep  # the engine calls it until the session drops the model

    def magics(self):
        return _taken_json(lib().tk_embed_magics_json(self._h))

    def complete(self, code, cursor):
        """Completions at character offset cursor: (matches, start, end) in characters."""
        b = code.encode("utf-8")
        bcur = len(code[:cursor].encode("utf-8"))
        r = _taken_json(lib().tk_embed_complete_json(self._h, b, bcur))
        to_chars = lambda n: len(b[:n].decode("utf-8", "replace"))  # noqa: E731
        return r["matches"], to_chars(r["start"]), to_chars(r["end"])

    def close(self):
        if self._h:
            h = ctypes.c_void_p(self._h)
            lib().tk_embed_destroy(ctypes.byref(h))
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def options():
    """The engine's option table (app/options.c): [{name, metavar, bare_in,
    help, uses: [{verbs, doors}]}], the one source every front door's flags
    come from, the companion's own among them."""
    return _taken_json(lib().tk_embed_options_json())


def version():
    return lib().tk_embed_version().decode()
