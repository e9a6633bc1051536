"""Issue 39: a flag means the same in a shell, a cell and the companion.

- `%txadvise --api loop` is taken in the companion (it was refused:
  "expected key=value, got 'loop'");
- after `%txplan --torch-model m --batch 16 --seq 512 --gpus colab`,
  `%txadvise` advises for colab's smallest card (T4) and says so, never for
  the CPU, and offers no bf16 (a T4 has no bf16 tensor cores); `%txfix`
  follows it; after `--gpu P` the same for P;
- the companion's own flags come from the engine's one option table;
- `--snapshot` on plan and train and `--file` work in the shell and in a
  cell, and write the same figures;
- `txk plan` and `txk train` of one config name the same attention (and
  why) and capacity.

The companion runs in-process (IPython's InteractiveShell, this row's torch
and transformers) against this worktree's build, as test_torch_model_plan.py
does; the shell is this build's txk."""
import json, os, re, subprocess, sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
TXK = os.path.join(BUILD, "txk")
LIB = os.path.join(BUILD, "libtxk.so")

TINY = """model: bert-tiny
init: random
hidden: 32
layers: 1
heads: 2
intermediate: 64
vocab: {root}/tests/data/vocab_cased.txt
train_file: {root}/tests/data/reviews_train.csv
dev_split: 0
max_examples: 16
max_len: 32
batch_size: 8
max_steps: 1
lr: 2e-3
device: cpu
"""


@pytest.fixture(scope="module")
def shell():
    assert os.path.exists(LIB), f"{LIB} is missing: make build/libtxk.so"
    os.environ.setdefault("TXK_ENGINE_LIB", LIB)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from IPython.testing.globalipapp import get_ipython
    ip = get_ipython()
    ip.run_line_magic("load_ext", "txkernel")
    ip.run_cell("import torch\nfrom transformers import BertConfig, BertForSequenceClassification\n"
                "torch.manual_seed(0)\n"
                "model = BertForSequenceClassification(BertConfig(vocab_size=30522, hidden_size=256, "
                "num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, num_labels=2))\n", silent=True)
    return ip


def outputs(ip, line, cell=None, name=None):
    """(bundles shown, stdout) of one magic."""
    from IPython.utils.capture import capture_output
    with capture_output() as cap:
        if cell is None:
            r = ip.run_line_magic(name or line.split()[0], " ".join(line.split()[1:]))
        else:
            r = ip.run_cell_magic(name or line.split()[0], " ".join(line.split()[1:]), cell)
    bundles = [o.data for o in cap.outputs] + ([r._repr_mimebundle_()[0]] if r is not None else [])
    return bundles, cap.stdout


def last_json(bundles):
    js = [b["application/json"] for b in bundles if "application/json" in b]
    assert js, bundles
    return js[-1]


def bf16(advice):
    return [c["label"] for c in advice["candidates"] if "bf16" in c["label"]]


def test_api_loop_is_taken(shell):
    outputs(shell, "txplan --torch-model model --batch 8 --seq 128 --gpu t4")
    advice = last_json(outputs(shell, "txadvise --api loop --json")[0])
    assert advice["api"] == "loop", advice


def test_gpus_platform_is_remembered(shell):
    outputs(shell, "txplan --torch-model model --batch 16 --seq 512 --gpus colab")
    bundles, _ = outputs(shell, "txadvise")
    text = "".join(b.get("text/plain", "") for b in bundles)
    assert "Advised for t4, the smallest card colab hands out" in text, text
    assert "no capacity to fit against" not in text, text
    advice = last_json(outputs(shell, "txadvise --json")[0])
    assert advice["run"]["card"] == "t4" and advice["run"]["platform"] == "colab", advice["run"]
    assert advice["capacity"] > 0 and not bf16(advice), (advice["capacity"], bf16(advice))
    fix = last_json(outputs(shell, "txfix 1 --json")[0])
    assert "gpu" not in fix["diff"] and "bf16" not in fix["label"], fix


def test_named_card(shell):
    outputs(shell, "txplan --torch-model model --batch 16 --seq 512 --gpu t4")
    advice = last_json(outputs(shell, "txadvise --json")[0])
    assert advice["run"]["card"] == "t4" and not bf16(advice)
    outputs(shell, "txplan --torch-model model --batch 16 --seq 512 --gpu a100-40")
    advice = last_json(outputs(shell, "txadvise --json")[0])
    assert advice["run"]["card"] == "a100-40"


