"""Interrupts (SIGINT and interrupt_request during %sleep 30), restarts through
KernelManager, shutdown, and bad signatures / replays over real sockets."""
import datetime, os, signal, sys, time
import pytest
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txk_util  # noqa: E402


@pytest.fixture
def kernel():
    km, kc = txk_util.start("tcp")
    yield km, kc
    txk_util.stop(km, kc)


def _sleep_then(kc, do_interrupt):
    msg_id = kc.execute("%sleep 30")
    # wait until the cell is running (its execute_input is out)
    while True:
        m = kc.get_iopub_msg(timeout=10)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "execute_input":
            break
    time.sleep(0.2)
    t0 = time.monotonic()
    do_interrupt()
    reply = kc.get_shell_msg(timeout=5)
    elapsed = time.monotonic() - t0
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert elapsed < 1.0, f"interrupt took {elapsed:.2f}s"
    r, outs = txk_util.run_cell(kc, "%echo still alive")
    assert r["content"]["status"] == "ok"
    assert any(o["msg_type"] == "stream" and "still alive" in o["content"]["text"] for o in outs)


def test_sigint_interrupts_sleep(kernel):
    km, kc = kernel
    _sleep_then(kc, lambda: os.kill(km.provisioner.process.pid, signal.SIGINT))


def test_interrupt_request_interrupts_sleep(kernel):
    km, kc = kernel
    def via_control():
        msg = kc.session.msg("interrupt_request", {})
        kc.control_channel.send(msg)
        rep = kc.get_control_msg(timeout=2)
        assert rep["msg_type"] == "interrupt_reply" and rep["content"]["status"] == "ok"
    _sleep_then(kc, via_control)


def test_sigint_while_idle_is_harmless(kernel):
    km, kc = kernel
    os.kill(km.provisioner.process.pid, signal.SIGINT)
    time.sleep(0.1)
    assert km.is_alive()
    r, outs = txk_util.run_cell(kc, "%sleep 0.05\n%echo not cancelled")
    assert r["content"]["status"] == "ok" and outs[0]["content"]["text"] == "not cancelled\n"


def test_kernel_manager_interrupt_signal_mode(kernel):
    km, kc = kernel  # kernelspec says interrupt_mode signal: jupyter_client sends SIGINT
    _sleep_then(kc, km.interrupt_kernel)


def test_restart_ten_times():
    km, kc = txk_util.start("tcp")
    try:
        for i in range(10):
            km.restart_kernel(now=False)
            kc.wait_for_ready(timeout=20)
            r, outs = txk_util.run_cell(kc, f"%echo round {i}")
            assert r["content"]["status"] == "ok"
            assert r["content"]["execution_count"] == 1  # a fresh kernel each time
            assert outs[0]["content"]["text"] == f"round {i}\n"
        # history is per user on disk: every restarted kernel's cell is there,
        # each under its own session number
        msg_id = kc.history(hist_access_type="tail", n=10, output=False, raw=True)
        rep = kc.get_shell_msg(timeout=5)
        assert rep["parent_header"]["msg_id"] == msg_id
        hist = rep["content"]["history"]
        assert [h[2] for h in hist] == [f"%echo round {i}" for i in range(10)]
        assert len({h[0] for h in hist}) == 10
    finally:
        txk_util.stop(km, kc)
    assert not km.is_alive()


def test_shutdown_request_exits_cleanly():
    km, kc = txk_util.start("ipc")
    proc = km.provisioner.process
    kc.shutdown(restart=False)
    rep = kc.get_control_msg(timeout=5)
    assert rep["msg_type"] == "shutdown_reply" and rep["content"]["restart"] is False
    assert proc.wait(timeout=5) == 0
    kc.stop_channels()
    km.cleanup_resources()


