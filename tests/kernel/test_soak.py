"""The soak test of issue 44, short enough for `make test`: one kernel, over
500 mixed requests (every kind a frontend sends: executes of several magics,
an error cell, complete, inspect, is_complete, history, kernel_info on shell
and control, comm_info) and 5 bert-tiny training runs plus a run that runs
out of memory and a %txreset, every request answered; RSS grows by less than
1 KiB per request once warm, and after the runs it is within 32 MiB of the
kernel's pre-run figure (the freed heap goes back to the system).

It asserts RSS figures, so it belongs in the pytest[kernels] lane.
bench/kernel_soak.py is the long version, with latencies."""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txk_soak  # noqa: E402
import txk_util  # noqa: E402

MiB = 1 << 20


def test_soak_every_request_answered_memory_flat():
    km, kc = txk_soak.start()
    s = txk_soak.Soak(km, kc)
    try:
        # warm-up: every kind a few times (each code path's first
        # allocations), then the pre-run figure
        s.mixed(3 * len(txk_soak.KINDS))
        start = s.sample("pre-run")
        # runs: 5 trainings, a run out of memory, a reset; what each run
        # freed goes back to the system
        after = []
        for k in range(5):
            after.append(s.train(f"after run {k + 1}") - start)
            s.mixed(20, offset=k * 20)
        after.append(s.train("after a failed run", fail=True) - start)
        s.request("txreset")
        after.append(s.sample("after %txreset") - start)
        # flat: many requests, once warm
        s.mixed(2 * len(txk_soak.KINDS))
        r0 = s.sample("warm")
        n0 = s.sent
        s.mixed(500)
        r1 = s.sample("end")
        per_request = (r1 - r0) / (s.sent - n0)
        print("RSS series (requests, MiB): " + ", ".join(f"{n}: {b / MiB:.1f} {lab}" for n, b, lab in s.rss))
        print(f"{s.sent} requests, {s.answered} answered; RSS growth {per_request:.0f} B per request over the last "
              f"{s.sent - n0}; after runs vs pre-run: " + ", ".join(f"{d / MiB:+.1f} MiB" for d in after))
        assert s.sent >= 500 + 5 and s.answered == s.sent
        assert per_request < 1024, per_request
        assert max(after) < 32 * MiB, [d / MiB for d in after]
        assert r1 - start < 32 * MiB, (r1 - start) / MiB
    finally:
        txk_util.stop(km, kc)