def test_companion_flags_are_the_engines():
    """The companion's %txplan flags are the option table's (one source)."""
    os.environ.setdefault("TXK_ENGINE_LIB", LIB)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from txkernel import torch_model
    from txkernel._engine import options
    table = {o["name"] for o in options() if any("companion" in u["doors"] and "plan" in u["verbs"]
                                                   for u in o["uses"])}
    assert {"--torch-model", "--trainer", "--batch", "--seq", "--gpu", "--gpus", "--precision", "--optimizer",
            "--json", "--show-config", "--device", "--loss", "--checkpointing", "--trace"} == table
    assert set(torch_model._flags()) == table
    opts = torch_model.parse(["--torch-model", "m", "--batch", "4", "--gpus", "colab", "--json"])
    assert opts["model"] == "m" and opts["batch"] == "4" and opts["gpus"] == "colab" and opts["json"] is True
    # the traced route (issue 41) reads the same table: its own flags, and the shared ones
    from txkernel import trace_plan
    opts = trace_plan.parse(["--torch-model", "clf.bert", "--loss", "mse", "--checkpointing", "on", "--device",
                             "cpu", "--batch", "2"])
    assert opts["model"] == "clf.bert" and opts["loss"] == "mse" and opts["checkpointing"] == "on"
    assert opts["device"] == "cpu" and opts["batch"] == "2"
    with pytest.raises(torch_model.PlanArgsError, match="--show-config"):
        trace_plan.parse(["--torch-model", "clf", "--show-config"])
    with pytest.raises(torch_model.PlanArgsError, match="unexpected '--bogus'"):
        trace_plan.parse(["--torch-model", "clf", "--bogus"])


