"""Runs each interop test on every peer row (tests/peers.py: torch1 = .venv,
torch2 = .venv-t2).

A test marked `peer` (`@pytest.mark.peer`, or `pytestmark = pytest.mark.peer`
for a whole module) is collected once per row, its id carrying the row's
label (`test_x[torch1]`, `test_y[torch2-16]`). The row whose venv is the
interpreter running pytest runs in this process, as any test does. Another
row's items never import its packages here: the first of them starts one
child pytest in that row's python (`PYTHON -m pytest NODEIDS`,
TXK_PEER_ROW=label) over every test of the session on that row, and each
item reports the child's outcome for its test: passed, failed (with the
child's report) or xfailed. A test the child skipped fails here, and so does
every item of a row whose python is missing: make test installs both rows,
so a row that cannot run a test must say so.

`@pytest.mark.peer_xfail(ROW, reason=...)` makes a test a strict xfail on that
row only: it fails the day it passes, so the mark leaves with the fix.

Each module with peer tests prints, before its first test, one line per row
with that row's versions (shown with -s); a child run reports the versions
of the packages it imported, printed by the item that started it.
"""
import json, os, resource, subprocess, sys, tempfile, time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402

CHILD_ROW = os.environ.get("TXK_PEER_ROW")    # set in a child run: the row this process is
REPORT = os.environ.get("TXK_PEER_REPORT")    # where a child run writes its outcomes
LABELS = [label for label, _ in peers.peer_rows()]


def _venv(python):
    return os.path.realpath(os.path.dirname(os.path.dirname(python)))


# the row this interpreter is (None when pytest runs under another python)
IN_PROCESS = CHILD_ROW or next((label for label, py in peers.peer_rows()
                                if _venv(py) == os.path.realpath(sys.prefix)), None)


def pytest_configure(config):
    config.addinivalue_line("markers", "peer: an interop test; runs once per peer row (tests/peers.py)")
    config.addinivalue_line("markers", "peer_xfail(row, reason): strict xfail on that peer row only")


def pytest_generate_tests(metafunc):
    if CHILD_ROW is None and metafunc.definition.get_closest_marker("peer"):
        # module scope: a module's items run row by row, each row's together
        metafunc.parametrize("peer_row", LABELS, ids=LABELS, scope="module")


@pytest.fixture(autouse=True)
def peer_row():
    """The row a test runs on (a peer test's parameter; else this process' row)."""
    return IN_PROCESS


def _row(item):
    if not item.get_closest_marker("peer"):
        return None
    if CHILD_ROW:
        return CHILD_ROW
    cs = getattr(item, "callspec", None)
    return cs.params.get("peer_row") if cs else None


_peer_modules = set()


def pytest_collection_modifyitems(config, items):
    for item in items:
        row = _row(item)
        if row is None:
            continue
        _peer_modules.add(item.module.__name__)
        for m in item.iter_markers("peer_xfail"):
            if not m.args or m.args[0] not in LABELS or "reason" not in m.kwargs:
                raise pytest.UsageError(f"{item.nodeid}: peer_xfail needs a row ({', '.join(LABELS)}) and reason=")
            if m.args[0] == row and row == IN_PROCESS:
                item.add_marker(pytest.mark.xfail(reason=m.kwargs["reason"], strict=True))


@pytest.fixture(scope="module", autouse=True)
def _peer_versions(request):
    if request.module.__name__ in _peer_modules:
        for label, python in peers.peer_rows():
            if CHILD_ROW in (None, label):
                print(f"peers {label}: {peers.versions(python)}")
    yield


def _child_id(item, row):
    """The item's node id in the child run, where tests carry no row."""
    i = item.callspec.id
    rest = "" if i == row else i[len(row) + 1:] if i.startswith(row + "-") else i[:-len(row) - 1]
    base = item.nodeid[:item.nodeid.index("[")]
    return f"{base}[{rest}]" if rest else base


_children = {}
CHILD_TIMEOUT = 1800  # s, for every peer test of a session on one row


def _child_run(session, row):
    """Runs every item of the session on `row` in one child pytest of that
    row's python; {child id: outcome}, or the reason there are none."""
    if row in _children:
        return _children[row]
    python = dict(peers.peer_rows())[row]
    if not os.access(python, os.X_OK):
        _children[row] = f"row {row}: {python} is missing (scripts/deps.sh, run by make test, installs it)"
        return _children[row]
    ids = list(dict.fromkeys(_child_id(it, row) for it in session.items if _row(it) == row))
    fd, report = tempfile.mkstemp(prefix=f"txk-peer-{row}-", suffix=".json")
    os.close(fd)
    env = dict(os.environ, TXK_PEER_ROW=row, TXK_PEER_REPORT=report)
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    t0, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        r = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", peers.ROOT, *ids],
                           cwd=peers.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode("utf-8", "replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        os.unlink(report)
        _children[row] = f"row {row}: the child pytest ({python}) ran past {CHILD_TIMEOUT} s:\n{out[-6000:]}"
        return _children[row]
    try:
        with open(report) as f:
            got = json.load(f)
    except (OSError, ValueError) as e:
        got = f"row {row}: the child pytest ({python}) exited {r.returncode} with no report ({e}):\n{r.stdout[-6000:]}"
    os.unlink(report)
    if isinstance(got, dict):
        got["tail"] = r.stdout[-6000:]
        used = ", ".join(f"{k} {v}" for k, v in got["imported"].items())
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
        print(f"peers {row}: {len(ids)} tests ran in {python} ({time.time() - t0:.1f} s, {cpu:.1f} s of CPU); "
              f"imported: {used}")
    _children[row] = got
    return got


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    row = _row(pyfuncitem)
    if row is None or row == IN_PROCESS:
        return None
    got = _child_run(pyfuncitem.session, row)
    if isinstance(got, str):
        pytest.fail(got, pytrace=False)
    cid = _child_id(pyfuncitem, row)
    res = got["outcomes"].get(cid)
    if res is None:
        pytest.fail(f"row {row}: the child run did not report {cid}; its output ends:\n{got['tail']}", pytrace=False)
    if res["outcome"] == "failed":
        pytest.fail(f"on row {row} ({got['python']}):\n{res['text']}", pytrace=False)
    if res["outcome"] == "xfailed":
        pytest.xfail(res["text"])
    if res["outcome"] == "skipped":
        pytest.fail(f"row {row} skipped it: {res['text']}", pytrace=False)
    return True


# ---- in a child run: every test's outcome, for the parent ----
_outcomes = {}


def pytest_runtest_logreport(report):
    if not REPORT:
        return
    r = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "text": ""})
    if report.failed:
        r["outcome"] = "failed"
        r["text"] += f"[{report.when}] {report.longreprtext}\n" + "".join(
            f"--- {name} ---\n{content}\n" for name, content in report.sections)
    elif report.skipped and r["outcome"] != "failed":
        if hasattr(report, "wasxfail"):
            r["outcome"], r["text"] = "xfailed", report.wasxfail
        else:
            lr = report.longrepr
            r["outcome"], r["text"] = "skipped", lr[2] if isinstance(lr, tuple) else str(lr)


def pytest_sessionfinish(session):
    if REPORT:
        imported = {p: getattr(sys.modules[p], "__version__", "?") for p in peers.PACKAGES if p in sys.modules}
        with open(REPORT, "w") as f:
            json.dump({"python": sys.executable, "imported": imported, "outcomes": _outcomes}, f)
