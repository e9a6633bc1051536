"""The house's map, checked on the built objects and the sources (issue 18):
no circle between files in the call graph (who calls whom, from `nm` of each
release object) nor in the include graph, calls and includes only go down
the module stack (cli -> magics -> app -> advisor -> torchplan -> bert -> gpu / kernel;
app/ is the request layer under both front doors, issue 39), the front doors'
cmd_* / run_tx* functions are short and include no engine header but the
config's (issue 39), and no
file outside gpu/ includes the cuda plugin's header; the PyTorch snapshot
reader's files go one way, decode -> trace -> owners and frames -> peak ->
leak -> diagnosis (issue 35)."""
import collections, functools, glob, os, re, subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK = {"cli": 7, "magics": 6, "app": 5, "advisor": 4, "torchplan": 3, "bert": 2, "gpu": 1, "kernel": 1}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def module(path):
    return path.split("/", 1)[0]


def allowed(a, b):
    ma, mb = module(a), module(b)
    return ma == mb or RANK[ma] > RANK[mb]


def cycles(edges):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


@functools.lru_cache(maxsize=None)  # one nm pass over the objects serves every test (read only)
def call_graph():
    objs = sorted(glob.glob(os.path.join(ROOT, "build", "rel", "*", "*.o")))
    assert objs, "build/rel holds no objects: run make first"
    defined, used = {}, collections.defaultdict(set)
    for o in objs:
        src = os.path.relpath(o, os.path.join(ROOT, "build", "rel"))[:-2] + ".c"
        for line in subprocess.run(["nm", "-g", o], capture_output=True, text=True, check=True).stdout.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBRVW":
                defined[f[2]] = src
            elif len(f) == 2 and f[0] == "U":
                used[src].add(f[1])
    edges = collections.defaultdict(set)
    for a, syms in used.items():
        for s in syms:
            b = defined.get(s)
            if b and b != a:
                edges[a].add(b)
    return edges


def sources():
    out = []
    for m in RANK:
        out += glob.glob(os.path.join(ROOT, m, "*.c")) + glob.glob(os.path.join(ROOT, m, "*.h"))
    return sorted(os.path.relpath(p, ROOT) for p in out)


@functools.lru_cache(maxsize=None)
def include_graph():
    files = sources()
    by_name = {os.path.basename(f): f for f in files}
    edges = collections.defaultdict(set)
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            for inc in INCLUDE.findall(fh.read()):
                local = os.path.normpath(os.path.join(os.path.dirname(f), inc))
                target = local if local in files else inc if inc in files else by_name.get(os.path.basename(inc))
                if target and target != f and not target.endswith(".def"):
                    edges[f].add(target)
    return edges


def test_no_circle_between_files():
    calls, incs = call_graph(), include_graph()
    assert cycles(calls) == [], "call graph circles"
    assert cycles(incs) == [], "include graph circles"


def test_calls_and_includes_go_down_the_stack():
    bad = [f"{a} -> {b}" for g in (call_graph(), include_graph()) for a in sorted(g) for b in sorted(g[a])
           if not allowed(a, b) and not b.startswith("gpu/cuda/") and not a.startswith("gpu/cuda/")]
    assert bad == []


# The PyTorch snapshot reader's files in the one direction they go (issue 35): each calls and includes
# only those before it. decode (the file into records), trace (replayed as the caching allocator ran it),
# owners and frames, the peak, the leak, the diagnosis, the entry points (snapshot.c), the model and its
# plan, the report. snapshot_write.c (the other way: a txkernel run as a snapshot) stands apart.
SNAPSHOT_ORDER = ["snapshot_decode", "snapshot_trace", "snapshot_frames", "snapshot_peak", "snapshot_leak",
                  "snapshot_diagnose", "snapshot", "snapshot_plan", "snapshot_report"]


def test_the_snapshot_reader_goes_one_way():
    rank = {f"advisor/{stem}{ext}": i for i, stem in enumerate(SNAPSHOT_ORDER) for ext in (".c", ".h")}
    present = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "advisor", "snapshot*.[ch]"))}
    assert present - set(rank) == {"advisor/snapshot_write.c"}, "a snapshot file with no place in SNAPSHOT_ORDER"
    back = [f"{a} -> {b}" for g in (call_graph(), include_graph()) for a in sorted(g) for b in sorted(g[a])
            if a in rank and b in rank and rank[b] > rank[a]]
    assert back == [], "a snapshot file uses one after it"
    # each layer is used: the entry points reach every layer before them
    calls = call_graph()
    assert {b for b in calls["advisor/snapshot.c"] if b in rank} == \
        {f"advisor/{s}.c" for s in SNAPSHOT_ORDER[:SNAPSHOT_ORDER.index("snapshot")]}, calls["advisor/snapshot.c"]


def test_the_cuda_plugins_header_stays_in_gpu():
    leaks = []
    for top in list(RANK) + ["bench"]:
        for p in glob.glob(os.path.join(ROOT, top, "**", "*.[ch]"), recursive=True):
            rel = os.path.relpath(p, ROOT)
            if rel.startswith("gpu/"):
                continue
            with open(p, encoding="utf-8") as fh:
                if "tk_cuda.h" in " ".join(INCLUDE.findall(fh.read())):
                    leaks.append(rel)
    assert leaks == []


# Issue 39: the front doors are thin: parse my syntax -> request -> app/ -> print or display. No cmd_* or
# run_tx* function of cli/txk.c or magics/tx*.c over about 40 lines, and no front-door file includes an
# advisor/, torchplan/ or bert/ header but the config's; no exceptions.
FRONT_DOORS = ["cli/txk.c"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "magics", "tx*.c")))
MAX_LINES = 40
DOOR_FN = re.compile(r"^(?:static\s+)?[a-z_][\w \*]*?\b((?:cmd|run_tx)\w*)\s*\([^;{]*\)\s*\{", re.M)


def door_functions(path):
    """{name: lines} of a front door's cmd_* / run_tx* functions (a function ends at the first
    column-0 closing brace)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        src = fh.read()
    out = {}
    for m in DOOR_FN.finditer(src):
        end = src.find("\n}\n", m.end())
        assert end > 0, f"{path}: {m.group(1)} has no closing brace at column 0"
        out[m.group(1)] = src.count("\n", m.start(), end) + 1
    return out


def test_front_door_functions_are_short():
    fat = {f"{p}:{name} ({n} lines)" for p in FRONT_DOORS for name, n in door_functions(p).items() if n > MAX_LINES}
    assert fat == set(), "a front-door function over 40 lines: move the request's work into app/"


def test_front_doors_include_no_engine_header_but_the_configs():
    below = ("advisor", "torchplan", "bert")
    bad = set()
    for p in FRONT_DOORS:
        with open(os.path.join(ROOT, p), encoding="utf-8") as fh:
            incs = {os.path.basename(i) for i in INCLUDE.findall(fh.read())}
        bad |= {f"{p}: {i}" for i in incs
                if i != "tk_config.h" and any(os.path.exists(os.path.join(ROOT, m, i)) for m in below)}
    assert bad == set(), "a front door includes an engine header: call app/ instead"
