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
    """The pid of MPI rank `rank` in session sid (None if it does not show
    within 2 s)."""
    import time
    t0 = time.time()
    while time.time() - t0 < 2:
        pid = find_rank(sid, rank)
        if pid:
            return pid
        time.sleep(0.02)
    return None


def find_rank(sid, rank):
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


def interrupted_run(path, out, kv, ckpt, act):
    """Starts `txk train` (its own session), waits for checkpoint `ckpt`,
    calls act(launcher_pid), waits for the run to end (30 s at most) and
    checks nothing of it is left running: (status, stderr, seconds from
    act to the end)."""
    import signal, time
    e = env()
    # slow saves (every 2 steps): the run is still going, seconds of it,
    # when act lands after the checkpoint it waited for, however idle the machine
    e["TXK_TEST_SAVE_DELAY_MS"] = "300"
    p = subprocess.Popen([TXK, "train", path, "output_dir=" + out, "--no-plan", *kv], cwd=ROOT, env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.time()
        while not os.path.isdir(os.path.join(out, ckpt)) and time.time() - t0 < 60 and p.poll() is None:
            time.sleep(0.02)
        assert p.poll() is None, "the run ended before the interrupt"
        act(p.pid)
        t_act = time.time()
        _, err = p.communicate(timeout=30)
        took = time.time() - t_act
        t1 = time.time()
        while session_pids(p.pid) and time.time() - t1 < 5:
            time.sleep(0.05)
        assert session_pids(p.pid) == [], "processes of the run left running"
        return p.returncode, err, took
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_killed_rank_is_named_and_resume_is_exact(cfg):
    """SIGKILL on rank 1 mid-run: the run ends within 30 s with an error
    naming rank 1 and nothing of it left running; `resume_from: auto` then
    ends with the uninterrupted 2-rank run's weights, its zero 1 state
    having been saved whole (consolidated) by rank 0."""
    import signal
    d, path = cfg
    kv = ["world_size=2", "zero=1", "save_every=2", "max_examples=192", "resume_from=auto"]
    ref = os.path.join(d, "kill_ref")
    run(path, ref, *kv)
    out = os.path.join(d, "kill_run")

    def kill_rank1(sid):
        victim = rank_pid(sid, 1)
        assert victim, "rank 1 not found"
        os.kill(victim, signal.SIGKILL)

    rc, err, took = interrupted_run(path, out, kv, "checkpoint-4", kill_rank1)
    print(f"rank 1 killed: the run ended {took:.2f} s later, status {rc}")
    assert rc != 0
    assert "rank 1" in err, err
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


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_each_rank_measured_peak_equals_its_plan(cfg, zero):
    """Each rank's allocator peak (allocated and reserved) over the run
    equals the plan the run made of that rank on meta, byte for byte
    (fixed-shape batches, as the planner's worst case)."""
    import re
    d, path = cfg
    p = run(path, os.path.join(d, f"peak{zero}"), "world_size=2", f"zero={zero}", "batching=fixed")
    got = {int(m.group(1)): tuple(map(int, m.groups()[1:])) for m in re.finditer(
        r"rank (\d+): peak (\d+) B allocated, (\d+) B reserved; planned for this rank (\d+) B, (\d+) B", p.stderr)}
    assert sorted(got) == [0, 1], p.stderr
    for r, (alloc, res, palloc, pres) in got.items():
        assert (alloc, res) == (palloc, pres), f"rank {r}: measured {alloc}/{res}, planned {palloc}/{pres}"


def plan_json(*kv):
    import json
    cfg = os.path.join(tempfile.mkdtemp(prefix="txk-dp-plan-"), "bb.yaml")
    with open(cfg, "w") as f:
        f.write("model: bert-base-cased\ninit: random\nmax_len: 512\nbatch_size: 8\nnum_labels: 2\n")
    p = subprocess.run([TXK, "plan", cfg, *kv, "--json"], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_plan_bert_base_t4_two_ranks_by_zero():
    """bert-base, 512 tokens, batch 8, fp32 AdamW on gpu: t4, world_size 2,
    planned per rank: zero 0 - zero 1 is half of AdamW's two moments (4 bytes
    x parameters: each rank keeps half of the 8), zero 1 - zero 2 is about
    half the gradients (less one backward stage's full gradients, which ZeRO
    2 holds while that stage runs). The top level is the largest rank's."""
    p = [plan_json("gpu=t4", "world_size=2", f"zero={z}") for z in (0, 1, 2)]
    n = p[0]["n_trainable"]
    for j in p:
        assert j["world_size"] == 2 and len(j["ranks"]) == 2
        assert j["peak_allocated"] == max(r["peak_allocated"] for r in j["ranks"])
        assert j["peak_reserved"] == max(r["peak_reserved"] for r in j["ranks"])
        assert j["comm_bytes_per_step"] > 4 * n * 0.9  # the gradients cross once at least
    for r in range(2):
        d01 = p[0]["ranks"][r]["peak_allocated"] - p[1]["ranks"][r]["peak_allocated"]
        d12 = p[1]["ranks"][r]["peak_allocated"] - p[2]["ranks"][r]["peak_allocated"]
        print(f"rank {r}: zero0 - zero1 = {d01} B = {d01 / (4 * n):.3f} x (4 B x {n} params); "
              f"zero1 - zero2 = {d12} B = {d12 / (2 * n):.3f} x half the gradients")
        assert 0.95 <= d01 / (4 * n) <= 1.06
        assert 0.8 <= d12 / (2 * n) <= 1.0


def test_resume_on_another_world_size_keeps_the_global_batch(cfg):
    """A 2-rank zero 1 checkpoint resumes on one process with accumulate 2
    (the same global batch; the state was saved whole) and ends on the
    uninterrupted 2-rank run's weights bit for bit; accumulate 1 there is
    refused, saying what to set."""
    import shutil
    d, path = cfg
    kv = ["zero=1", "save_every=2"]
    ref = os.path.join(d, "cross_ref")
    run(path, ref, "world_size=2", *kv)
    out = os.path.join(d, "cross_one")
    os.makedirs(out)
    shutil.copytree(os.path.join(ref, "checkpoint-2"), os.path.join(out, "checkpoint-2"))
    p = subprocess.run([TXK, "train", path, "output_dir=" + out, "--no-plan", "accumulate=1", *kv,
                        "resume_from=" + os.path.join(out, "checkpoint-2")], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "accumulate x world_size = 2" in p.stderr, p.stderr
    r = run(path, out, "accumulate=2", *kv, "resume_from=auto")
    assert "resumed from" in r.stderr and "step 2 of" in r.stderr, r.stderr
    assert weights(out) == weights(ref)


def test_interrupt_stops_every_rank_at_one_step(cfg):
    """SIGINT to `txk train` (what Ctrl-C and the kernel send) reaches every
    rank through mpirun as SIGUSR1; the ranks agree on the step, rank 0
    says which and where the last checkpoint is, the run exits 130 and
    nothing of it is left running; the checkpoint then resumes."""
    import signal
    d, path = cfg
    out = os.path.join(d, "interrupted")
    kv = ["world_size=2", "zero=2", "save_every=2", "max_examples=192", "resume_from=auto"]
    rc, err, _ = interrupted_run(path, out, kv, "checkpoint-2", lambda pid: os.kill(pid, signal.SIGINT))
    assert rc == 130, err
    assert "interrupted after step" in err and "the 2 ranks stopped after the same step" in err, err
    r = run(path, out, *kv)
    assert "resumed from" in r.stderr, r.stderr


def test_oom_on_a_rank_ends_every_rank_with_its_autopsy(cfg):
    """A rank out of device memory (22 MiB against the plan's 24 MiB
    reserved, --no-plan) prints its autopsy under its rank and ends the run
    for every rank (MPI_Abort), exit status 4, nothing left running."""
    import time
    d, path = cfg
    p = subprocess.Popen([TXK, "train", path, "output_dir=" + os.path.join(d, "oom"), "--no-plan", "world_size=2",
                          "zero=1", "capacity=22MiB"], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 4, out + err
    assert "Out of device memory" in out and ("rank 0:" in out or "rank 1:" in out), out
    # mpirun's own words ("MPI_ABORT was invoked on rank N") are not always
    # printed whole (its show_help channel can fail as the job ends); the
    # status and the autopsy are the run's
    t1 = time.time()
    while session_pids(p.pid) and time.time() - t1 < 5:
        time.sleep(0.05)
    assert session_pids(p.pid) == []


def test_hung_rank_ends_the_run_in_bounded_time(cfg):
    """A rank that stops answering (SIGSTOP: hung, not dead, so mpirun sees
    nothing) makes the others' next collective give up after
    TXK_COLL_TIMEOUT_S (3 s here; 600 by default) with an error saying
    which rank waited and why; that rank ends the run (MPI_Abort), the
    stopped one included, nothing left running."""
    import signal
    d, path = cfg
    old = os.environ.get("TXK_COLL_TIMEOUT_S")
    os.environ["TXK_COLL_TIMEOUT_S"] = "3"
    try:
        rc, err, took = interrupted_run(path, os.path.join(d, "hung"),
                                        ["world_size=2", "zero=1", "save_every=2", "max_examples=192"],
                                        "checkpoint-2", lambda sid: os.kill(rank_pid(sid, 1), signal.SIGSTOP))
    finally:
        if old is None:
            del os.environ["TXK_COLL_TIMEOUT_S"]
        else:
            os.environ["TXK_COLL_TIMEOUT_S"] = old
    print(f"rank 1 stopped: the run ended {took:.2f} s later, status {rc}")
    assert rc != 0 and took < 30
    assert "rank 0 waited" in err and "hung or stopped" in err, err
