"""The kill campaign: `txk train` on a tiny config (checkpoint every 2 of 16
steps, dropout on) is killed with SIGKILL at 20 seeded random moments, each
run followed by the same command with `resume_from: auto`. Every time the
newest complete checkpoint is the one resumed (none passed over as damaged),
and the final weights equal the uninterrupted run's bit for bit.

TXK_TEST_SAVE_DELAY_MS makes each save sleep between its files, so a good
share of the kills land inside a save; a kill counts as inside a save when it
left a .checkpoint-N.tmp folder behind. The count is printed."""
import glob, os, random, re, shutil, signal, subprocess, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TXK = os.path.join(ROOT, "build", "txk")

CONFIG = """model: bert-tiny
init: random
vocab: tests/data/vocab_uncased.txt
hidden: 32
heads: 2
intermediate: 64
train_file: tests/data/reviews_train.csv
dev_file: tests/data/reviews_dev.csv
text_col: text
label_col: label
max_examples: 64
max_len: 32
batching: dynamic
batch_size: 8
eval_batch_size: 64
epochs: 2
lr: 2e-3
warmup_ratio: 0.1
dropout: 0.1
seed: 3
threads: 1
device: cpu
save_every: 2
keep_checkpoints: 2
resume_from: auto
"""

KILLS = 20
DELAY_MS = "8"


def train(cfg, out):
    return [TXK, "train", cfg, "output_dir=" + out, "--no-plan"]


def steps_in(out):
    return sorted(int(m.group(1)) for d in os.listdir(out) if (m := re.fullmatch(r"checkpoint-(\d+)", d)))


def weights(out):
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        return f.read()


def test_kill_campaign():
    assert os.access(TXK, os.X_OK), "build/txk first"
    top = tempfile.mkdtemp(prefix="txk-kill-")
    cfg = os.path.join(top, "tiny.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    env = dict(os.environ, TXK_TEST_SAVE_DELAY_MS=DELAY_MS)

    ref = os.path.join(top, "whole")
    t0 = time.time()
    r = subprocess.run(train(cfg, ref), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    whole_s = time.time() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no checkpoint in" in r.stdout + r.stderr
    want = weights(ref)

    rng = random.Random(16)
    killed = in_save = resumed = 0
    for i in range(KILLS):
        out = os.path.join(top, "run%02d" % i)
        p = subprocess.Popen(train(cfg, out), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 0.9 * whole_s))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.wait()
        os.makedirs(out, exist_ok=True)
        if glob.glob(os.path.join(out, ".checkpoint-*.tmp")):
            in_save += 1
        have = steps_in(out)
        r = subprocess.run(train(cfg, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
        said = r.stdout + r.stderr
        assert r.returncode == 0, "run %d: %s" % (i, said)
        assert "passing over" not in said, "run %d: a checkpoint was damaged: %s" % (i, said)
        if have:
            assert "resumed from %s/checkpoint-%d:" % (out, have[-1]) in said, "run %d: %s" % (i, said)
            resumed += 1
        else:
            assert "no checkpoint in" in said, "run %d: %s" % (i, said)
        assert weights(out) == want, "run %d (killed with checkpoints %s): final weights differ" % (i, have)
    print("kill campaign: %d runs, %d killed, %d kills inside a save, %d resumed from a checkpoint, "
          "the rest started afresh; final weights equal the uninterrupted run's every time"
          % (KILLS, killed, in_save, resumed))
    assert killed >= KILLS * 3 // 4
    assert in_save >= 3, "only %d kills landed inside a save" % in_save
    subprocess.run(["rm", "-rf", top])


def test_resume_from_the_last_steps_checkpoint_closes_the_epoch():
    """A kill between the save at the run's last step (or an epoch's last
    step) and the epoch's end leaves a checkpoint with no step left in its
    epoch: the resumed run still owes that epoch's dev eval, its history row
    and the model folder, and must give the uninterrupted run's weights. (The
    campaign above met it by chance: the resumed run ended without writing
    model.safetensors.)"""
    top = tempfile.mkdtemp(prefix="txk-lastckpt-")
    cfg = os.path.join(top, "tiny.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG.replace("keep_checkpoints: 2", "keep_checkpoints: 8"))
    ref = os.path.join(top, "whole")
    r = subprocess.run(train(cfg, ref), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert steps_in(ref)[-1] == 16 and 8 in steps_in(ref)
    for step in (16, 8):  # the run's last step; the first epoch's last step
        out = os.path.join(top, "from%d" % step)
        os.makedirs(out)
        shutil.copytree(os.path.join(ref, "checkpoint-%d" % step), os.path.join(out, "checkpoint-%d" % step))
        r = subprocess.run(train(cfg, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
        said = r.stdout + r.stderr
        assert r.returncode == 0 and "resumed from %s/checkpoint-%d:" % (out, step) in said, said
        assert os.path.exists(os.path.join(out, "model.safetensors")), "step %d: no model folder: %s" % (step, said)
        assert weights(out) == weights(ref), "step %d: final weights differ" % step
        rows = [l.split()[0] for l in said.split("Per epoch", 1)[1].splitlines() if l.strip()[:1].isdigit()]
        assert rows == ["1", "2"], "step %d: %s" % (step, said)
    subprocess.run(["rm", "-rf", top])
