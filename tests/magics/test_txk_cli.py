"""`txk` from a shell: the same plans and reports as the magics, text or
--json, and exit statuses a script can branch on (0 fits / 3 does not fit /
1 config error / 2 usage)."""
import json, os, subprocess, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data")


def txk(*args):
    r = subprocess.run([TXK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def cfg(text):
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text)
    f.close()
    return f.name


def test_help_lists_every_subcommand():
    rc, out, _ = txk("--help")
    assert rc == 0
    for sub in ("plan", "train", "data", "vocab", "mem", "keys", "kernel"):
        assert f"txk {sub}" in out
    rc, _, err = txk("frobnicate")
    assert rc == 2 and "unknown command 'frobnicate'" in err


def test_plan_seed_does_not_fit_and_says_so():
    c = cfg("model: bert-base-cased\nmax_len: 512\nbatch_size: 32\nnum_labels: 2\ndevice: {gpu: t4, capacity: 7.43GiB}\n")
    rc, out, _ = txk("plan", c, "--json")
    assert rc == 3
    j = json.loads(out)
    assert j["fits"] is False and j["capacity"] == 7977901752 and j["peak_reserved"] > j["capacity"]
    rc, out, _ = txk("plan", c)
    assert rc == 3 and "DOES NOT FIT" in out and "Top owners at the peak" in out
    # an override on the command line: batch 2 at max_len 128 fits
    rc, out, _ = txk("plan", c, "batch_size=2", "max_len=128", "--json")
    assert rc == 0 and json.loads(out)["fits"] is True and json.loads(out)["batch"] == 2


def test_config_errors_name_file_line_and_key():
    c = cfg("model: bert-tiny\nbatchsize: 8\n")
    rc, _, err = txk("plan", c)
    assert rc == 1 and f"{c}:2: unknown key 'batchsize' (did you mean 'batch_size'?)" in err
    c = cfg("model: bert-tiny\n")
    rc, _, err = txk("plan", c, "precision=fp8")
    assert rc == 1 and "precision: 'fp8' is not one of fp32, fp16, bf16" in err
    rc, _, err = txk("plan", c, "--frob")
    assert rc == 2


def test_max_batch_table():
    c = cfg("model: bert-base-cased\nnum_labels: 2\n")
    rc, out, _ = txk("plan", c, "--gpu", "t4", "--max-batch", "--json")
    assert rc == 0
    rows = json.loads(out)
    assert [r["max_len"] for r in rows] == [64, 128, 256, 384, 512]
    assert rows[0]["largest batch"] >= rows[-1]["largest batch"] >= 1


def test_data_and_keys_and_mem():
    rc, out, _ = txk("data", os.path.join(DATA, "reviews_train.csv"), "--vocab",
                     os.path.join(DATA, "vocab_cased.txt"), "--max-len", "128", "--json")
    assert rc == 0
    j = json.loads(out)
    assert j["examples"] > 100 and j["p50"] <= j["p90"] <= j["p99"] <= j["max"]
    assert [p["batching"] for p in j["padding"]] == ["fixed", "dynamic", "buckets"]
    assert j["padding"][1]["waste"] <= j["padding"][0]["waste"]
    rc, out, _ = txk("keys")
    assert rc == 0 and out.startswith("model ") and "batch_size" in out
    rc, out, _ = txk("mem", "--capacity", "800MiB", "--json")
    assert rc == 0
    j = json.loads(out)
    assert j["device"]["simulated"] is True and j["memory"]["capacity"] == 800 * 2**20


def test_train_tiny_then_planned_oom():
    base = ("model: bert-tiny\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"
            f"vocab: {DATA}/vocab_cased.txt\ntrain_file: {DATA}/reviews_train.csv\n"
            "dev_split: 0\nmax_examples: 16\nmax_len: 32\nbatch_size: 8\nmax_steps: 2\nthreads: 1\n")
    rc, out, err = txk("train", cfg(base), "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert len(rows) == 1 and rows[0]["epoch"] == 1
    rc, out, err = txk("train", cfg(base + "capacity: 5MiB\n"))
    assert rc == 3 and "stopped before allocating anything" in err
