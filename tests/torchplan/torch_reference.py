#!/usr/bin/env python3
"""PyTorch's own figure for a transformers BERT training step (issue 26).

Runs two real training steps of BertForSequenceClassification or
BertForQuestionAnswering (random weights from a BertConfig: nothing is
downloaded) on the CPU under torch.profiler.profile(profile_memory=True),
reads the allocator's memory events back from the profiler's trace, rounds
each allocation up to 512 B as the CUDA caching allocator rounds its
requests, and replays them:

  first_step_peak_allocated  the highest live total during step 1 (the
                             optimizer's state is created there);
  peak_allocated             the highest live total during step 2, i.e. what
                             torch.cuda.max_memory_allocated() would report
                             with the peak statistics reset just before it
                             (the weights, AdamW's moments and step 1's
                             gradients are live when it starts).

The loop is the plain PyTorch one: each step zero_grad() as the version's
default (torch 2.x sets the gradients to None, 1.13 fills them with zeros),
a fresh batch (input_ids, token_type_ids, attention_mask, labels; made as a
data loader's collate makes them), `accumulate` forward/backward passes
(loss / accumulate), optimizer.step(). No gradient clipping. AdamW is
torch.optim.AdamW as torch picks it for CPU tensors (its single-tensor
loop). bf16 runs the forward under torch.autocast("cpu", torch.bfloat16).

oneDNN's bf16 matmul scratch. Under bf16 autocast PyTorch sends the CPU's
GEMMs (aten::mm/addmm) to oneDNN when the CPU has AVX-512 (its bf16 device
check), and PyTorch asks oneDNN for a user scratchpad that it allocates
through c10's CPU allocator for the length of the op (per-thread packed A/B
blocks and AMX tile buffers: `attr-scratchpad:user` in ONEDNN_VERBOSE). Its
size is this CPU's: on an AMX CPU bert-tiny 2 x 128's output-dense weight
gradient took 206848 B, and the step's peak was 11027968 B under AMX
(brg_matmul:avx10_1_512_amx), 10987008 B under ONEDNN_MAX_CPU_ISA=
AVX512_CORE_BF16, 11214848 B under AVX512_CORE (gemm:jit:bf16) and
10896384 B under AVX2 (no oneDNN: ATen's own bf16 GEMM, no scratch). A CUDA
card runs the same GEMMs in cuBLAS, whose workspaces the plan takes from
torchplan/blas_rules.c, so none of it is PyTorch's step as a card would run
it. A bf16 row is therefore run twice: its figures come from the run with
torch.backends.mkldnn.enabled = False (ATen's GEMMs, the allocation sequence
every CPU without AVX-512 has), and "onednn" holds the default run's own
(oneDNN's GEMMs as PyTorch picks them here), with, from the profiler, the
largest scratch one GEMM op allocated and freed inside itself
(gemm_scratch) and the default run's peaks without those buffers
(peak_allocated_without_gemm_scratch), so that the difference is accounted
for by the op that made it. fp32 rows run once (their GEMMs are ATen's).

--shim reads the same events without the profiler, from
tests/torchplan/alloc_events.c LD_PRELOAD'ed into this Python (it records
c10's CPU allocator's posix_memalign/free calls): the torch 1.13 row's
profiler has no kineto and reports no addresses. On torch 2.x both ways give
the same figures (test_torchplan_torch1.py checks that).

Prints one JSON object (--events FILE also writes the replayed events, one
line each: step, +/-bytes rounded, live total, the op that asked). With
--rows FILE (a JSON list of argument lists) it runs each row in this one
process (torch is imported once) and prints one JSON object per row.
Run with the python of the row under test: .venv-t2/bin/python or
.venv/bin/python (torch 1.13 + transformers 4.40: eager attention only).
"""
import argparse, bisect, json, os, sys, tempfile


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--intermediate", type=int, required=True)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--max-position", type=int, default=512)
    p.add_argument("--type-vocab", type=int, default=2)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--task", choices=("classify", "qa"), default="classify")
    p.add_argument("--labels", type=int, default=2)
    p.add_argument("--attn", choices=("eager", "sdpa"), default="sdpa")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--attention-dropout", type=float, default=None, help="default: --dropout")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--freeze-embeddings", action="store_true")
    p.add_argument("--optim", choices=("adamw", "adamw_fused"), default="adamw",
                   help="torch.optim.AdamW as torch picks it, or with fused=True (TrainingArguments' adamw_torch_fused)")
    p.add_argument("--data", help="dynamic padding: the CSV's text column, tokenized (--vocab-file) and batched in file "
                                  "order by transformers' DataCollatorWithPadding; every batch is a step")
    p.add_argument("--vocab-file", help="with --data: the vocab.txt of a lower-casing BertTokenizerFast")
    p.add_argument("--examples", type=int, default=0, help="with --data: its first N examples (0: all)")
    p.add_argument("--ddp", type=int, default=0, help="N ranks of DistributedDataParallel over gloo on 127.0.0.1, "
                                                      "each in its own process; the figures are each rank's")
    p.add_argument("--find-unused", action="store_true", help="with --ddp: find_unused_parameters=True")
    p.add_argument("--events", help="write the replayed events here")
    p.add_argument("--shim", action="store_true", help="events from alloc_events.c (LD_PRELOAD), not the profiler")
    return p.parse_args(argv)


