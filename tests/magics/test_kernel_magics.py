"""The txkernel magics through a real kernel (jupyter_client over ZeroMQ):
20 run-time OOM-and-retry cycles with memory back at the baseline and
kernel_info answered after each; an interrupt during %%txtrain stops within a
step and leaves a checkpoint that loads; a plan that does not fit never
allocates on the device. Uses a 1-layer, 32-wide BERT so each run takes well
under a second on the CPU."""
import glob, json, os, sys, tempfile, time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
import txk_util as u  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data")


def tiny(**over):
    cfg = {"model": "bert-tiny", "init": "random", "hidden": 32, "layers": 1, "heads": 2, "intermediate": 64,
           "vocab": os.path.join(DATA, "vocab_cased.txt"),
           "train_file": os.path.join(DATA, "reviews_train.csv"),
           "dev_split": 0, "max_examples": 16, "max_len": 32, "batch_size": 8, "max_steps": 2,
           "device": "cpu"}
    cfg.update(over)
    return "".join(f"{k}: {json.dumps(v) if isinstance(v, str) else v}\n" for k, v in cfg.items())


@pytest.fixture(scope="module")
def kernel():
    km, kc = u.start()
    yield km, kc
    u.stop(km, kc)


def run(kc, code, timeout=120):
    reply, outs = u.run_cell(kc, code, timeout=timeout)
    return reply["content"], outs


def errors(outs):
    return [o["content"] for o in outs if o["msg_type"] == "error"]


def bundle_json(data):
    """The machine-readable part of a bundle: application/json (--json) or
    the application/vnd.txkernel.<what>+json a notebook gets otherwise."""
    if "application/json" in data:
        return data["application/json"]
    for k, v in data.items():
        if k.startswith("application/vnd.txkernel.") and k.endswith("+json"):
            return v
    return None


def last_json(outs):
    found = None
    for o in outs:
        j = bundle_json(o["content"].get("data") or {})
        if j is not None:
            found = j
    return found


def mem(kc):
    reply, outs = run(kc, "%txmem --json")
    assert reply["status"] == "ok"
    return last_json(outs)


def kernel_info_ok(kc):
    msg_id = kc.kernel_info()
    rep = kc.get_shell_msg(timeout=10)
    while rep["parent_header"].get("msg_id") != msg_id:
        rep = kc.get_shell_msg(timeout=10)
    return rep["content"]["status"] == "ok"


def test_plan_that_does_not_fit_allocates_nothing(kernel):
    _, kc = kernel
    run(kc, "%txreset")
    reply, outs = run(kc, "%%txtrain capacity=5MiB\n" + tiny())
    assert reply["status"] == "error"
    errs = errors(outs)
    assert len(errs) == 1 and errs[0]["ename"] == "OutOfMemoryPlanned"
    plan = last_json(outs)
    assert plan["fits"] is False and plan["peak_reserved"] > 5 * 2**20
    m = mem(kc)
    assert m["n_alloc"] == 0 and m["allocated"] == 0 and m["reserved"] == 0


def test_twenty_oom_and_retry_cycles(kernel):
    _, kc = kernel
    run(kc, "%txreset")
    baseline = None
    for cycle in range(20):
        reply, outs = run(kc, "%%txtrain capacity=21MiB --no-plan\n" + tiny())
        assert reply["status"] == "error", cycle
        errs = errors(outs)
        assert len(errs) == 1 and errs[0]["ename"] == "OutOfMemoryError"
        ev = errs[0]["evalue"]
        for what in ("tried to allocate", "Capacity 21.00 MiB", "free", "allocated", "reserved",
                     "largest free block", "Top owners:"):
            assert what in ev, (what, ev)
        m = mem(kc)
        if baseline is None:
            baseline = m["allocated"]
        assert m["allocated"] == baseline == 0
        assert m["n_ooms"] >= 1  # the retry opens an unlimited device, so the count restarts
        assert kernel_info_ok(kc)
        # the retry: the same model without the simulated limit trains
        reply, outs = run(kc, "%%txtrain max_steps=1\n" + tiny())
        assert reply["status"] == "ok", errors(outs)
        result = [o for o in outs if o["msg_type"] == "execute_result"][-1]["content"]["data"]["application/vnd.txkernel.result+json"]
        assert result["steps"] == 1 and result["allocated_after"] == 0
        assert mem(kc)["allocated"] == baseline
        assert kernel_info_ok(kc)