def _raw_shell(kc, frames_fn):
    """Sends a hand-built message on a fresh DEALER to the shell port."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(f"tcp://{kc.ip}:{kc.shell_port}")
    return s


def _execute_frames(session, code, key_override=None, sign=True):
    msg = session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                          "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
    parts = [session.pack(msg["header"]), session.pack(msg["parent_header"]),
             session.pack(msg["metadata"]), session.pack(msg["content"])]
    if not sign:
        sig = b""
    elif key_override is not None:
        import hmac, hashlib
        h = hmac.new(key_override, digestmod=hashlib.sha256)
        for p in parts:
            h.update(p)
        sig = h.hexdigest().encode()
    else:
        sig = session.sign(parts)
    return msg, [b"<IDS|MSG>", sig] + parts


def _replies(sock, wait=0.6):
    out = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if sock.poll(50):
            out.append(sock.recv_multipart())
    return out


def test_bad_signatures_and_replay_never_run(kernel):
    km, kc = kernel
    sess = kc.session
    sock = _raw_shell(kc, None)
    try:
        _, wrong = _execute_frames(sess, "%echo --stderr WRONG-SIG", key_override=b"not the key")
        _, unsigned = _execute_frames(sess, "%echo --stderr NO-SIG", sign=False)
        sock.send_multipart(wrong)
        sock.send_multipart(unsigned)
        assert _replies(sock) == []
        good_msg, good = _execute_frames(sess, "%echo valid request")
        sock.send_multipart(good)
        got = _replies(sock, 2.0)
        assert len(got) == 1
        reply = sess.deserialize(sess.feed_identities(got[0])[1])
        assert reply["parent_header"]["msg_id"] == good_msg["header"]["msg_id"]
        assert reply["content"]["status"] == "ok"
        count = reply["content"]["execution_count"]
        sock.send_multipart(good)  # the same signed message again: a replay
        assert _replies(sock) == []
        # the kernel still answers, and ran the valid cell exactly once
        r, _ = txk_util.run_cell(kc, "%echo next")
        assert r["content"]["execution_count"] == count + 1
        # malformed: missing frames, junk JSON (correctly signed), invalid UTF-8
        sock.send_multipart([b"<IDS|MSG>", b"x"])
        parts = [b"{not json", b"{}", b"{}", b"{}"]
        sock.send_multipart([b"<IDS|MSG>", sess.sign(parts)] + parts)
        parts = [b'{"msg_id":"\xff","msg_type":"execute_request"}', b"{}", b"{}", b'{"code":"%echo x"}']
        sock.send_multipart([b"<IDS|MSG>", sess.sign(parts)] + parts)
        assert _replies(sock) == []
        r, _ = txk_util.run_cell(kc, "%echo after junk")
        assert r["content"]["status"] == "ok"
        assert r["content"]["execution_count"] == count + 2
        # huge and mis-signed (its signature is the small message's): the
        # transport has no size limit of its own, so it is read whole, then
        # dropped for its signature (test_limits.py: a signed one is answered)
        big = zmq.Context.instance().socket(zmq.DEALER)
        big.linger = 0
        big.connect(f"tcp://{kc.ip}:{kc.shell_port}")
        _, frames = _execute_frames(sess, "%echo big")
        big.send_multipart(frames[:5] + [b'{"code": "' + b"x" * (65 << 20) + b'"}'])
        time.sleep(0.5)
        big.close()
        r, _ = txk_util.run_cell(kc, "%echo after huge")
        assert r["content"]["status"] == "ok"
        assert r["content"]["execution_count"] == count + 3
    finally:
        sock.close()
    assert km.is_alive()


def test_stop_on_error_aborts_queued_executes(kernel):
    km, kc = kernel
    # the failing cell runs 0.3 s first, so the two behind it are queued (sent
    # before the error), as in "run all"; the kernel aborts exactly those
    ids = [kc.execute("%sleep 0.3\n%nosuchmagic"), kc.execute("%echo queued 1"), kc.execute("%echo queued 2")]
    replies = {}
    while len(replies) < 3:
        r = kc.get_shell_msg(timeout=10)
        replies[r["parent_header"]["msg_id"]] = r["content"]["status"]
    assert [replies[i] for i in ids] == ["error", "aborted", "aborted"]
    # sent after the error reply arrived: runs at once, no waiting needed
    r, outs = txk_util.run_cell(kc, "%echo runs again")
    assert r["content"]["status"] == "ok" and outs[0]["content"]["text"] == "runs again\n"


def _exec_msg(kc, code):
    """An execute_request dated now (by the client's clock), not yet sent."""
    return kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                              "user_expressions": {}, "allow_stdin": False,
                                              "stop_on_error": True})


def test_stop_on_error_by_send_time_whatever_the_arrival(kernel):
    km, kc = kernel
    # the failing cell runs 0.3 s; requests made 0..200 ms after it, all
    # before its error can have reached this client, are held back and sent
    # only once the error is out (arriving after the error reply left, as
    # behind a slow proxy): every one is aborted, none runs
    fail_id = kc.execute("%sleep 0.3\n%nosuchmagic")
    t0 = time.monotonic()
    held = []
    for delay in (0, 0.002, 0.010, 0.050, 0.200):
        time.sleep(max(0.0, t0 + delay - time.monotonic()))
        held.append(_exec_msg(kc, "%echo must not run"))
    while True:
        m = kc.get_iopub_msg(timeout=10)
        if m["parent_header"].get("msg_id") == fail_id and m["msg_type"] == "status" \
                and m["content"]["execution_state"] == "idle":
            break
    time.sleep(0.1)  # and they land well after it
    for msg in held:
        kc.session.send(kc.shell_channel.socket, msg)
    replies = {}
    while len(replies) < 1 + len(held):
        r = kc.get_shell_msg(timeout=10)
        replies[r["parent_header"]["msg_id"]] = r["content"]["status"]
    assert replies[fail_id] == "error"
    assert [replies[m["header"]["msg_id"]] for m in held] == ["aborted"] * len(held)
    # each aborted request had its busy/idle and no output
    outs = []
    deadline = time.monotonic() + 5
    while sum(o["msg_type"] == "status" and o["content"]["execution_state"] == "idle" for o in outs) < len(held) \
            and time.monotonic() < deadline:
        try:
            outs.append(kc.get_iopub_msg(timeout=1))
        except Exception:
            break
    held_ids = {m["header"]["msg_id"] for m in held}
    mine = [o for o in outs if o["parent_header"].get("msg_id") in held_ids]
    assert sorted(o["content"].get("execution_state") for o in mine) == ["busy"] * 5 + ["idle"] * 5, mine
    # made after the error reply was read: runs
    r, outs = txk_util.run_cell(kc, "%echo runs")
    assert r["content"]["status"] == "ok" and outs[0]["content"]["text"] == "runs\n"


