#!/usr/bin/env python3
"""PyTorch's side of bench/gemm_cpu: a @ b.T on the CPU, fp32, the same shape,
threads and repetitions as gemm_cpu; one JSON line like it."""
import json
import sys
import time

import torch

m, k, n = (int(v) for v in sys.argv[1:4])
opts = dict(zip(sys.argv[4::2], sys.argv[5::2]))
threads, reps = int(opts.get("--threads", 2)), int(opts.get("--reps", 20))
torch.set_num_threads(threads)
a = torch.rand(m, k)
b = torch.rand(n, k)
times = []
for r in range(-3, reps):
    t0 = time.perf_counter()
    c = a @ b.t()
    dt = time.perf_counter() - t0
    if r >= 0:
        times.append(dt)
flop = 2.0 * m * n * k
print(json.dumps({"m": m, "k": k, "n": n, "threads": threads, "torch": torch.__version__,
                  "gflops": round(flop / (sum(times) / reps) / 1e9, 1), "best_gflops": round(flop / min(times) / 1e9, 1)}))
