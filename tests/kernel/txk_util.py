"""Helpers for the kernel's python tests: a kernelspec for the binary under
test (build/txkernel, or $TXKERNEL_BIN), history kept in a temporary
XDG_DATA_HOME so tests never touch the user's own history, and a started
kernel + client for a given transport."""
import json, os, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEV_NAME = "txkernel-under-test"
_done = None


def kernel_bin():
    return os.environ.get("TXKERNEL_BIN") or os.path.join(ROOT, "build", "txkernel")


def dev_kernel_name():
    """Installs (once per process) a kernelspec for the built binary in a temp
    dir added to JUPYTER_PATH; returns its name."""
    global _done
    if _done is None:
        top = tempfile.mkdtemp(prefix="txk-test-")
        d = os.path.join(top, "share", "kernels", DEV_NAME)
        os.makedirs(d)
        with open(os.path.join(d, "kernel.json"), "w") as f:
            json.dump({"argv": [kernel_bin(), "-f", "{connection_file}"],
                       "display_name": "txkernel (under test)", "language": "txkernel",
                       "interrupt_mode": "signal"}, f)
        os.environ["JUPYTER_PATH"] = os.path.join(top, "share") + os.pathsep + os.environ.get("JUPYTER_PATH", "")
        os.environ["XDG_DATA_HOME"] = os.path.join(top, "data")
        os.environ.setdefault("JUPYTER_RUNTIME_DIR", os.path.join(top, "runtime"))
        _done = DEV_NAME
    return _done


def start(transport="tcp", kernel_name=None, interrupt_mode=None, env=None):
    """Returns (km, kc) with the client's channels started and the kernel ready.
    env: variables added to the kernel's environment."""
    from jupyter_client.manager import KernelManager
    km = KernelManager(kernel_name=kernel_name or dev_kernel_name(), transport=transport)
    if interrupt_mode:
        km.kernel_spec.interrupt_mode = interrupt_mode
    if env:
        km.start_kernel(env={**os.environ, **env})
    else:
        km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=30)
    return km, kc


def stop(km, kc):
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def rss(km):
    """The kernel process's resident set now, in bytes (/proc)."""
    with open(f"/proc/{km.provisioner.process.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/PID/status")


def run_cell(kc, code, timeout=10, **kw):
    """Executes code; returns (reply, outputs) where outputs are the iopub
    messages of this request between busy and idle (execute_input excluded)."""
    msg_id = kc.execute(code, **kw)
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    outs = []
    while True:
        m = kc.get_iopub_msg(timeout=timeout)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        t = m["msg_type"]
        if t == "status":
            if m["content"]["execution_state"] == "idle":
                break
            continue
        if t != "execute_input":
            outs.append(m)
    return reply, outs
