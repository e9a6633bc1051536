"""`txk VERB ... --json` and the txkernel kernel's `%txVERB --json` give the
same JSON for the same config, every field but timings (issue 39, step 4;
tests/companion/test_one_request.py holds the same in the companion), for
every verb both doors have: plan, train, advise, data, predict (a trained
folder, flags, a config whose output_dir holds it), mem (a PyTorch snapshot
read with each flag row; a live device is a shell's fresh one and a
session's own, not one request) and device (before a run: the process'
RSS and the in-process holder left out, they are each process' own)."""
import json, os, subprocess, sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
import txk_util as u  # noqa: E402

TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data")
TINY = (f"model: bert-tiny\ninit: random\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"
        f"vocab: {DATA}/vocab_cased.txt\ntrain_file: {DATA}/reviews_train.csv\ndev_split: 0\nmax_examples: 16\n"
        "max_len: 32\nbatch_size: 8\nmax_steps: 1\nlr: 2e-3\ndevice: cpu\n")
CONFIGS = ["", "batching: dynamic\n", "gpu: t4\n", "capacity: 4MiB\n"]
TIMINGS = ("plan_ms", "samples_per_s", "seconds", "ms")


def untimed(j):
    if isinstance(j, dict):
        return {k: untimed(v) for k, v in j.items() if k not in TIMINGS}
    if isinstance(j, list):
        return [untimed(v) for v in j]
    return j


@pytest.fixture(scope="module")
def kernel():
    km, kc = u.start()
    yield kc
    u.stop(km, kc)


def cell_json(kc, code):
    reply, outs = u.run_cell(kc, code, timeout=300)
    js = [o["content"]["data"]["application/json"] for o in outs
          if "application/json" in (o["content"].get("data") or {})]
    assert js, (reply["content"], outs)
    return js[-1]


@pytest.mark.parametrize("verb", ["plan", "train", "advise"])
@pytest.mark.parametrize("extra", CONFIGS)
def test_shell_and_kernel_json_agree(kernel, tmp_path, verb, extra):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY + extra)
    sh = subprocess.run([TXK, verb, str(cfg), "--json"], capture_output=True, text=True, timeout=300)
    assert sh.returncode in (0, 3), sh.stderr
    u.run_cell(kernel, "%txreset", timeout=60)
    if verb == "advise":  # the cell advises the session's config: plan it first, as a notebook does
        u.run_cell(kernel, f"%txplan --file {cfg}", timeout=300)
        code = "%txadvise --json"
    else:
        code = f"%tx{verb} --file {cfg} --json"
    assert untimed(json.loads(sh.stdout)) == untimed(cell_json(kernel, code))


# `txk data FILE FLAGS --json` and `%txdata FILE FLAGS --json` (a fresh session: no config to default from)
DATA_ROWS = [f"{DATA}/reviews_train.csv --vocab {DATA}/vocab_cased.txt",
             f"{DATA}/reviews_train.csv --vocab {DATA}/vocab_cased.txt --max-len 64 --batch 4",
             f"{DATA}/squad_train.json --vocab {DATA}/vocab_cased.txt --max-len 128"]


@pytest.mark.parametrize("words", DATA_ROWS)
def test_data_shell_and_kernel_json_agree(kernel, words):
    sh = subprocess.run([TXK, "data", *words.split(), "--json"], capture_output=True, text=True, timeout=300)
    assert sh.returncode == 0, sh.stderr
    u.run_cell(kernel, "%txreset", timeout=60)
    assert untimed(json.loads(sh.stdout)) == untimed(cell_json(kernel, f"%txdata {words} --json"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained into a folder, its config, and a plan snapshot."""
    d = tmp_path_factory.mktemp("parity")
    cfg = d / "c.yaml"
    cfg.write_text(TINY + f"output_dir: {d}/model\n")
    r = subprocess.run([TXK, "train", str(cfg)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    snap = d / "plan.pickle"
    r = subprocess.run([TXK, "plan", str(cfg), "--snapshot", str(snap)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {"model": str(d / "model"), "cfg": str(cfg), "snap": str(snap)}


PREDICT_ROWS = ["{model} --input " + DATA + "/reviews_dev.csv",
                "{model} --input " + DATA + "/reviews_dev.csv --rows 3 --label label max_len=16",
                "{cfg} --input " + DATA + "/reviews_dev.csv --rows 0"]
MEM_ROWS = ["--snapshot {snap}", "--snapshot {snap} --gpu t4 --top 3",
            "--snapshot {snap} --capacity 64MiB --batch 8 --seq 32"]


@pytest.mark.parametrize("verb,words", [("predict", w) for w in PREDICT_ROWS] + [("mem", w) for w in MEM_ROWS])
def test_predict_and_mem_shell_and_kernel_json_agree(kernel, trained, verb, words):
    words = words.format(**trained)
    sh = subprocess.run([TXK, verb, *words.split(), "--json"], capture_output=True, text=True, timeout=300)
    assert sh.returncode == 0, sh.stderr
    u.run_cell(kernel, "%txreset", timeout=60)
    assert untimed(json.loads(sh.stdout)) == untimed(cell_json(kernel, f"%tx{verb} {words} --json"))


OWN = ("host_rss", "in_process", "holder")  # each process' own: its RSS, what PyTorch in it holds


def test_device_shell_and_kernel_json_agree(kernel):
    sh = subprocess.run([TXK, "device", "--json"], capture_output=True, text=True, timeout=60)
    assert sh.returncode == 0, sh.stderr
    u.run_cell(kernel, "%txreset", timeout=60)
    cell = cell_json(kernel, "%txdevice --json")
    mine = {k: v for k, v in json.loads(sh.stdout).items() if k not in OWN}
    assert mine == {k: v for k, v in cell.items() if k not in OWN} and "kind" in mine
