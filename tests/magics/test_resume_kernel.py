"""A %%txtrain run survives a kernel restart, as it would a Colab disconnect:
the cell (with `resume_from: auto`, as a user would leave it) is interrupted
once a checkpoint exists, the kernel is restarted (killed and started again),
and the same cell run again goes on from the newest checkpoint, shows the
ends with the weights of the same config
trained without interruption (`txk train`), bit for bit. A new run into
that folder is told it holds checkpoints and how to resume."""
import json, os, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
import txk_util as u  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data")


def config(out_dir):
    cfg = {"model": "bert-tiny", "init": "random", "hidden": 32, "layers": 1, "heads": 2, "intermediate": 64,
           "vocab": os.path.join(DATA, "vocab_cased.txt"),
           "train_file": os.path.join(DATA, "reviews_train.csv"),
           "dev_split": 0.2, "max_examples": 80, "max_len": 32, "batch_size": 8, "epochs": 3,
           "dropout": 0.1, "seed": 5, "threads": 1, "device": "cpu",
           "save_every": 3, "keep_checkpoints": 2, "resume_from": "auto", "output_dir": out_dir}
    return "".join(f"{k}: {json.dumps(v) if isinstance(v, str) else v}\n" for k, v in cfg.items())


def read(path):
    with open(path, "rb") as f:
        return f.read()


def texts(outs):
    got = []
    for o in outs:
        c = o["content"]
        if o["msg_type"] == "stream":
            got.append(c["text"])
        for v in (c.get("data") or {}).values():
            if isinstance(v, str):
                got.append(v)
    return "\n".join(got)


def test_interrupt_restart_resume_equals_uninterrupted():
    top = tempfile.mkdtemp(prefix="txk-resume-")
    out_dir, ref_dir = os.path.join(top, "run"), os.path.join(top, "ref")
    cfg_path = os.path.join(top, "cfg.yaml")
    with open(cfg_path, "w") as f:
        f.write(config(ref_dir))
    r = subprocess.run([os.path.join(ROOT, "build", "txk"), "train", cfg_path, "--no-plan"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    want = read(os.path.join(ref_dir, "model.safetensors"))

    cell = "%%txtrain\n" + config(out_dir)
    # slow saves, so the interrupt lands while the run is still going
    os.environ["TXK_TEST_SAVE_DELAY_MS"] = "150"
    try:
        km, kc = u.start()
    finally:
        del os.environ["TXK_TEST_SAVE_DELAY_MS"]
    try:
        msg_id = kc.execute(cell)
        deadline = time.time() + 120
        while not os.path.isdir(os.path.join(out_dir, "checkpoint-3")):
            assert time.time() < deadline, "no checkpoint after 120 s"
            time.sleep(0.02)
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "error"
        assert not os.path.exists(os.path.join(out_dir, "checkpoint-24")), "the run finished before the interrupt"

        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=30)
        reply, outs = u.run_cell(kc, cell, timeout=120)
        said = texts(outs)
        assert reply["content"]["status"] == "ok", said
        assert "resumed from " + os.path.join(out_dir, "checkpoint-") in said, said
        assert read(os.path.join(out_dir, "model.safetensors")) == want

        # a new run into the same folder is told that it holds checkpoints
        fresh = "%%txtrain max_steps=1\n" + config(out_dir).replace('resume_from: "auto"\n', "")
        reply, outs = u.run_cell(kc, fresh, timeout=120)
        said = texts(outs)
        assert reply["content"]["status"] == "ok", said
        assert "already holds" in said and "resume_from: auto" in said, said
    finally:
        u.stop(km, kc)
        subprocess.run(["rm", "-rf", top])