def txk(*args, cwd=None):
    return subprocess.run([TXK, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def figures(said):
    """The byte counts of a snapshot sentence, without its path."""
    m = re.search(r"written to \S+: (.*)", said)
    assert m, said
    return m.group(1).strip()


def test_snapshot_and_file_both_ways(shell, tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY.format(root=ROOT))
    # --file in the shell is the config word
    a, b = txk("plan", str(cfg)), txk("plan", "--file", str(cfg))
    untimed = lambda t: re.sub(r"in [0-9.]+ ms", "in - ms", t)  # noqa: E731 (the plan's own time)
    assert a.returncode == 0 and b.returncode == 0 and untimed(a.stdout) == untimed(b.stdout), (a.stderr, b.stderr)
    # plan --snapshot: the shell and a cell write the same figures
    sh = txk("plan", "--file", str(cfg), "--snapshot", str(tmp_path / "p1.pickle"))
    assert sh.returncode == 0 and (tmp_path / "p1.pickle").stat().st_size > 0, sh.stderr
    _, out = outputs(shell, f"txplan --file {cfg} --snapshot {tmp_path / 'p2.pickle'}")
    assert (tmp_path / "p2.pickle").stat().st_size > 0, out
    assert figures(sh.stderr) == figures(out), (sh.stderr, out)
    # train --snapshot: the shell and a cell, the same run, the same figures
    sh = txk("train", str(cfg), "--snapshot", str(tmp_path / "t1.pickle"))
    assert sh.returncode == 0 and (tmp_path / "t1.pickle").stat().st_size > 0, sh.stderr
    shell.run_line_magic("txreset", "")
    _, out = outputs(shell, f"txtrain --file {cfg} --snapshot {tmp_path / 't2.pickle'}")
    assert (tmp_path / "t2.pickle").stat().st_size > 0, out
    said_sh = [ln for ln in sh.stderr.splitlines() if "snapshot written" in ln][-1]
    said_cell = [ln for ln in out.splitlines() if "snapshot written" in ln][-1]
    assert figures(said_sh) == figures(said_cell), (said_sh, said_cell)


@pytest.mark.parametrize("extra", ["capacity: 4MiB\n", "capacity: 4MiB\nattention: fused\n",
                                   "gpu: t4\ncapacity: 36MiB\n", "device: auto\ncapacity: 4MiB\n"])
def test_plan_and_train_name_the_same_attention_and_capacity(tmp_path, extra):
    """A run that stops at its plan prints the plan it made: the same
    attention, reason and capacity as `txk plan` of the config."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY.format(root=ROOT).replace("device: cpu\n", "") + extra)
    plan = txk("plan", str(cfg), "--json")
    train = txk("train", str(cfg), "--json")
    assert plan.returncode == 3 and train.returncode == 3, (plan.stderr, train.stderr)
    p, t = json.loads(plan.stdout), json.loads(train.stdout)
    for k in ("attention", "attention_why", "capacity"):
        assert p[k] == t[k], (k, p[k], t[k])
    assert p["run"]["attention"] == p["attention"] and p["run"]["capacity"] == p["capacity"], p["run"]


TIMINGS = ("plan_ms", "samples_per_s", "seconds", "step_gflop_s", "ms")


def untimed_json(j):
    """The JSON without timings, which no two runs share."""
    if isinstance(j, dict):
        return {k: untimed_json(v) for k, v in j.items() if k not in TIMINGS}
    if isinstance(j, list):
        return [untimed_json(v) for v in j]
    return j


@pytest.mark.parametrize("extra", ["", "batching: dynamic\n", "gpu: t4\n"])
def test_plan_and_train_json_are_the_same_both_ways(shell, tmp_path, extra):
    """`txk plan/train CFG --json` and `%txplan/%%txtrain --file CFG --json`
    give the same JSON but for timings (step 4 for plan and train)."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY.format(root=ROOT) + extra)
    sh = txk("plan", str(cfg), "--json")
    assert sh.returncode == 0, sh.stderr
    shell.run_line_magic("txreset", "")
    cell = last_json(outputs(shell, f"txplan --file {cfg} --json")[0])
    assert untimed_json(json.loads(sh.stdout)) == untimed_json(cell)
    sh = txk("train", str(cfg), "--json")
    assert sh.returncode == 0, sh.stderr
    shell.run_line_magic("txreset", "")
    cell = last_json(outputs(shell, f"txtrain --file {cfg} --json")[0])
    assert untimed_json(json.loads(sh.stdout)) == untimed_json(cell)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained into a folder by txk, its config, and a plan snapshot."""
    d = tmp_path_factory.mktemp("parity")
    cfg = d / "tiny.yaml"
    cfg.write_text(TINY.format(root=ROOT) + f"output_dir: {d}/model\n")
    r = txk("train", str(cfg))
    assert r.returncode == 0, r.stderr
    snap = d / "plan.pickle"
    r = txk("plan", str(cfg), "--snapshot", str(snap))
    assert r.returncode == 0, r.stderr
    return {"model": str(d / "model"), "cfg": str(cfg), "snap": str(snap), "data": f"{ROOT}/tests/data"}


# every verb the companion has beside plan and train: `txk VERB WORDS --json` == `%txVERB WORDS --json`
VERB_ROWS = [("predict", "{model} --input {data}/reviews_dev.csv"),
             ("predict", "{model} --input {data}/reviews_dev.csv --rows 3 --label label max_len=16"),
             ("predict", "{cfg} --input {data}/reviews_dev.csv --rows 0"),
             ("mem", "--snapshot {snap}"), ("mem", "--snapshot {snap} --gpu t4 --top 3"),
             ("mem", "--snapshot {snap} --capacity 64MiB --batch 8 --seq 32"),
             ("data", "{data}/reviews_train.csv --vocab {data}/vocab_cased.txt --max-len 64 --batch 4"),
             ("data", "{data}/squad_train.json --vocab {data}/vocab_cased.txt --max-len 128")]


@pytest.mark.parametrize("verb,words", VERB_ROWS)
def test_every_verb_json_is_the_same_both_ways(shell, trained, verb, words):
    """Step 4 for predict, mem (a snapshot read) and data in the companion."""
    words = words.format(**trained)
    sh = txk(verb, *words.split(), "--json")
    assert sh.returncode == 0, sh.stderr
    shell.run_line_magic("txreset", "")
    cell = last_json(outputs(shell, f"tx{verb} {words} --json")[0])
    assert untimed_json(json.loads(sh.stdout)) == untimed_json(cell)


def test_device_json_is_the_same_both_ways(shell):
    """`txk device --json` and `%txdevice --json` before a run, but for what is
    each process' own: its RSS and what PyTorch in it holds."""
    own = ("host_rss", "in_process", "holder")
    sh = txk("device", "--json")
    assert sh.returncode == 0, sh.stderr
    shell.run_line_magic("txreset", "")
    cell = last_json(outputs(shell, "txdevice --json")[0])
    mine = {k: v for k, v in json.loads(sh.stdout).items() if k not in own}
    assert mine == {k: v for k, v in cell.items() if k not in own} and "kind" in mine


@pytest.mark.parametrize("extra", ["", "gpu: t4\n", "capacity: 4MiB\n"])
def test_advise_json_is_the_same_both_ways(shell, tmp_path, extra):
    """`txk advise CFG --json` and `%txadvise --json` after `%txplan --file
    CFG` (the cell advises the session's config, as a notebook does)."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY.format(root=ROOT) + extra)
    sh = txk("advise", str(cfg), "--json")
    assert sh.returncode == 0, sh.stderr
    shell.run_line_magic("txreset", "")
    outputs(shell, f"txplan --file {cfg}")
    cell = last_json(outputs(shell, "txadvise --json")[0])
    assert untimed_json(json.loads(sh.stdout)) == untimed_json(cell)
