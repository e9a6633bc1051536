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
    for sub in ("plan", "advise", "train", "data", "vocab", "mem", "keys", "kernel"):
        assert f"txk {sub}" in out
    rc, _, err = txk("frobnicate")
    assert rc == 2 and "unknown command 'frobnicate'" in err


def test_plan_seed_does_not_fit_and_says_so():
    # the seed's framework kept the L x L attention probabilities (standard attention)
    c = cfg("model: bert-base-cased\nmax_len: 512\nbatch_size: 32\nnum_labels: 2\ndevice: {gpu: t4, capacity: 7.43GiB}\n"
            "attention: standard\n")
    rc, out, _ = txk("plan", c, "--json")
    assert rc == 3
    j = json.loads(out)
    assert j["fits"] is False and j["capacity"] == 7977901752 and j["peak_reserved"] > j["capacity"]
    # each top owner's bytes split by category, summing to its total; the attention blocks hold activations
    for t in j["top"]:
        assert sum(t["by_category"].values()) == t["bytes"], t
    assert j["top"][0]["owner"].endswith("attention.self") and j["top"][0]["by_category"]["act"] > 0
    # and the tensors behind it, with their shapes: the attention probabilities, 32 x 12 heads x 512 x 512
    big = j["tensors_at_peak"][0]
    assert big["shape"] == [32, 12, 512, 512] and big["dtype"] == "f32" and big["bytes"] == 32 * 12 * 512 * 512 * 4
    assert big["owner"].endswith("attention.self") and big["category"] in ("act", "temp")
    rc, out, _ = txk("plan", c)
    assert rc == 3 and "DOES NOT FIT" in out and "Top owners at the peak" in out and "act 100%" in out
    assert "Largest tensors at the peak" in out and "f32 [32, 12, 512, 512]" in out
    assert "attention: standard (set in the config)" in out
    # an override on the command line: batch 2 at max_len 128 fits
    rc, out, _ = txk("plan", c, "batch_size=2", "max_len=128", "--json")
    assert rc == 0 and json.loads(out)["fits"] is True and json.loads(out)["batch"] == 2
    # txkernel's own default for a card: fused attention where a tensor-core kernel runs it (fp16 on a t4):
    # the plan says so and why, keeps no L x L tensor and names the kernel
    rc, out, _ = txk("plan", c, "attention=auto", "precision=fp16", "--json")
    d = json.loads(out)
    assert (d["attention"], d["attention_why"]) == ("fused", "default on cuda, fast kernel"), d
    assert not d["top"][0]["owner"].endswith("attention.self")
    assert all(t["shape"][-2:] != [512, 512] for t in d["tensors_at_peak"]), d["tensors_at_peak"]
    assert d["attention_kernel"].startswith("tensor cores, mma.sync m16n8k8 (sm75); head size 64, f16"), d
    rc, out, _ = txk("plan", c, "attention=auto", "precision=fp16")
    assert "attention: fused (default on cuda, fast kernel)" in out
    assert "attention kernel on t4: tensor cores, mma.sync m16n8k8 (sm75); head size 64, f16" in out
    # fp32: fused would run the slow reference kernel, so standard, which fits no better here (neither fits)
    rc, out, _ = txk("plan", c, "attention=auto", "--json")
    d = json.loads(out)
    assert rc == 3 and (d["attention"], d["attention_why"]) == ("standard", "default on cuda, fp32 or no fast kernel"), d
    assert d["peak_reserved"] == j["peak_reserved"]
    # unless only fused fits: then it stays fused, and the plan says so
    rc, out, _ = txk("plan", c, "attention=auto", "batch_size=16", "--json")
    d = json.loads(out)
    assert rc == 0 and (d["attention"], d["attention_why"]) == ("fused", "default on cuda, only fused fits"), d
    assert d["attention_kernel"].startswith("the reference kernel (fp32 cores): f32 tensors"), d
    rc, out, _ = txk("plan", c, "attention=standard", "batch_size=16", "--json")
    assert rc == 3 and json.loads(out)["fits"] is False


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
    # fp32 on a T4: attention: auto runs standard where it fits, else fused where that fits, so its largest
    # batch is the larger of the two attentions' (the search plans each candidate once: issue 43), with that
    # attention's peak
    each = {}
    for a in ("standard", "fused"):
        rc, out, _ = txk("plan", c, "--gpu", "t4", "--max-batch", "--json", f"attention={a}")
        assert rc == 0
        each[a] = json.loads(out)
    for i, r in enumerate(rows):
        s, f = each["standard"][i], each["fused"][i]
        best = s if s["largest batch"] >= f["largest batch"] else f
        assert (r["largest batch"], r["peak reserved"]) == (best["largest batch"], best["peak reserved"]), (r, s, f)


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
    base = ("model: bert-tiny\ninit: random\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"
            f"vocab: {DATA}/vocab_cased.txt\ntrain_file: {DATA}/reviews_train.csv\n"
            "dev_split: 0\nmax_examples: 16\nmax_len: 32\nbatch_size: 8\nmax_steps: 2\nthreads: 1\n")
    rc, out, err = txk("train", cfg(base), "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert len(rows) == 1 and rows[0]["epoch"] == 1
    rc, out, err = txk("train", cfg(base + "capacity: 5MiB\n"))
    assert rc == 3 and "stopped before allocating anything" in err


def test_advise_seed_auto_fix_writes_a_config_that_fits():
    """The seed: bert-base-cased, max_len 512, batch 32 on a 7.43 GiB card,
    with the generated reviews corpus (p99 ~172 tokens) as train_file."""
    c = cfg("model: bert-base-cased\nmax_len: 512\nbatch_size: 32\nnum_labels: 2\n"
            f"vocab: {DATA}/vocab_cased.txt\ntrain_file: {DATA}/reviews_train.csv\n"
            "device: {gpu: t4, capacity: 7.43GiB}\n")
    rc, out, _ = txk("advise", c, "--json")
    assert rc == 0, out
    j = json.loads(out)
    kinds = [d["kind"] for d in j["diagnoses"]]
    assert kinds[0] == "capacity" and "padding" in kinds
    assert j["planned"] >= 20 and j["auto"] >= 0
    rc, out, _ = txk("advise", c, "--top", "3")
    # a shell names txk's commands, never a magic
    assert rc == 0 and "does not fit" in out and "Why:" in out and f"txk advise {c} --fix" in out and "%tx" not in out
    fixed = c + ".fixed.yaml"
    rc, _, err = txk("advise", c, "--fix", "auto", "-o", fixed)
    assert rc == 0 and "wrote" in err, err
    # the written config plans under the capacity with the 5% margin, same effective batch
    rc, out, _ = txk("plan", fixed, "--json")
    assert rc == 0, out
    p = json.loads(out)
    assert p["fits"] is True and p["peak_reserved"] * 1.0 <= 0.95 * 7977901752
    text = open(fixed).read()
    import yaml
    y = yaml.safe_load(text)
    flat = {}
    for k, v in y.items():
        if isinstance(v, dict):
            flat.update(v)
        else:
            flat[k] = v
    assert flat["batch_size"] * max(1, flat.get("accumulate", 1)) == 32
    os.unlink(fixed)
    rc, _, err = txk("advise", c, "--fix", "99")
    assert rc == 2 and "candidate number" in err


def _sweep(model, batch, gpu=None, *extra):
    c = cfg(f"model: {model}\nmax_len: 512\nbatch_size: {batch}\nnum_labels: 2\n")
    args = ["plan", c, "--sweep", "--json", *extra] + (["--gpu", gpu] if gpu else [])
    rc, out, err = txk(*args)
    assert rc == 0, err
    return {r["technique"]: r for r in json.loads(out)}


DIMS = {"bert-base-cased": (12, 768, 12, 28996), "bert-large-cased": (24, 1024, 16, 28996)}


def test_sweep_techniques_match_first_principles():
    """Each technique's planned effect, against counts from first principles:
    8-bit AdamW saves ~6 bytes per parameter of optimizer state; fused
    attention removes the kept L x L probabilities (4 bytes x batch x heads x
    L^2 per layer, all layers but the one in backward at the peak); fp16
    halves activation bytes; recompute keeps only layer inputs; accumulate x4
    at a quarter of the batch keeps a quarter of the activations; frozen
    embeddings drop their gradients (4 bytes per embedding parameter)."""
    for model, batch in (("bert-base-cased", 32), ("bert-large-cased", 4)):
        L, H, heads, V = DIMS[model]
        s = _sweep(model, batch, "t4", "attention=standard")  # the card's default is fused: measure from standard
        b = s["baseline"]
        n = b["n_params"]
        act = lambda r: r["at_peak"]["act"]
        saved = b["optim_bytes"] - s["8-bit AdamW"]["optim_bytes"]
        assert 5.5 * n <= saved <= 6.5 * n, (model, saved / n)
        probs = 4 * batch * heads * 512 * 512
        drop = act(b) - act(s["fused attention"])
        assert (L - 1) * probs * 0.95 <= drop <= L * probs * 1.05, (model, drop / probs)
        assert 0.45 <= act(s["fp16"]) / act(b) <= 0.6, (model, act(s["fp16"]) / act(b))
        assert act(s["recompute layers"]) < 0.15 * act(b)
        assert 0.2 <= act(s["accumulate x4 (batch / 4)"]) / act(b) <= 0.3
        emb = (V + 512 + 2) * H + 2 * H
        assert abs((b["grad_bytes"] - s["frozen embeddings"]["grad_bytes"]) - 4 * emb) <= 0.02 * 4 * emb
        # every technique lowers the peak, and combinations lower it further
        for name, r in s.items():
            assert r["peak_reserved"] <= b["peak_reserved"], name
        assert s["fp16 + recompute + fused + 8-bit AdamW"]["peak_reserved"] < s["fp16 + recompute layers"]["peak_reserved"]
    # the seed's 7.43 GiB: the baseline does not fit, fp16 + recompute does
    base = _sweep("bert-base-cased", 32, None, "capacity=7.43GiB")
    assert not base["baseline"]["fits"] and base["fp16 + recompute layers"]["fits"]


def test_finetune_above_chance_in_under_two_minutes():
    """`txk train` on the generated 3-class reviews (chance ~0.33): bert-tiny
    from random init, the example config, timed end to end."""
    import time
    t0 = time.time()
    r = subprocess.run([TXK, "train", os.path.join("examples", "reviews_tiny.yaml"), "--json"], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    wall = time.time() - t0
    assert r.returncode == 0, r.stderr
    epochs = json.loads(r.stdout)
    assert len(epochs) == 3
    assert epochs[-1]["dev_acc"] >= 0.8, epochs
    assert wall < 120, wall


def test_train_plan_gate_and_run_time_oom_exit_statuses():
    """A run that does not fit a simulated 200 MiB: `txk train` stops before
    allocating (exit 3); with --no-plan it meets the OOM at run time and
    prints the autopsy (exit 4), naming the tensor it was allocating."""
    c = cfg(f"model: bert-tiny\ninit: random\nvocab: {DATA}/vocab_cased.txt\ntrain_file: {DATA}/reviews_train.csv\n"
            "max_len: 256\nbatch_size: 64\nmax_examples: 128\ndevice: {capacity: 200MiB}\n")
    rc, out, err = txk("train", c)
    assert rc == 3 and "stopped before allocating anything" in err, err
    rc, out, err = txk("train", c, "--no-plan")
    assert rc == 4, (out, err)
    first = out.splitlines()[0]
    assert "tried to allocate" in first and "f32 [" in first and "Top owners:" in out, out
    rc, out, err = txk("train", c, "--no-plan", "--json")
    assert rc == 4 and json.loads(out)["tensor"].startswith("f32 [")


def test_advise_without_a_capacity_says_so():
    c = cfg("model: bert-base-cased\nmax_len: 512\nbatch_size: 32\nnum_labels: 2\n")
    rc, out, err = txk("advise", c, "--top", "3")
    assert rc == 0, err
    assert "no capacity to fit against" in out and "does not fit" not in out and "0 bytes available" not in out
    rc, _, err = txk("advise", c, "--fix")
    # the option table's one wording for a flag without its value (issue 39)
    assert rc == 2 and "--fix needs a value (--fix N|auto)" in err, err


def test_data_reads_squad_question_context_pairs():
    rc, out, err = txk("data", os.path.join(DATA, "squad_train.json"), "--vocab", os.path.join(DATA, "vocab_cased.txt"),
                       "--json")
    assert rc == 0, err
    j = json.loads(out)
    assert j["column"] == "question + context" and j["examples"] == 2000
    # every pair has at least [CLS] q [SEP] c [SEP] and the percentiles are ordered
    assert j["min"] >= 5 and j["p50"] <= j["p99"] <= j["max"]
    assert j["pct_truncated"]["512"] <= j["pct_truncated"]["128"] <= j["pct_truncated"]["64"]
    # a CSV still needs its column
    rc, _, err = txk("data", os.path.join(DATA, "reviews_train.csv"), "--text", "nope")
    assert rc == 1 and "no column 'nope'" in err


def test_plan_epoch_plans_the_runs_reserved_peak():
    """`txk plan --epoch`: the example config for 12 steps in 2 GiB. The default
    plan (the worst-case batch) reserves 169,869,312 B; the run's dynamic
    batches leave 190,840,832 B reserved (test_plan_epoch.c trains it); the
    epoch plan says so, with every:1 it is the default's again."""
    ex = os.path.join(ROOT, "examples", "reviews_tiny.yaml")
    got = {}
    for flag in ("", "--epoch"):
        for ec in ("never", "every:1"):
            r = subprocess.run([TXK, "plan", ex, "max_steps=12", "capacity=2GiB", "empty_cache=" + ec, "--json"]
                               + ([flag] if flag else []), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            got[flag, ec] = json.loads(r.stdout)
    assert got["", "never"]["peak_reserved"] == 169869312
    assert got["", "every:1"]["peak_reserved"] == 169869312
    assert got["--epoch", "never"]["peak_reserved"] == 190840832
    assert got["--epoch", "every:1"]["peak_reserved"] == 169869312
    assert got["--epoch", "never"]["epoch_steps"] == 12
    assert "epoch_steps" not in got["", "never"]
    assert all(p["peak_allocated"] == 147975680 for p in got.values())
    rc, out, err = txk("plan", ex, "max_steps=12", "--epoch")
    assert rc == 0 and "Plan of the first epoch as the run makes it: 12 steps" in out, out + err


def tiny_cfg(**over):
    kv = dict(model="bert-tiny", init="random", hidden=32, layers=1, heads=2, intermediate=64,
              vocab=os.path.join(DATA, "vocab_cased.txt"), train_file=os.path.join(DATA, "reviews_train.csv"),
              dev_split=0, max_examples=16, max_len=32, batch_size=8, max_steps=1, device="cpu")
    kv.update(over)
    return cfg("".join(f"{k}: {v}\n" for k, v in kv.items()))


def test_errors_name_the_key_and_the_folder():
    # a missing train_file names the key as well as the file
    rc, _, err = txk("plan", tiny_cfg(train_file="no_such_train.csv"))
    assert rc == 1 and "train_file: no_such_train.csv: cannot open: No such file or directory" in err, err
    # a CSV without the label column: the file, the column, the columns it has and label_col:
    d = tempfile.mkdtemp()
    bad = os.path.join(d, "nolabel.csv")
    with open(bad, "w") as f:
        f.write("text,sentiment\ngood,pos\nbad,neg\n")
    rc, _, err = txk("train", tiny_cfg(train_file=bad))
    assert rc == 1 and "nolabel.csv: no column 'label' for the label (columns: text, sentiment; set label_col:" in err
    # a mistyped model folder is no such folder, with the near one
    os.makedirs(os.path.join(d, "out", "reviews"))
    rc, _, err = txk("predict", os.path.join(d, "out", "review"), "--input", os.path.join(DATA, "reviews_dev.csv"))
    assert rc == 1 and "out/review: no such folder" in err and "did you mean " + os.path.join(d, "out", "reviews") in err
    assert "cannot read the config" not in err


def test_train_says_which_device_and_warns_of_the_default_lr_from_random_weights():
    rc, _, err = txk("train", tiny_cfg(gpu="t4"))
    assert rc == 0, err
    assert "training on the cpu (device: cpu" in err and "gpu: t4 is the planning profile" in err, err
    assert "warning: lr: 2e-05 is the default" in err, err
    rc, _, err = txk("train", tiny_cfg(lr="2e-3"))
    assert rc == 0 and "training on the cpu" in err and "warning: lr:" not in err, err
