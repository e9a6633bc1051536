#!/usr/bin/env python3
"""How long the companion's tracer (python/txkernel/trace.py, issue 41)
takes on bert-base-cased's shape, and what it leaves in the process.

Builds BertForSequenceClassification from bert-base-cased's config (random
init: nothing is downloaded), then traces its two training steps at
--batch x --seq on fake tensors, --runs times. Prints the seconds of each
trace (and of the engine's plan of it, through build/libtxk.so), and the
process' resident memory (VmRSS) before the first trace and after the last
(with gc.collect()), and its high-water mark (VmHWM) before and after: the
issue's budget is under 10 s on a 2-core CPU, and no more memory held
afterwards than before.

    .venv-t2/bin/python bench/trace_time.py [--batch 16] [--seq 512] [--runs 3]
"""
import argparse, gc, json, os, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    os.environ.setdefault("TXK_ENGINE_LIB", os.path.join(ROOT, "build", "libtxk.so"))
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    from txkernel import trace, trace_plan
    torch.set_num_threads(2)
    model = BertForSequenceClassification(BertConfig(vocab_size=28996))
    gc.collect()
    rss0, hwm0 = status("VmRSS"), status("VmHWM")
    times, plans, n_events, peak, rss_runs = [], [], 0, 0, []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        tr = trace.trace_step(model, batch=a.batch, seq=a.seq, target="cuda")
        t1 = time.perf_counter()
        j = trace_plan.plan_trace(tr, gpu="t4")["application/json"]
        t2 = time.perf_counter()
        times.append(round(t1 - t0, 2))
        plans.append(round(t2 - t1, 2))
        n_events, peak = len(tr["events"]), j["peak_allocated"]
        del tr, j
        gc.collect()
        rss_runs.append(status("VmRSS"))
    rss1, hwm1 = status("VmRSS"), status("VmHWM")
    print(json.dumps({"torch": torch.__version__, "batch": a.batch, "seq": a.seq, "trace_s": times, "plan_s": plans,
                      "events": n_events, "t4_peak_allocated": peak, "rss_before": rss0, "rss_after_each": rss_runs, "rss_after": rss1,
                      "hwm_before": hwm0, "hwm_after": hwm1, "cpus": os.cpu_count(),
                      "loadavg_after": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
