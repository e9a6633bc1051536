"""Data parallelism on the cpu (issue 27): `txk train` with world_size 2
starts two MPI ranks (mpirun) and, with dropout 0, ends with the same
weights, bit for bit, as world_size 1 with accumulate 2 on the same data
and seed, for zero 0, 1 and 2. Gradient clipping is on and binding
(max_grad_norm 0.05), so the sharded gradient norm of zero 1 and 2 is
checked too. The launcher says the global batch."""
import os, subprocess, tempfile

import pytest

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
max_examples: 96
max_len: 32
batching: dynamic
batch_size: 8
eval_batch_size: 64
epochs: 1
lr: 2e-3
max_grad_norm: 0.05
dropout: 0.0
seed: 5
threads: 1
device: cpu
"""


def env():
    e = dict(os.environ)
    e["OMP_WAIT_POLICY"] = "passive"
    return e


def run(cfg, out, *kv, timeout=120):
    p = subprocess.run([TXK, "train", cfg, "output_dir=" + out, "--no-plan", *kv], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def weights(out):
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def cfg():
    assert os.access(TXK, os.X_OK), "build/txk first"
    d = tempfile.mkdtemp(prefix="txk-dp-")
    path = os.path.join(d, "cfg.yaml")
    with open(path, "w") as f:
        f.write(CONFIG)
    return d, path


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_two_ranks_equal_accumulate_two(cfg, zero):
    d, path = cfg
    one = os.path.join(d, f"w1z{zero}")
    two = os.path.join(d, f"w2z{zero}")
    run(path, one, "accumulate=2", f"zero={zero}")
    p = run(path, two, "world_size=2", f"zero={zero}")
    assert "global batch 16" in p.stderr, p.stderr
    assert weights(one) == weights(two), f"zero {zero}: world_size 2 != accumulate 2"
    # the run moved the weights at all (a step that changed nothing would pass the equality)
    if zero == 0:
        untrained = os.path.join(d, "w0")
        run(path, untrained, "max_steps=1", "lr=1e-12")
        assert weights(untrained) != weights(one)


def session_pids(sid):
    """Processes still alive in session sid (zombies excluded)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(d))
    return out


def rank_pid(sid, rank):
    for pid in session_pids(sid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env_ = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env_ and b"train" in cmd:
            return pid
    return None


def test_killed_rank_is_named_and_resume_is_exact(cfg):
    """SIGKILL on rank 1 mid-run: the run ends within 30 s with an error
    naming rank 1 and nothing of it left running; `resume_from: auto` then
    ends with the uninterrupted 2-rank run's weights, its zero 1 state
    having been saved whole (consolidated) by rank 0."""
    import signal, time
    d, path = cfg
    kv = ["world_size=2", "zero=1", "save_every=2", "max_examples=192", "resume_from=auto"]
    ref = os.path.join(d, "kill_ref")
    run(path, ref, *kv)
    out = os.path.join(d, "kill_run")
    e = env()
    e["TXK_TEST_SAVE_DELAY_MS"] = "150"  # slower saves: the kill lands mid-run
    p = subprocess.Popen([TXK, "train", path, "output_dir=" + out, "--no-plan", *kv], cwd=ROOT, env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.time()
        while not os.path.isdir(os.path.join(out, "checkpoint-4")) and time.time() - t0 < 60 and p.poll() is None:
            time.sleep(0.02)
        victim = rank_pid(p.pid, 1)
        assert victim and p.poll() is None, "the run ended before the kill"
        os.kill(victim, signal.SIGKILL)
        t_kill = time.time()
        _, err = p.communicate(timeout=30)
        took = time.time() - t_kill
        print(f"rank 1 killed: the run ended {took:.2f} s later, status {p.returncode}")
        assert p.returncode != 0
        assert "rank 1" in err, err
        t1 = time.time()
        while session_pids(p.pid) and time.time() - t1 < 5:
            time.sleep(0.05)
        assert session_pids(p.pid) == [], "processes of the run left running"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    r = run(path, out, *kv)
    assert "resumed from" in r.stderr, r.stderr
    assert weights(out) == weights(ref)
    # the consolidated state equals the one world_size 1 (accumulate 2) keeps
    one = os.path.join(d, "kill_one")
    run(path, one, "accumulate=2", "zero=1", "save_every=2", "max_examples=192")
    last = max(int(x.split("-")[1]) for x in os.listdir(one) if x.startswith("checkpoint-"))
    with open(os.path.join(one, f"checkpoint-{last}", "optimizer.safetensors"), "rb") as f1, \
         open(os.path.join(ref, f"checkpoint-{last}", "optimizer.safetensors"), "rb") as f2:
        assert f1.read() == f2.read()
