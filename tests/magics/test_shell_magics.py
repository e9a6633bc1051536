"""Shell habits in txkernel through a real kernel (jupyter_client over
ZeroMQ): `!echo hi` streams hi while it runs, `!exit 3` ends the cell with an
error naming status 3, `!sleep 60` stops within a second of an interrupt and
the kernel runs the next cell, `%cd` moves where a relative train_file is
found, `%%bash` runs a multi-line script, `%env` reaches child processes, and
%lsmagic / tab completion list the new magics."""
import os, sys, time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
import txk_util as u  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data")


@pytest.fixture(scope="module")
def kernel():
    km, kc = u.start()
    yield km, kc
    u.stop(km, kc)


def run(kc, code, timeout=60):
    reply, outs = u.run_cell(kc, code, timeout=timeout)
    return reply["content"], outs


def streams(outs, name="stdout"):
    return "".join(o["content"]["text"] for o in outs if o["msg_type"] == "stream" and o["content"]["name"] == name)


def errors(outs):
    return [o["content"] for o in outs if o["msg_type"] == "error"]


def test_bang_echo_streams(kernel):
    _, kc = kernel
    rep, outs = run(kc, "!echo hi")
    assert rep["status"] == "ok"
    assert streams(outs) == "hi\n"


def test_output_arrives_while_the_command_runs(kernel):
    _, kc = kernel
    msg_id = kc.execute("!echo first; sleep 1.5; echo second")
    t0 = time.time()
    first_at = None
    while True:
        m = kc.get_iopub_msg(timeout=10)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream" and "first" in m["content"]["text"]:
            first_at = time.time() - t0
            assert "second" not in m["content"]["text"]
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            break
    total = time.time() - t0
    assert first_at is not None and first_at < total - 1.0, (first_at, total)
    kc.get_shell_msg(timeout=10)


def test_nonzero_exit_is_one_error_naming_the_status(kernel):
    _, kc = kernel
    rep, outs = run(kc, "!exit 3\n!echo not reached")
    assert rep["status"] == "error"
    errs = errors(outs)
    assert len(errs) == 1 and "status 3" in errs[0]["evalue"], errs
    assert "not reached" not in streams(outs)


def test_interrupt_stops_sleep_within_a_second(kernel):
    km, kc = kernel
    msg_id = kc.execute("!sleep 60")
    time.sleep(0.5)
    t0 = time.time()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=5)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=5)
    elapsed = time.time() - t0
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert elapsed < 1.0, f"interrupt took {elapsed:.2f}s"
    rep, outs = run(kc, "!echo alive")
    assert rep["status"] == "ok" and streams(outs) == "alive\n"


def test_bash_cell_runs_a_multiline_script(kernel):
    _, kc = kernel
    rep, outs = run(kc, "%%bash\nsum=0\nfor i in 1 2 3; do\n  sum=$((sum + i))\ndone\necho \"sum=$sum\"\necho warn >&2\n")
    assert rep["status"] == "ok"
    assert streams(outs) == "sum=6\n" and streams(outs, "stderr") == "warn\n"
    rep, outs = run(kc, "%%sh\nexit 4\n")
    assert rep["status"] == "error" and "status 4" in errors(outs)[0]["evalue"]


def test_cd_moves_relative_train_file(kernel):
    _, kc = kernel
    cfg = ("%%txtrain\nmodel: bert-tiny\ninit: random\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"
           "vocab: vocab_cased.txt\ntrain_file: reviews_train.csv\ndev_split: 0\nmax_examples: 16\n"
           "max_len: 32\nbatch_size: 8\nmax_steps: 1\ndevice: cpu\n")
    rep, outs = run(kc, "%cd /")
    assert rep["status"] == "ok" and streams(outs) == "/\n"
    rep, outs = run(kc, cfg)
    assert rep["status"] == "error" and "reviews_train.csv" in errors(outs)[0]["evalue"]
    rep, outs = run(kc, f"%cd {DATA}\n%pwd")
    assert rep["status"] == "ok"
    assert [o["content"]["data"]["text/plain"] for o in outs if o["msg_type"] == "execute_result"] == [DATA]
    rep, outs = run(kc, cfg, timeout=120)
    assert rep["status"] == "ok", errors(outs)
    rep, outs = run(kc, "!pwd")
    assert streams(outs) == DATA + "\n"
    rep, outs = run(kc, "%cd -")
    assert streams(outs) == "/\n"


def test_env_reaches_commands(kernel):
    _, kc = kernel
    rep, outs = run(kc, "%env TXK_SHELL_TEST=forty two\n!echo \"[$TXK_SHELL_TEST]\"\n%env TXK_SHELL_TEST")
    assert rep["status"] == "ok"
    assert streams(outs) == "env: TXK_SHELL_TEST=forty two\n[forty two]\nforty two\n"
    rep, outs = run(kc, "%env")
    assert "TXK_SHELL_TEST=forty two\n" in streams(outs)


def test_lsmagic_and_completion_list_them(kernel):
    _, kc = kernel
    rep, outs = run(kc, "%lsmagic")
    text = [o for o in outs if o["msg_type"] == "display_data"][0]["content"]["data"]["text/plain"]
    for name in ("%%bash", "%%sh", "%cd", "%pwd", "%env", "%system"):
        assert name + " " in text, name
    kc.complete("%c", 2)
    rep = kc.get_shell_msg(timeout=5)["content"]
    assert "%cd" in rep["matches"]
    kc.complete("%%b", 3)
    rep = kc.get_shell_msg(timeout=5)["content"]
    assert "%%bash" in rep["matches"]
