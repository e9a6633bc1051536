"""A clone of the repository alone is the whole project (issue 42): no tracked
file reads or cites a path outside the checkout (the workplace's shared
folder), and every document a source comment cites by a docs/ or tests/data/
path exists in the repository."""
import os, re, subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS = os.path.relpath(os.path.abspath(__file__), ROOT)


def tracked():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, stdout=subprocess.PIPE, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def text(path):
    try:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return None


OUTSIDE = re.compile(r'\.\./shared|/work/shared|"\.\.", "shared"')
CITED = re.compile(r'\b((?:docs|tests/data)/[A-Za-z0-9_./-]+\.(?:md|txt|json|jsonl|csv|pickle|xz|log))')


def test_nothing_outside_the_checkout():
    bad = []
    for p in tracked():
        if p == THIS:
            continue
        t = text(p)
        if t is None:
            continue
        for n, line in enumerate(t.splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{p}:{n}: {line.strip()[:120]}")
    assert not bad, "files that reach outside the repository:\n" + "\n".join(bad)


def test_cited_documents_exist():
    missing = []
    for p in tracked():
        if not p.endswith((".c", ".h", ".cu", ".cuh", ".py", ".sh", ".mk", "Makefile", ".md")):
            continue
        t = text(p)
        if t is None:
            continue
        for m in CITED.finditer(t):
            cited = m.group(1).rstrip(".")
            if "*" in cited or "ROW" in cited or "no_such" in cited:  # globs, templates, error tests
                continue
            if not os.path.exists(os.path.join(ROOT, cited)):
                missing.append(f"{p}: {cited}")
    assert not missing, "cited documents not in the repository:\n" + "\n".join(sorted(set(missing)))