ROUND = 512


def rounded(n):
    return (n + ROUND - 1) // ROUND * ROUND


# Allocations of these sizes mark the step boundaries in the event stream
# (MARK + 2 i before step i, and once more after the last): odd byte counts
# no BERT tensor has, freed at once.
MARK = 77_777


def mark_step(nbytes, n_steps):
    """The step (0 .. n_steps, n_steps: the end) an allocation of nbytes
    marks the start of, or None: only those n_steps + 1 sizes, so that a
    kernel's scratch buffer of some other odd size is never taken for one."""
    i = (nbytes - MARK) // 2
    return i if nbytes >= MARK and (nbytes - MARK) % 2 == 0 and i <= n_steps else None


def batches(a, torch):
    """The steps' batches: `a.batch` x `a.seq` random ids twice, or (--data)
    the file's texts through DataCollatorWithPadding, one step per batch."""
    if not a.data:
        def fixed():
            B, T = a.batch, a.seq
            b = {"input_ids": torch.randint(0, a.vocab, (B, T)),
                 "token_type_ids": torch.zeros(B, T, dtype=torch.long),
                 "attention_mask": torch.ones(B, T, dtype=torch.long)}
            if a.task == "qa":
                b["start_positions"] = torch.randint(0, T, (B,))
                b["end_positions"] = torch.randint(0, T, (B,))
            else:
                b["labels"] = torch.randint(0, a.labels, (B,))
            return b
        return [fixed for _ in range(2)]
    import csv
    from transformers import BertTokenizerFast, DataCollatorWithPadding
    tok = BertTokenizerFast(vocab_file=a.vocab_file, do_lower_case=True)
    with open(a.data, newline="") as f:
        rows = list(csv.DictReader(f))
    if a.examples:
        rows = rows[:a.examples]
    feats = [dict(tok(r["text"], truncation=True, max_length=a.seq), labels=i % a.labels) for i, r in enumerate(rows)]
    collate = DataCollatorWithPadding(tok)
    return [lambda k=k: collate(feats[k:k + a.batch]) for k in range(0, len(feats), a.batch)]


