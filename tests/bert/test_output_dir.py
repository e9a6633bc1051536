"""What a plan and a run do to output_dir (issue 28).

- Planning writes nothing the user owns: a model trained with a learned
  vocabulary into X is byte for byte the same after `txk plan`, `txk advise`,
  `%%txplan`, `%txadvise` and `%txfix` (no --run) of a config naming X as
  output_dir with another train_file, and predicts with the same accuracy; a
  plan whose output_dir does not exist leaves it not existing.
- A run never ends "ok" without its results: output_dir's parents are
  created as `mkdir -p` does; an output_dir that cannot be made stops before
  training, non-zero, naming the path; a save that fails mid-run stops the
  run there, non-zero, naming the path, and keeps the last good checkpoint.

- Nothing overwrites a model this run did not make (issue 35): a folder
  holding a transformers Trainer's model and checkpoints is refused by
  `txk train` and `%%txtrain`, naming the files and leaving them byte for
  byte; with `overwrite: true` the run goes there, its rotation removes only
  its own checkpoints, and resume_from: auto says why it passes over the
  Trainer's.

Root ignores permission bits, so "unwritable" is made two ways: a parent
that is a regular file (as root), and a read-only parent for the
unprivileged user `nobody` (setpriv), when setpriv is there.
"""
import glob, hashlib, json, os, resource, shutil, subprocess, sys, tempfile, time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data")
sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
import txk_util as u  # noqa: E402

TMP = tempfile.mkdtemp(prefix="tk_output_dir_")
os.chmod(TMP, 0o755)
# learned vocabularies go to the user's cache: this test's own, and the
# kernel started below inherits it
os.environ["XDG_CACHE_HOME"] = os.path.join(TMP, "cache")


def yaml(**kv):
    return "".join(f"{k}: {json.dumps(v) if isinstance(v, str) else v}\n" for k, v in kv.items())


def tiny(**over):
    """A 1-layer, 32-wide BERT with no vocab: key, so the run learns one."""
    cfg = dict(model="bert-tiny", init="random", hidden=32, layers=1, heads=2, intermediate=64, vocab_size=400,
               train_file=os.path.join(DATA, "reviews_train.csv"), dev_file=os.path.join(DATA, "reviews_dev.csv"),
               max_examples=1024, max_len=64, batch_size=32, epochs=2, lr=2e-3, seed=1, device="cpu")
    cfg.update(over)
    return {k: v for k, v in cfg.items() if v is not None}


def write_cfg(name, **kv):
    p = os.path.join(TMP, name)
    with open(p, "w") as f:
        f.write(yaml(**kv))
    return p