def test_interrupt_stops_within_a_step_and_keeps_checkpoint(kernel):
    km, kc = kernel
    out_dir = tempfile.mkdtemp(prefix="txk-ckpt-")
    code = "%%txtrain\n" + tiny(max_steps=0, epochs=100000, max_examples=64, output_dir=out_dir)
    msg_id = kc.execute(code)
    deadline = time.time() + 120
    while not glob.glob(os.path.join(out_dir, "**", "model.safetensors"), recursive=True):
        assert time.time() < deadline, "no checkpoint after 120 s"
        time.sleep(0.05)
    last_step = 0
    # drain what is there, so the step we compare against is current; progress
    # keeps coming while the run trains, so the drain is bounded in time too
    drain_end = time.time() + 1.0
    while time.time() < drain_end:
        try:
            m = kc.get_iopub_msg(timeout=0.3)
        except Exception:
            break
        data = m["content"].get("data") or {}
        prog = data.get("application/vnd.txkernel.progress+json") or {}
        if "step" in prog:
            last_step = max(last_step, prog["step"])
    t0 = time.time()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    elapsed = time.time() - t0
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    # a tiny step takes milliseconds; an epoch-end eval + checkpoint at most ~1 s here
    assert elapsed < 5, elapsed
    stopped = None
    while True:
        try:
            m = kc.get_iopub_msg(timeout=1)
        except Exception:
            break
        if m["msg_type"] == "stream" and "Interrupted after step" in m["content"]["text"]:
            stopped = int(m["content"]["text"].split("Interrupted after step")[1].split()[0])
    assert stopped is not None and stopped >= last_step
    assert stopped < 100000 * 8
    # the checkpoint loads: in python, and as the start of a new run
    from safetensors.numpy import load_file
    ck = sorted(glob.glob(os.path.join(out_dir, "**", "model.safetensors"), recursive=True))[-1]
    w = load_file(ck)
    assert w["bert.embeddings.word_embeddings.weight"].shape == (30522, 32)  # bert-tiny vocab, hidden 32
    reply, outs = run(kc, "%%txtrain\n" + tiny(resume_from=os.path.dirname(ck), max_steps=1))
    assert reply["status"] == "ok", errors(outs)
    assert mem(kc)["allocated"] == 0
    assert kernel_info_ok(kc)


def test_snapshot_with_model_data_and_shape_in_the_kernel(kernel, tmp_path):
    """%txmem --snapshot takes txk mem's options in the kernel and says the
    same: a plan snapshot of bert-base at 32 x 512 (written by txk plan) is
    recognised by its sizes, the data's lengths come through the pipeline,
    and each fix is planned; the HTML names the model; a bad value is one
    error naming the option."""
    import subprocess
    txk = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
    cfg = tmp_path / "seed.yaml"
    cfg.write_text("model: bert-base-cased\nmax_len: 512\nbatch_size: 32\nnum_labels: 3\ndevice: {gpu: t4}\n")
    snap = str(tmp_path / "plan.pickle")
    subprocess.run([txk, "plan", str(cfg), "--snapshot", snap], check=True, stdout=subprocess.DEVNULL)
    opts = f"--gpu t4 --data {DATA}/reviews_train.csv --batch 32 --seq 512"
    cli = json.loads(subprocess.run([txk, "mem", "--snapshot", snap] + opts.split() + ["--json"], check=True,
                                    stdout=subprocess.PIPE, text=True).stdout)
    _, kc = kernel
    rep, outs = run(kc, f"%txmem --snapshot {snap} {opts} --json")
    assert rep["status"] == "ok", outs
    got = [o["content"]["data"]["application/json"] for o in outs if o["msg_type"] == "display_data"][-1]
    # the same figures, diagnoses and fixes; the top list is as long as each asks
    n = min(len(got["top"]), len(cli["top"]))
    assert n >= 5 and got["top"][:n] == cli["top"][:n]
    assert {k: v for k, v in got.items() if k != "top"} == {k: v for k, v in cli.items() if k != "top"}
    assert got["model"]["preset"] == "bert-base-cased" and got["model"]["recognised_from"] == "the live blocks' sizes"
    assert got["data"]["examples"] == 2000 and got["data"]["max_length"] == 176
    ml = [f for f in got["fixes"] if f["id"] == "max_length"]
    assert ml and ml[0]["plan"]["change"] == "max_len=176" and ml[0]["plan"]["fits"]
    rep, outs = run(kc, f"%txmem --snapshot {snap} {opts}")
    html = [o["content"]["data"]["text/html"] for o in outs if o["msg_type"] == "display_data"]
    assert html and "bert-base-cased" in html[-1] and "max_length=176" in html[-1], html
    rep, outs = run(kc, f"%txmem --snapshot {snap} --batch x")
    errs = [o["content"] for o in outs if o["msg_type"] == "error"]
    assert rep["status"] == "error" and len(errs) == 1 and "--batch" in errs[0]["evalue"], errs
