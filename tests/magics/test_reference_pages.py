"""docs/reference/{cli,magics,config}.md are what `make docs` writes from the
option table and the config key table (`txk options`, issue 39): a flag or
key changed without regenerating the pages fails here, and every flag the
table gives `txk VERB` is one `txk VERB` takes (the parser is the table)."""
import json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")


def test_pages_are_generated_from_the_tables(tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_reference.py"), TXK, str(tmp_path)],
                   check=True, capture_output=True)
    for name in ("cli.md", "magics.md", "config.md"):
        with open(os.path.join(ROOT, "docs", "reference", name), encoding="utf-8") as f:
            assert f.read() == (tmp_path / name).read_text(), f"docs/reference/{name} is stale: run make docs"


def test_help_lists_the_tables_flags():
    data = json.loads(subprocess.run([TXK, "options"], capture_output=True, text=True, check=True).stdout)
    names = {o["name"] for o in data["options"]}
    assert {"--api", "--snapshot", "--file", "--gpus", "--torch-model"} <= names
    assert {k["key"] for k in data["keys"]} >= {"model", "batch_size", "max_len", "gpu", "capacity"}
    out = subprocess.run([TXK, "--help"], capture_output=True, text=True).stdout
    plan = next(ln for ln in out.splitlines() if ln.startswith("  txk plan "))
    for o in data["options"]:
        shell_plan = any("plan" in u["verbs"] and "shell" in u["doors"] for u in o["uses"])
        assert (f"[{o['name']}" in plan) == shell_plan, (o["name"], plan)


def test_magic_usage_lines_are_the_tables():
    """Every tx magic's help (what %txhelp, ?name and the companion show) has
    no hand-written flag list left: its usage lines name each flag the table
    gives its verb in a cell, and no flag the table does not give it."""
    lib = os.path.join(os.path.dirname(TXK), "libtxk.so")
    code = ("import importlib, json, sys; sys.path.insert(0, sys.argv[1]); "
            "E = importlib.import_module('txkernel._engine'); print(json.dumps(E.Engine().magics()))")
    out = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "python")], capture_output=True, text=True,
                         env=dict(os.environ, TXK_ENGINE_LIB=lib), check=True).stdout
    helps = {m["name"]: m["help"] for m in json.loads(out.strip().splitlines()[-1])}
    opts = json.loads(subprocess.run([TXK, "options"], capture_output=True, text=True, check=True).stdout)["options"]
    for verb in ("plan", "train", "advise", "fix", "predict", "data", "mem", "device"):
        usage = helps[f"tx{verb}"].split("\n\n")[0]
        assert "{flags}" not in usage, usage
        for o in opts:
            takes = any(verb in u["verbs"] and "cell" in u["doors"] for u in o["uses"])
            if takes:
                assert f"[{o['name']}" in usage, (verb, o["name"], usage)
