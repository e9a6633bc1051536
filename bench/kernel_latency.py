#!/usr/bin/env python3
"""Execute round-trip latency of txkernel against ipykernel, in one run.

For each kernel (installed kernelspecs "txkernel" and "python3"): start time to
the first kernel_info reply; then N execute round trips of a no-op cell
(%pass / pass), each timed from send until both the execute_reply and the
iopub idle status have arrived (what a frontend waits for). Prints median and
p99 per kernel and the ratio. For txkernel it also runs 10,000 executes and
reports RSS (VmRSS of the kernel process) after the first 100 and after all.

usage: bench/kernel_latency.py [--n 1000] [--rss-n 10000] [--json out.json]"""
import argparse, json, os, statistics, sys, time

from jupyter_client.manager import KernelManager


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def round_trip(kc, code):
    t0 = time.perf_counter()
    msg_id = kc.execute(code, store_history=True)
    got_reply = got_idle = False
    while not (got_reply and got_idle):
        if not got_reply:
            r = kc.get_shell_msg(timeout=10)
            got_reply = r["parent_header"].get("msg_id") == msg_id
            if got_reply and r["content"]["status"] != "ok":
                raise RuntimeError(f"{code!r} failed: {r['content']}")
        else:
            m = kc.get_iopub_msg(timeout=10)
            got_idle = (m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                        and m["content"]["execution_state"] == "idle")
    return time.perf_counter() - t0


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def bench(kernel, code, n, rss_n=0):
    km = KernelManager(kernel_name=kernel)
    t0 = time.perf_counter()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    # the request waits in the client's queue until the kernel has bound its
    # sockets, so this times process start + bind + first answer
    kc.kernel_info()
    kc.get_shell_msg(timeout=60)
    startup = time.perf_counter() - t0
    kc.wait_for_ready(timeout=60)  # also drains iopub (status, iopub_welcome)
    try:
        for _ in range(20):  # warm-up, not counted
            round_trip(kc, code)
        lat = [round_trip(kc, code) for _ in range(n)]
        res = {"kernel": kernel, "code": code, "n": n, "startup_s": startup,
               "median_ms": statistics.median(lat) * 1e3, "p99_ms": pct(lat, 99) * 1e3}
        if rss_n:
            pid = km.provisioner.process.pid
            # fresh counts: RSS after the first 100 executes of this phase vs after rss_n
            for _ in range(100):
                round_trip(kc, code)
            r100 = rss_kib(pid)
            for _ in range(rss_n - 100):
                round_trip(kc, code)
            res.update(rss_after_100_kib=r100, rss_after_n_kib=rss_kib(pid), rss_n=rss_n)
        return res
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--rss-n", type=int, default=10000)
    ap.add_argument("--json")
    a = ap.parse_args()
    tx = bench("txkernel", "%pass", a.n, a.rss_n)
    py = bench("python3", "pass", a.n)
    for r in (tx, py):
        print(f"{r['kernel']:9s} start-to-first-reply {r['startup_s']*1e3:8.1f} ms   "
              f"execute round trip ({r['n']}x {r['code']!r}): median {r['median_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms")
    ratio = tx["median_ms"] / py["median_ms"]
    print(f"median ratio txkernel/ipykernel = {ratio:.3f} (target <= 0.333: {'met' if ratio <= 1/3 else 'NOT met'})")
    d = tx["rss_after_n_kib"] - tx["rss_after_100_kib"]
    print(f"txkernel RSS after 100 executes {tx['rss_after_100_kib']} KiB, after {tx['rss_n']} "
          f"{tx['rss_after_n_kib']} KiB, growth {d} KiB (limit 1024 KiB: {'met' if d <= 1024 else 'NOT met'})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"txkernel": tx, "ipykernel": py, "ratio": ratio}, f, indent=1)
    return 0 if ratio <= 1 / 3 and d <= 1024 else 1


if __name__ == "__main__":
    sys.exit(main())
