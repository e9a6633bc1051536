"""The long soak of issue 44: one txkernel kernel, many mixed requests and
training runs through jupyter_client, every request answered; prints p50/p99
latency per request kind and the kernel's RSS series (record them in
bench/RESULTS.md, "## kernel soak").

    .venv/bin/python bench/kernel_soak.py [--requests 5000] [--runs 20]

Uses build/txkernel (or $TXKERNEL_BIN) and tests/kernel/txk_soak.py, the
driver tests/kernel/test_soak.py runs short."""
import argparse, os, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
import txk_soak  # noqa: E402
import txk_util  # noqa: E402

MiB = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=5000, help="mixed requests in all")
    ap.add_argument("--runs", type=int, default=20, help="training runs, spread among the requests")
    a = ap.parse_args()
    km, kc = txk_soak.start()
    s = txk_soak.Soak(km, kc, timeout=120)
    t0 = time.monotonic()
    try:
        s.mixed(3 * len(txk_soak.KINDS))
        start = s.sample("pre-run")
        per = max(1, a.requests // max(1, a.runs))
        done = 0
        for k in range(a.runs):
            s.train(f"after run {k + 1}", fail=(k % 5 == 4))
            n = min(per, a.requests - done)
            s.mixed(n, offset=done)
            done += n
            s.sample(f"after {done} requests")
        if done < a.requests:
            s.mixed(a.requests - done, offset=done)
        s.request("txreset")
        end = s.sample("after %txreset")
    finally:
        txk_util.stop(km, kc)
    took = time.monotonic() - t0
    print(f"{s.sent} requests ({a.runs} training runs, one in five out of memory), {s.answered} answered, "
          f"{took:.0f} s")
    print(f"{'kind':<20} {'n':>6} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for kind in sorted(s.lat):
        xs = s.lat[kind]
        print(f"{kind:<20} {len(xs):>6} {txk_soak.percentile(xs, 50) * 1e3:>9.2f} "
              f"{txk_soak.percentile(xs, 99) * 1e3:>9.2f} {max(xs) * 1e3:>9.2f}")
    print("RSS series (requests sent: MiB):")
    for n, b, lab in s.rss:
        print(f"  {n:>6}: {b / MiB:7.1f}  {lab}")
    print(f"RSS: pre-run {start / MiB:.1f} MiB, end {end / MiB:.1f} MiB ({(end - start) / MiB:+.1f} MiB); "
          f"largest after a run {max(b for _, b, lab in s.rss if lab.startswith('after run')) / MiB:.1f} MiB")
    if s.answered != s.sent:
        sys.exit(f"{s.sent - s.answered} requests were not answered")


if __name__ == "__main__":
    main()
