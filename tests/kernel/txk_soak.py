"""A soak driver for one txkernel kernel (issue 44): mixed requests of every
kind the frontends send, and training runs, one at a time through
jupyter_client, each checked to be answered; the kernel's RSS sampled along
the way. tests/kernel/test_soak.py runs a short one in `make test`;
bench/kernel_soak.py a longer one and prints p50/p99 latency per kind."""
import os, queue, tempfile, time

import txk_util

DATA = os.path.join(txk_util.ROOT, "tests", "data")


def tiny_config(steps=2):
    """bert-tiny's shape (hidden 128, 2 layers; random init: no download) on
    32 examples of the reviews corpus, `steps` optimizer steps on the cpu."""
    return (f"model: bert-tiny\ninit: random\nvocab: {DATA}/vocab_cased.txt\n"
            f"train_file: {DATA}/reviews_train.csv\ndev_split: 0\nmax_examples: 32\nmax_len: 32\n"
            f"batch_size: 8\nmax_steps: {steps}\ndevice: cpu\n")


class Soak:
    def __init__(self, km, kc, timeout=60):
        self.km, self.kc, self.timeout = km, kc, timeout
        self.lat = {}        # kind -> [seconds]
        self.sent = 0        # requests sent
        self.answered = 0    # requests whose reply came back
        self.rss = []        # (requests so far, bytes, label)

    def sample(self, label=""):
        self.rss.append((self.sent, txk_util.rss(self.km), label))
        return self.rss[-1][1]

    def _wait(self, chan_get, msg_id, kind, t0):
        while True:
            rep = chan_get(timeout=self.timeout)
            if rep["parent_header"].get("msg_id") == msg_id:
                break
        self.lat.setdefault(kind, []).append(time.monotonic() - t0)
        self.answered += 1
        return rep

    def _drain_iopub(self):
        """Reads what iopub has so far (this client never needs it)."""
        while True:
            try:
                self.kc.get_iopub_msg(timeout=0)
            except queue.Empty:
                return

    def request(self, kind, i=0):
        """One request of a kind; returns its reply (asserting it came)."""
        kc = self.kc
        self.sent += 1
        t0 = time.monotonic()
        if kind == "control_kernel_info":
            msg = kc.session.msg("kernel_info_request", {})
            kc.control_channel.send(msg)
            return self._wait(kc.get_control_msg, msg["header"]["msg_id"], kind, t0)
        if kind == "kernel_info":
            msg_id = kc.kernel_info()
        elif kind == "comm_info":
            msg_id = kc.comm_info()
        elif kind == "complete":
            msg_id = kc.complete("%txm", 4)
        elif kind == "inspect":
            msg_id = kc.inspect("%txmem", 3)
        elif kind == "is_complete":
            msg_id = kc.is_complete("%%txtrain\nmodel: bert-tiny")
        elif kind == "history":
            msg_id = kc.history(hist_access_type="tail", n=5, output=False, raw=True)
        else:
            code = EXECUTES[kind](i)
            msg_id = kc.execute(code, stop_on_error=False)
        rep = self._wait(kc.get_shell_msg, msg_id, kind, t0)
        self._drain_iopub()
        want = {"error_cell": "error", "is_complete": "incomplete"}.get(kind, "ok")
        assert rep["content"]["status"] == want, (kind, rep["content"])
        return rep

    def mixed(self, n, offset=0):
        """n requests cycling through every kind."""
        for k in range(n):
            self.request(KINDS[(offset + k) % len(KINDS)], offset + k)

    def train(self, label="train", fail=False):
        """One %%txtrain of the tiny config (fail: a run that runs out of
        its simulated 6 MiB, plan skipped); asserts the reply."""
        cfg = tiny_config()
        if fail:
            cfg += "capacity: 6MiB\n"
        self.sent += 1
        t0 = time.monotonic()
        msg_id = self.kc.execute("%%txtrain" + (" --no-plan" if fail else "") + "\n" + cfg, stop_on_error=False)
        rep = self._wait(self.kc.get_shell_msg, msg_id, "train_fail" if fail else "train", t0)
        self._drain_iopub()
        if fail:
            assert rep["content"]["status"] == "error" and rep["content"]["ename"] == "OutOfMemoryError", rep["content"]
        else:
            assert rep["content"]["status"] == "ok", rep["content"]
        return self.sample(label)


EXECUTES = {
    "echo": lambda i: f"%echo soak {i}",
    "txmem": lambda i: "%txmem --json",
    "txdevice": lambda i: "%txdevice --json",
    "lsmagic": lambda i: "%lsmagic",
    "txplan": lambda i: "%%txplan --json\n" + tiny_config(),
    "error_cell": lambda i: "%nosuchmagic",
    "comment": lambda i: f"# cell {i}\n%echo done",
    "txreset": lambda i: "%txreset",
}
KINDS = ["echo", "complete", "txmem", "inspect", "kernel_info", "txdevice", "is_complete", "history",
         "lsmagic", "control_kernel_info", "txplan", "comm_info", "error_cell", "comment"]


def start():
    """A kernel with its own history file (a fresh XDG_DATA_HOME)."""
    return txk_util.start(env={"XDG_DATA_HOME": tempfile.mkdtemp(prefix="txk-soak-")})


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]