def run(a, rank=0):
    import torch
    import transformers
    from transformers import BertConfig, BertForQuestionAnswering, BertForSequenceClassification

    torch.manual_seed(rank)
    torch.set_num_threads(int(os.environ.get("TXK_TORCH_THREADS", "1" if a.ddp else "2")))
    attn_drop = a.dropout if a.attention_dropout is None else a.attention_dropout
    kw = dict(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
              intermediate_size=a.intermediate, max_position_embeddings=a.max_position, type_vocab_size=a.type_vocab,
              hidden_dropout_prob=a.dropout, attention_probs_dropout_prob=attn_drop, num_labels=a.labels)
    major = int(transformers.__version__.split(".")[0])
    if a.attn == "sdpa" and (major < 4 or transformers.__version__.startswith("4.40")):
        raise SystemExit(f"transformers {transformers.__version__} runs BERT with eager attention only")
    cfg = BertConfig(**kw)
    cfg._attn_implementation = a.attn
    cls = BertForQuestionAnswering if a.task == "qa" else BertForSequenceClassification
    makers = batches(a, torch)
    seqs = []

    def mark(i):
        del_me = torch.empty(MARK + 2 * i, dtype=torch.uint8)
        del del_me

    def steps():
        model = cls(cfg)
        model.train()
        if a.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if a.freeze_embeddings:
            for p in model.bert.embeddings.parameters():
                p.requires_grad_(False)
        net = model
        if a.ddp:
            net = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=a.find_unused)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5, weight_decay=0.01,
                                **({"fused": True} if a.optim == "adamw_fused" else {}))
        for step, make in enumerate(makers):
            mark(step)
            opt.zero_grad()  # the version's default: 2.x frees the gradients, 1.13 zero-fills them
            for _ in range(a.accumulate):
                batch = make()
                seqs.append(batch["input_ids"].shape[1])
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                    out = net(**batch)
                loss = out.loss / a.accumulate
                del out
                loss.backward()
                del loss, batch
            opt.step()
        mark(len(makers))

    def events_of():
        if a.shim:
            return shim_events(steps)
        trace = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
        trace.close()
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                        record_shapes=False) as prof:
                steps()
            prof.export_chrome_trace(trace.name)
            with open(trace.name) as f:
                events = json.load(f)
            return events["traceEvents"] if isinstance(events, dict) else events  # torch 1.13: the bare list
        finally:
            os.unlink(trace.name)

    if a.precision == "bf16":  # oneDNN's GEMMs as PyTorch picks them on this CPU, then ATen's (see the top)
        seqs_before = len(seqs)
        onednn = replay(events_of(), a, len(makers), gemm_scratch=not a.shim,
                        events_file=a.events and a.events + ".onednn")
        del seqs[seqs_before:]
        was = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False
        try:
            r = replay(events_of(), a, len(makers), events_file=a.events)
        finally:
            torch.backends.mkldnn.enabled = was
        r["onednn"] = {k: v for k, v in onednn.items() if k != "n_events"}
    else:
        r = replay(events_of(), a, len(makers), events_file=a.events)
    if a.data:
        r["seqs"] = seqs
    return r, torch.__version__, transformers.__version__


def ddp_rank(rank, a, port, out_dir):
    """One rank of --ddp: a gloo process group on 127.0.0.1, then run()."""
    import torch.distributed as dist
    if a.events:  # one file per rank
        a.events = f"{a.events}.rank{rank}"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ddp)
    try:
        r, tv, xv = run(a, rank)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(dict(r, torch=tv, transformers=xv), f)


def run_ddp(a):
    """--ddp N: rank 0 in this process, ranks 1.. each in a process of its own
    (torch.multiprocessing's spawn: torch is imported once more per rank);
    each rank's figures, and the largest of each as the row's."""
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        others = [ctx.Process(target=ddp_rank, args=(i, a, port, d)) for i in range(1, a.ddp)]
        for p in others:
            p.start()
        ddp_rank(0, argparse.Namespace(**vars(a)), port, d)
        for p in others:
            p.join()
            if p.exitcode:
                raise SystemExit(f"a DDP rank exited with {p.exitcode}")
        ranks = []
        for i in range(a.ddp):
            with open(os.path.join(d, f"rank{i}.json")) as f:
                ranks.append(json.load(f))
    r = {k: max(x[k] for x in ranks) for k in ("first_step_peak_allocated", "peak_allocated")}
    r["ranks"] = [{k: x[k] for k in ("first_step_peak_allocated", "peak_allocated")} for x in ranks]
    return r, ranks[0]["torch"], ranks[0]["transformers"]