def txk(*args, env=None, preexec=None, timeout=180):
    r = subprocess.run([TXK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
                       env=env, preexec_fn=preexec)
    return r.returncode, r.stdout, r.stderr


def tree_hashes(d):
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            st = os.lstat(p)
            key = os.path.relpath(p, d)
            if os.path.isdir(p):
                out[key] = ("dir", st.st_mode)
            else:
                with open(p, "rb") as f:
                    out[key] = ("file", hashlib.sha256(f.read()).hexdigest(), st.st_mtime_ns)
    return out


def accuracy(model_dir):
    rc, out, err = txk("predict", model_dir, "--input", os.path.join(DATA, "reviews_dev.csv"), "--rows", "0", "--json")
    assert rc == 0, err
    return json.loads(out)["accuracy"]


@pytest.fixture(scope="module")
def trained():
    x = os.path.join(TMP, "X")
    c = write_cfg("learn.yaml", **tiny(output_dir=x))
    rc, out, err = txk("train", c)
    assert rc == 0, err
    assert "vocabulary: learned from" in err, err
    assert os.path.isfile(os.path.join(x, "vocab.txt")) and os.path.isfile(os.path.join(x, "model.safetensors"))
    return x, accuracy(x)


def other_data_cfg(name, out_dir):
    # another corpus: a vocabulary learned from it differs from X's
    return write_cfg(name, **tiny(output_dir=out_dir, train_file=os.path.join(DATA, "fortunes.csv"), dev_file=None,
                                  dev_split=0.1))


def test_txk_plan_and_advise_leave_the_trained_model_alone(trained):
    x, acc = trained
    before = tree_hashes(x)
    c = other_data_cfg("other.yaml", x)
    rc, out, err = txk("plan", c)
    assert rc == 0, err
    rc, out, err = txk("advise", c)
    assert rc in (0, 3), err
    assert tree_hashes(x) == before
    assert accuracy(x) == acc


def test_plans_in_the_kernel_leave_the_trained_model_alone(trained):
    x, acc = trained
    before = tree_hashes(x)
    km, kc = u.start()
    try:
        cell = "%%txplan\n" + yaml(**tiny(output_dir=x, train_file=os.path.join(DATA, "fortunes.csv"), dev_file=None,
                                          dev_split=0.1, gpu="t4"))
        reply, outs = u.run_cell(kc, cell, timeout=120)
        assert reply["content"]["status"] == "ok", outs
        reply, outs = u.run_cell(kc, "%txadvise", timeout=120)
        assert reply["content"]["status"] == "ok", outs
        reply, outs = u.run_cell(kc, "%txfix 1", timeout=120)
        # with nothing to fix %txfix may refuse; either way it must write nothing
        missing = os.path.join(TMP, "never", "made")
        cell = "%%txplan\n" + yaml(**tiny(output_dir=missing))
        reply, outs = u.run_cell(kc, cell, timeout=120)
        assert reply["content"]["status"] == "ok", outs
        assert not os.path.exists(os.path.join(TMP, "never"))
    finally:
        u.stop(km, kc)
    assert tree_hashes(x) == before
    assert accuracy(x) == acc


def test_a_plan_creates_no_output_dir():
    missing = os.path.join(TMP, "nope", "deeper")
    c = write_cfg("missing.yaml", **tiny(output_dir=missing))
    for cmd in ("plan", "advise"):
        rc, _, err = txk(cmd, c)
        assert rc in (0, 3), err
        assert not os.path.exists(os.path.join(TMP, "nope")), cmd


def test_train_creates_output_dir_and_its_parents():
    out = os.path.join(TMP, "A", "B", "C")
    c = write_cfg("abc.yaml", **tiny(max_examples=64, dev_file=None, dev_split=0.25,
                                     vocab=os.path.join(DATA, "vocab_uncased.txt"), vocab_size=None))
    rc, _, err = txk("train", c, f"output_dir={out}")
    assert rc == 0, err
    for f in ("model.safetensors", "config.json", "vocab.txt"):
        assert os.path.isfile(os.path.join(out, f)), f
    assert glob.glob(os.path.join(out, "checkpoint-*", "trainer_state.json"))


def test_output_dir_under_a_file_stops_before_training():
    f = os.path.join(TMP, "a_file")
    open(f, "w").close()
    c = write_cfg("under_file.yaml", **tiny(max_examples=64, vocab=os.path.join(DATA, "vocab_uncased.txt"),
                                            vocab_size=None))
    rc, out, err = txk("train", c, f"output_dir={f}/B/C")
    assert rc == 1
    assert f"{f}/B/C" in err and "Not a directory" in err and "nothing was trained" in err, err
    assert "epoch 1/1" not in err and "Per epoch" not in out


@pytest.mark.skipif(not shutil.which("setpriv"), reason="setpriv is not installed: no unprivileged user to run as")
def test_read_only_parent_stops_before_training_as_an_unprivileged_user():
    home = os.path.join(TMP, "nobody")
    os.makedirs(os.path.join(home, "ro"))
    os.chown(home, 65534, 65534)
    os.chmod(os.path.join(home, "ro"), 0o555)  # root's: nobody cannot write it
    c = write_cfg("ro.yaml", **tiny(max_examples=64, vocab=os.path.join(DATA, "vocab_uncased.txt"), vocab_size=None))
    os.chmod(c, 0o644)
    out_dir = os.path.join(home, "ro", "run")
    env = dict(os.environ, HOME=home, XDG_CACHE_HOME=os.path.join(home, "cache"))
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", TXK, "train", c,
                        f"output_dir={out_dir}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120, env=env)
    assert r.returncode == 1, r.stderr
    assert out_dir in r.stderr and "Permission denied" in r.stderr and "nothing was trained" in r.stderr, r.stderr
    assert not os.path.exists(out_dir)


def test_a_save_that_fails_mid_run_stops_it_and_keeps_the_last_checkpoint():
    """checkpoint-2 is saved; then the run's file-size limit drops to 4 KiB
    (prlimit on the running process, as a full disk would), so the next save
    fails with EFBIG: the run stops there, non-zero, naming the checkpoint
    and the file, and checkpoint-2 is still complete."""
    out_dir = os.path.join(TMP, "midrun")
    c = write_cfg("midrun.yaml", **tiny(max_examples=None, max_steps=60, save_every=2, keep_checkpoints=0,
                                        vocab=os.path.join(DATA, "vocab_uncased.txt"), vocab_size=None,
                                        output_dir=out_dir))
    env = dict(os.environ, TXK_TEST_SAVE_DELAY_MS="50")
    p = subprocess.Popen([TXK, "train", c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    t0 = time.time()
    while not os.path.isdir(os.path.join(out_dir, "checkpoint-2")) and p.poll() is None and time.time() - t0 < 60:
        time.sleep(0.005)
    assert p.poll() is None, "the run ended before its first checkpoint"
    resource.prlimit(p.pid, resource.RLIMIT_FSIZE, (4096, 4096))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    assert "not saved (earlier checkpoints kept)" in err and "File too large" in err and out_dir in err, err
    assert "trained " not in out
    kept = sorted(glob.glob(os.path.join(out_dir, "checkpoint-*")))
    assert kept and not glob.glob(os.path.join(out_dir, ".checkpoint-*.tmp"))
    # the newest kept checkpoint is complete: a run resumes from it
    rc, _, err2 = txk("train", c, "resume_from=auto")
    assert rc == 0, err2
    assert "resumed from" in err2, err2


# ---- another model's folder (issue 35) --------------------------------------------------------------------------

# What a transformers Trainer leaves in its output_dir: checkpoint-500 and checkpoint-1000 as _save_checkpoint
# writes them (the model as save_pretrained writes it, optimizer.pt, scheduler.pt, rng_state.pth, the
# TrainerState's own trainer_state.json, training_args.bin), then save_model's config.json, model.safetensors
# and training_args.bin. Written by the torch2 row's transformers and torch; its TrainingArguments needs
# accelerate, which the row lacks, so training_args.bin pickles the arguments as a dict.
TRAINER = r'''
import os, sys
import torch
from transformers import BertConfig, BertForSequenceClassification
from transformers.trainer_callback import TrainerState
out = sys.argv[1]
torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=8, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=16,
                                                 max_position_embeddings=16))
args = {"output_dir": out, "save_steps": 500, "report_to": []}
opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
for step in (500, 1000):
    d = os.path.join(out, f"checkpoint-{step}")
    model.save_pretrained(d)
    torch.save(opt.state_dict(), os.path.join(d, "optimizer.pt"))
    torch.save(sched.state_dict(), os.path.join(d, "scheduler.pt"))
    torch.save({"cpu": torch.random.get_rng_state()}, os.path.join(d, "rng_state.pth"))
    TrainerState(global_step=step, max_steps=1000, save_steps=500, epoch=step / 500).save_to_json(
        os.path.join(d, "trainer_state.json"))
    torch.save(args, os.path.join(d, "training_args.bin"))
model.save_pretrained(out)
torch.save(args, os.path.join(out, "training_args.bin"))
'''
FOREIGN = ("checkpoint-1000", "checkpoint-500", "config.json", "model.safetensors", "training_args.bin")


@pytest.fixture(scope="module")
def trainer_results():
    t2 = os.path.join(ROOT, ".venv-t2", "bin", "python")
    assert os.path.exists(t2), "the torch2 row (.venv-t2) is missing: it writes the Trainer's folder"
    d = os.path.join(TMP, "trainer_results")
    r = subprocess.run([t2, "-c", TRAINER, d], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(d)) == sorted(FOREIGN)
    return d


def small_run(**over):
    return tiny(max_examples=128, epochs=1, vocab=os.path.join(DATA, "vocab_uncased.txt"), vocab_size=None, **over)


def test_training_into_another_models_folder_is_refused(trainer_results):
    """txk train and %%txtrain into a Trainer's ./results: refused before
    training, non-zero (an error in the kernel), every file named, the
    folder byte for byte as it was (nothing added either)."""
    before = tree_hashes(trainer_results)
    c = write_cfg("foreign.yaml", **small_run(output_dir=trainer_results))
    rc, out, err = txk("train", c)
    assert rc != 0, out
    assert all(f in err for f in FOREIGN) and "overwrite: true" in err and "Nothing was trained" in err, err
    assert "epoch 1/1" not in err and "Per epoch" not in out
    km, kc = u.start()
    try:
        reply, outs = u.run_cell(kc, "%%txtrain\n" + yaml(**small_run(output_dir=trainer_results)), timeout=120)
    finally:
        u.stop(km, kc)
    assert reply["content"]["status"] == "error", outs
    assert all(f in reply["content"]["evalue"] for f in FOREIGN), reply["content"]
    assert tree_hashes(trainer_results) == before


def test_overwrite_trains_there_and_rotation_keeps_the_trainers_checkpoints(trainer_results):
    """overwrite: true writes the run there; rotation (keep_checkpoints: 1)
    removes only txkernel's own checkpoints, the Trainer's two stay byte
    for byte; the folder is marked txkernel's, so a run goes on in it, and
    resume_from: auto says why it passes over the Trainer's checkpoints."""
    d = os.path.join(TMP, "trainer_results_overwritten")
    shutil.copytree(trainer_results, d)
    theirs = {k: v for k, v in tree_hashes(d).items() if k.startswith("checkpoint-")}
    c = write_cfg("overwrite.yaml", **small_run(output_dir=d, overwrite=True, save_every=2, keep_checkpoints=1))
    rc, out, err = txk("train", c)
    assert rc == 0, err
    after = tree_hashes(d)
    assert {k: v for k, v in after.items() if k in theirs} == theirs
    ours = sorted(n for n in os.listdir(d) if n.startswith("checkpoint-") and n not in ("checkpoint-500", "checkpoint-1000"))
    assert ours == ["checkpoint-4"], ours
    assert os.path.isfile(os.path.join(d, "txkernel_output.json"))
    assert accuracy(d) >= 0  # the model there is this run's, and predicts
    c2 = write_cfg("overwrite_resume.yaml", **small_run(output_dir=d, save_every=2, keep_checkpoints=1,
                                                        resume_from="auto"))
    rc, out, err = txk("train", c2)
    assert rc == 0, err
    for step in (500, 1000):
        assert f"passing over checkpoint-{step}: another trainer's checkpoint" in err, err
    assert f"resumed from {d}/checkpoint-4" in err, err
    assert {k: v for k, v in tree_hashes(d).items() if k in theirs} == theirs