def test_stop_on_error_aborts_what_waits_whatever_its_date(kernel):
    km, kc = kernel
    # Requests already waiting when the error goes out were sent before the
    # client could see it, whatever their header dates say. Here they are
    # dated 5 s ahead (a client whose clock stepped, or a page whose Run All
    # loop took its time): the date rule alone would run them; they must be
    # aborted all the same, as ipykernel aborts its queue.
    fail_id = kc.execute("%sleep 0.4\n%nosuchmagic")
    while True:  # the failing cell is running
        m = kc.get_iopub_msg(timeout=10)
        if m["parent_header"].get("msg_id") == fail_id and m["msg_type"] == "execute_input":
            break
    ahead = []
    for _ in range(3):
        msg = _exec_msg(kc, "%echo must not run")
        msg["header"]["date"] = msg["header"]["date"] + datetime.timedelta(seconds=5)
        kc.session.send(kc.shell_channel.socket, msg)
        ahead.append(msg["header"]["msg_id"])
    replies = {}
    while len(replies) < 4:
        r = kc.get_shell_msg(timeout=10)
        replies[r["parent_header"]["msg_id"]] = r["content"]["status"]
    assert replies[fail_id] == "error"
    assert [replies[i] for i in ahead] == ["aborted"] * 3, replies
    # a request made after the error reply was read still runs; its date
    # (now, 5 s before the aborted ones') does not matter
    r, outs = txk_util.run_cell(kc, "%echo runs")
    assert r["content"]["status"] == "ok" and outs[0]["content"]["text"] == "runs\n"


def test_stop_on_error_holds_the_reply_for_a_spread_burst(kernel):
    km, kc = kernel
    # A busy browser's Run All spreads its requests over milliseconds; a cell
    # that fails at once must not let the late members run. The kernel holds
    # the failing reply until requests stop arriving (50 ms quiet): the ones
    # sent 10 and 30 ms after the failing one, dated 5 s ahead so the date
    # rule alone would run them, are aborted.
    t0 = time.monotonic()
    fail_id = kc.execute("%nosuchmagic")
    late = []
    for delay in (0.010, 0.030):
        time.sleep(max(0.0, t0 + delay - time.monotonic()))
        msg = _exec_msg(kc, "%echo must not run")
        msg["header"]["date"] = msg["header"]["date"] + datetime.timedelta(seconds=5)
        kc.session.send(kc.shell_channel.socket, msg)
        late.append(msg["header"]["msg_id"])
    replies, when = {}, {}
    while len(replies) < 3:
        r = kc.get_shell_msg(timeout=10)
        replies[r["parent_header"]["msg_id"]] = r["content"]["status"]
        when[r["parent_header"]["msg_id"]] = time.monotonic() - t0
    assert replies[fail_id] == "error" and [replies[i] for i in late] == ["aborted"] * 2, replies
    # held no longer than the quiet time after the last arrival, and at most 0.5 s
    assert when[fail_id] < 0.5, when
    r, outs = txk_util.run_cell(kc, "%echo runs")
    assert r["content"]["status"] == "ok" and outs[0]["content"]["text"] == "runs\n"


def test_heartbeat_echoes(kernel):
    km, kc = kernel
    s = zmq.Context.instance().socket(zmq.REQ)
    s.linger = 0
    s.connect(f"tcp://{kc.ip}:{kc.hb_port}")
    try:
        s.send(b"ping \x00\xff")
        assert s.poll(2000)
        assert s.recv() == b"ping \x00\xff"
    finally:
        s.close()


def test_control_answers_while_cell_runs(kernel):
    km, kc = kernel
    msg_id = kc.execute("%sleep 1")
    time.sleep(0.2)
    t0 = time.monotonic()
    kc.control_channel.send(kc.session.msg("kernel_info_request", {}))
    rep = kc.get_control_msg(timeout=2)
    assert rep["msg_type"] == "kernel_info_reply"
    assert time.monotonic() - t0 < 0.5  # answered mid-cell, not after it
    r = kc.get_shell_msg(timeout=5)
    assert r["parent_header"]["msg_id"] == msg_id and r["content"]["status"] == "ok"