def shim_events(steps):
    """Run steps() with alloc_events.c recording; its events in the
    profiler's trace form (the replay reads both alike)."""
    import ctypes

    class Event(ctypes.Structure):
        _fields_ = [("addr", ctypes.c_uint64), ("bytes", ctypes.c_int64)]

    lib = ctypes.CDLL(None)
    try:
        lib.ae_count.restype = ctypes.c_int64
        lib.ae_events.restype = ctypes.POINTER(Event)
    except AttributeError:
        raise SystemExit("--shim: alloc_events.c is not loaded (LD_PRELOAD=build/tests/torchplan/liballoc_events.so)")
    lib.ae_reset()
    steps()
    n = lib.ae_count()
    if n > (1 << 24):
        raise SystemExit(f"--shim: {n} events, more than alloc_events.c keeps")
    ev = lib.ae_events()
    return [{"name": "[memory]", "ts": i, "args": {"Addr": ev[i].addr, "Bytes": ev[i].bytes, "Device Type": 0}}
            for i in range(n)]


GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def replay(events, a, n_steps, gemm_scratch=False, events_file=None):
    """Each step's peak live total (rounded events) from the step marks:
    first_step_peak_allocated is step 0's, peak_allocated the largest of the
    later steps' (what max_memory_allocated() reports with the peak reset
    before each step). gemm_scratch (the profiler's events only): also the
    largest buffer a GEMM op (GEMMS) allocated and freed inside itself, and
    the peaks without such buffers."""
    mem = [e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
    ops = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                 if e.get("ph") == "X" and (events_file or gemm_scratch))
    starts = [o[0] for o in ops]

    def op_at(e):  # the innermost op (start, end, name) running when e happened
        i = bisect.bisect_right(starts, e["ts"]) - 1
        for j in range(i, max(i - 400, -1), -1):
            if ops[j][1] >= e["ts"]:
                return ops[j]
        return (0, 0, "?")

    if gemm_scratch:  # a GEMM op's own buffers: allocated inside it, freed before it returns
        scratch, opened, largest = set(), {}, 0
        for k, e in enumerate(mem):
            addr, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
            if nbytes > 0:
                opened[addr] = (k, op_at(e), nbytes)
            elif addr in opened:
                k0, op, n = opened.pop(addr)
                if op[2] in GEMMS and op[0] <= e["ts"] <= op[1]:
                    scratch.update((k0, k))
                    largest = max(largest, rounded(n))
        without = replay([e for k, e in enumerate(mem) if k not in scratch], a, n_steps)
        r = replay(events, a, n_steps, events_file=events_file)
        r.update(gemm_scratch=largest, peak_allocated_without_gemm_scratch=without["peak_allocated"],
                 first_step_peak_allocated_without_gemm_scratch=without["first_step_peak_allocated"])
        return r

    live, cur, step = {}, 0, -1
    peaks = [0] * n_steps
    lines = []
    for e in mem:  # the trace keeps the allocator's order
        args = e["args"]
        addr, nbytes = args["Addr"], args["Bytes"]
        if nbytes > 0:
            m = mark_step(nbytes, n_steps)
            if m is not None:
                step = m
                if step < n_steps:
                    peaks[step] = cur
                continue
            live[addr] = rounded(nbytes)
            cur += live[addr]
            if 0 <= step < n_steps:
                peaks[step] = max(peaks[step], cur)
            lines.append((step, live[addr], cur, e))
        else:
            if mark_step(-nbytes, n_steps) is not None or addr not in live:
                continue
            freed = live.pop(addr)
            cur -= freed
            lines.append((step, -freed, cur, e))
    if step != n_steps:
        raise SystemExit("the step marks were not all found in the profiler's trace")
    if events_file:
        with open(events_file, "w") as f:
            for s, b, c, e in lines:
                f.write(f"{s} {b:+d} {c} {op_at(e)[2]}\n")
    return {"first_step_peak_allocated": peaks[0], "peak_allocated": max(peaks[1:]), "step_peaks": peaks,
            "n_events": len(lines)}


def main(argv):
    if argv[:1] == ["--rows"]:
        with open(argv[1]) as f:
            rows = json.load(f)
    else:
        rows = [argv]
    for row in rows:
        a = parse_args(row)
        r, tv, xv = run_ddp(a) if a.ddp else run(a)
        r.update(torch=tv, transformers=xv)
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
