"""`txk VERB ... --json` and the txkernel kernel's `%txVERB --json` give the
same JSON for the same config, every field but timings (issue 39, step 4;
tests/companion/test_one_request.py holds the same in the companion). Done
for plan, train, advise and data (app/data.c: both doors call tk_app_data);
predict, mem and device are not in the table yet."""
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
