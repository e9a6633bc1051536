"""engine: pytorch against PyTorch itself (issue 26): the CPU grid.

Each row is one transformers training configuration. PyTorch (the torch 2.x
row, .venv-t2) runs two real training steps of it on the CPU under its
profiler and replays its own allocator events, each rounded to 512 B
(tests/torchplan/torch_reference.py, all rows in one process, nothing
cached between runs); `txk plan --json` of the same config with
`engine: pytorch, device: cpu` must give a steady-step peak_allocated within
3 % of PyTorch's and never under it by more than 1 %; the first step's peak
is held to the same bounds.

Rows cover bert-tiny to bert-base, 64 to 512 tokens, batch 1 to 16, eager and
sdpa attention (attention dropout 0 for sdpa: the CPU's flash kernel), fp32
and bf16 autocast, gradient checkpointing on and off, classification and QA,
accumulation and frozen embeddings. bf16 matmuls are slow on CPUs without
native bf16, so the bf16 rows are small.

A bf16 row's figures are PyTorch's with its oneDNN GEMMs off: on a CPU with
AVX-512, autocast's aten::mm/addmm go to oneDNN, which takes a scratchpad
of this CPU's own size through c10's allocator for the length of each op
(AMX, AVX512-BF16 and AVX-512 each their own; none without AVX-512, and
none on a card, where cuBLAS runs them and its workspaces are planned), so
the reference also runs the row with torch.backends.mkldnn.enabled = False
(torch_reference.py's top says more). test_bf16_onednn_gemm_scratch holds
the default run to that figure once the buffers each GEMM op allocated and
freed inside itself are taken out, byte for byte, so nothing else of
oneDNN's hides there.

Three rows more (issue 34, torch 2.x only, run in the same process):
dynamic padding on real data (the first 64 reviews of
tests/data/reviews_train.csv through a BertTokenizerFast of
tests/data/vocab_uncased.txt and DataCollatorWithPadding, batched in file
order: every batch a step; the plan reads the same file with batching:
dynamic and plans the longest batch, which must be the reference's longest,
its steady peak the reference's largest after the first step, and its first
step at least the reference's); torch.optim.AdamW(fused=True), as
transformers 5's Trainer runs it; and DistributedDataParallel over two gloo
ranks on 127.0.0.1 (rank 1 in a second process), as the Trainer wraps it
(find_unused_parameters without checkpointing), its events from
alloc_events.c (gloo frees some tensors on its own threads, which the
profiler does not trace), held per rank.

The torch 1.13 row (.venv, Debian's build) has no kineto, so its profiler
cannot give these events; test_torchplan_torch1.py reads them there with
tests/torchplan/alloc_events.c instead and holds `torch_version: 1.13` to
the same bounds on these rows.
"""
import json, os, subprocess, tempfile, time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TXK = os.path.join(os.environ.get("BUILD", os.path.join(ROOT, "build")), "txk")
T2 = os.path.join(ROOT, ".venv-t2", "bin", "python")
REF = os.path.join(ROOT, "tests", "torchplan", "torch_reference.py")

# bert-tiny's and bert-mini's shapes; most rows take a smaller vocabulary than
# their 30522 so that the activations, not AdamW's step over the word
# embeddings, make the peak (the base rows keep bert-base-cased's).
TINY = dict(layers=2, hidden=128, heads=2, intermediate=512, vocab=1000)
MINI = dict(layers=4, hidden=256, heads=4, intermediate=1024, vocab=4000)
SMALL = dict(layers=4, hidden=512, heads=8, intermediate=2048)
BASE = dict(layers=12, hidden=768, heads=12, intermediate=3072, vocab=28996)

ROWS = {
    "tiny-16x128-eager": dict(TINY, batch=16, seq=128, attn="eager"),
    "tiny-1x512-sdpa-qa": dict(TINY, batch=1, seq=512, attn="sdpa", task="qa"),
    "tiny-4x64-eager-bf16-qa": dict(TINY, batch=4, seq=64, attn="eager", precision="bf16", task="qa"),
    "tiny-2x128-sdpa-bf16-ckpt": dict(TINY, batch=2, seq=128, attn="sdpa", precision="bf16", ckpt=True),
    "mini-8x256-eager-ckpt": dict(MINI, batch=8, seq=256, attn="eager", ckpt=True),
    "mini-16x64-sdpa-v30522": dict(MINI, batch=16, seq=64, attn="sdpa", vocab=30522),
    "mini-4x128-eager-acc2-frozen-emb": dict(MINI, batch=4, seq=128, attn="eager", acc=2, frozen=True),
    "small-4x256-sdpa-qa-ckpt": dict(SMALL, batch=4, seq=256, attn="sdpa", task="qa", ckpt=True),
    "base-1x64-sdpa": dict(BASE, batch=1, seq=64, attn="sdpa"),
    "base-2x512-eager": dict(BASE, batch=2, seq=512, attn="eager"),
}

REVIEWS = os.path.join(ROOT, "tests", "data", "reviews_train.csv")
VOCAB = os.path.join(ROOT, "tests", "data", "vocab_uncased.txt")
# torch 2.x only (issue 34): dynamic padding on real data, fused AdamW, two DDP ranks
EXTRA = {
    "tiny-8xdyn-eager-reviews": dict(TINY, vocab=4000, batch=8, seq=512, attn="eager", data=REVIEWS, examples=64),
    "mini-2x64-sdpa-v30522-fused": dict(MINI, batch=2, seq=64, attn="sdpa", vocab=30522, optim="adamw_fused"),
    "tiny-8x128-eager-ddp2": dict(TINY, batch=8, seq=128, attn="eager", ddp=2, shim=True),
}


def config_yaml(r):
    lines = ["engine: pytorch", "device: cpu", "model: bert-base-cased", "init: random",
             f"hidden: {r['hidden']}", f"layers: {r['layers']}", f"heads: {r['heads']}",
             f"intermediate: {r['intermediate']}", f"vocab_size: {r.get('vocab', 30522)}", "max_position: 512",
             "type_vocab: 2", f"batch_size: {r['batch']}", f"max_len: {r['seq']}", "num_labels: 2",
             f"attn_implementation: {r['attn']}", "dropout: 0.1", f"precision: {r.get('precision', 'fp32')}",
             f"recompute: {'layers' if r.get('ckpt') else 'none'}", f"accumulate: {r.get('acc', 1)}"]
    if r["attn"] == "sdpa":
        lines.append("attention_dropout: 0")
    if r.get("task") == "qa":
        lines += ["task: qa", "head: span"]
    if r.get("frozen"):
        lines.append("freeze: embeddings")
    if r.get("optim") == "adamw_fused":
        lines.append("optimizer: adamw_torch_fused")
    if r.get("data"):
        lines += [f"train_file: {r['data']}", f"vocab: {VOCAB}", "dev_split: 0", f"max_examples: {r['examples']}",
                  f"batching: {r.get('batching', 'dynamic')}"]
    if r.get("ddp"):
        lines += [f"world_size: {r['ddp']}", "parallel: ddp"]
    return "\n".join(lines) + "\n"


def reference_args(r):
    a = ["--layers", str(r["layers"]), "--hidden", str(r["hidden"]), "--heads", str(r["heads"]),
         "--intermediate", str(r["intermediate"]), "--vocab", str(r.get("vocab", 30522)), "--batch", str(r["batch"]),
         "--seq", str(r["seq"]), "--attn", r["attn"], "--task", r.get("task", "classify"),
         "--precision", r.get("precision", "fp32"), "--dropout", "0.1", "--accumulate", str(r.get("acc", 1))]
    if r["attn"] == "sdpa":
        a += ["--attention-dropout", "0"]
    if r.get("ckpt"):
        a.append("--checkpointing")
    if r.get("frozen"):
        a.append("--freeze-embeddings")
    if r.get("optim"):
        a += ["--optim", r["optim"]]
    if r.get("data"):
        a += ["--data", r["data"], "--vocab-file", VOCAB, "--examples", str(r["examples"])]
    if r.get("ddp"):
        # the Trainer's find_unused_parameters: on unless gradient checkpointing is
        a += ["--ddp", str(r["ddp"])] + ([] if r.get("ckpt") else ["--find-unused"])
    if r.get("shim"):
        a.append("--shim")
    return a


SHIM = os.path.join(os.environ.get("BUILD", os.path.join(ROOT, "build")), "tests", "torchplan",
                    "liballoc_events.so")


def reference(python, rows, shim=False):
    """torch_reference.py over rows in one process (torch imported once);
    one dict per row. shim: its events from alloc_events.c, not the profiler."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([reference_args(r) + (["--shim"] if shim else []) for r in rows], f)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    if shim or any(r.get("shim") for r in rows):
        assert os.path.exists(SHIM), f"{SHIM} is missing: make all builds it"
        env["LD_PRELOAD"] = SHIM
    try:
        p = subprocess.run([python, REF, "--rows", f.name], capture_output=True, text=True, timeout=600, env=env)
    finally:
        os.unlink(f.name)
    assert p.returncode == 0, p.stderr[-3000:]
    out = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(out) == len(rows), p.stdout
    return out


@pytest.fixture(scope="module")
def pytorch_figures():
    """PyTorch's own peaks for every row, from one run of the reference."""
    assert os.access(T2, os.X_OK), f"{T2} is missing (scripts/deps.sh installs the torch 2.x row)"
    t0 = time.time()
    rows = dict(ROWS, **EXTRA)
    out = reference(T2, list(rows.values()))
    print(f"\nreference: {len(rows)} rows in {time.time() - t0:.1f} s on torch {out[0]['torch']} + "
          f"transformers {out[0]['transformers']}")
    return dict(zip(rows, out))


def plan(tmp_path, r, extra=""):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(config_yaml(r) + extra)
    p = subprocess.run([TXK, "plan", str(cfg), "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("name", list(ROWS))
def test_grid_row(name, pytorch_figures, tmp_path):
    ref = pytorch_figures[name]
    got = plan(tmp_path, ROWS[name])
    assert got["engine"] == "pytorch" and got["device"] == "cpu" and got["torch_version"] == "2.x"
    check_peaks(name, got, ref)


@pytest.mark.parametrize("name", [n for n, r in ROWS.items() if r.get("precision") == "bf16"])
def test_bf16_onednn_gemm_scratch(name, pytorch_figures):
    """The bf16 row as PyTorch runs it by default on this CPU differs from
    its figure (oneDNN's GEMMs off) by the GEMM ops' own scratch only."""
    ref = pytorch_figures[name]
    d = ref["onednn"]
    print(f"{name}: peak_allocated with oneDNN's GEMMs {d['peak_allocated']}, without {ref['peak_allocated']}; "
          f"largest scratch of one GEMM op {d['gemm_scratch']} B")
    for key in ("peak_allocated", "first_step_peak_allocated"):
        assert d[f"{key}_without_gemm_scratch"] == ref[key], (key, d, ref[key])
        assert ref[key] <= d[key] <= ref[key] + d["gemm_scratch"], (key, d, ref[key])


def test_dynamic_padding_row(pytorch_figures, tmp_path):
    """The longest batch of real, variable-length data through
    DataCollatorWithPadding: the plan takes the same longest example, and its
    steady step is the reference's largest after the first; its first step
    (planned at the longest batch too) is at least the reference's, whose
    first batch is shorter."""
    name = "tiny-8xdyn-eager-reviews"
    ref, got = pytorch_figures[name], plan(tmp_path, EXTRA[name])
    assert got["seq"] == max(ref["seqs"]) < EXTRA[name]["seq"], (got["seq"], ref["seqs"])
    assert ref["step_peaks"].index(max(ref["step_peaks"][1:])) == ref["seqs"].index(max(ref["seqs"]))
    check_peaks(name, got, ref, keys=("peak_allocated",))
    assert got["first_step_peak_allocated"] >= ref["first_step_peak_allocated"]


def test_fused_adamw_row(pytorch_figures, tmp_path):
    name = "mini-2x64-sdpa-v30522-fused"
    got = plan(tmp_path, EXTRA[name])
    assert got["optimizer"] == "AdamW (fused)", got["optimizer"]
    check_peaks(name, got, pytorch_figures[name])


def test_ddp_two_gloo_ranks(pytorch_figures, tmp_path):
    """Each rank of DistributedDataParallel over gloo, as PyTorch allocates it."""
    name = "tiny-8x128-eager-ddp2"
    ref, got = pytorch_figures[name], plan(tmp_path, EXTRA[name])
    assert got["parallel"] == "DDP" and got["world_size"] == 2 and "gloo" in got["checked"], got
    assert len(ref["ranks"]) == 2
    for i, rank in enumerate(ref["ranks"]):
        check_peaks(f"{name} rank {i}", got, rank)


def check_peaks(name, got, ref, keys=("peak_allocated", "first_step_peak_allocated")):
    """Both steps' peaks within 3 % of torch's, never under by more than 1 %."""
    for key in keys:
        ratio = got[key] / ref[key]
        print(f"{name}: {key} planned {got[key]} torch {ref.get('torch', '')} {ref[key]} ratio {ratio:.4f}")
        if "onednn" in ref:  # a bf16 row: what oneDNN's GEMMs add on this CPU (not planned: see the top)
            print(f"{name}: {key} with oneDNN's GEMMs {ref['onednn'][key]} (ratio {got[key] / ref['onednn'][key]:.4f})")
        assert 0.99 <= ratio <= 1.03, f"{name}: {key} planned {got[key]} B, torch {ref[key]} B (ratio {ratio:.4f})"


def test_engine_names_itself_and_versions(tmp_path):
    """The text plan says which engine and which versions it follows."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(config_yaml(dict(TINY, batch=2, seq=64, attn="eager")) + "torch_version: 1.13\n")
    p = subprocess.run([TXK, "plan", str(cfg)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "engine: pytorch" in p.stdout and "torch 1.13 + transformers 4.40" in p.stdout, p.stdout


def test_options_it_does_not_model_are_errors(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(config_yaml(dict(TINY, batch=2, seq=64, attn="eager")) + "head: flatten_dense\n")
    p = subprocess.run([TXK, "plan", str(cfg)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "head: flatten_dense" in p.stderr, p.stderr
    # two ranks on the cpu are DDP's gloo ranks; DataParallel and ZeRO-2 need CUDA GPUs
    cfg.write_text(config_yaml(dict(TINY, batch=2, seq=64, attn="eager")) + "world_size: 2\n")
    p = subprocess.run([TXK, "plan", str(cfg)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "parallel: dataparallel runs on CUDA GPUs" in p.stderr, p.stderr


def test_dynamic_plans_the_fixed_plan_at_the_longest(tmp_path):
    """batching: dynamic on a data file whose longest example is L tokens is
    the fixed plan at max_len: L of the same file, figure for figure; without
    data it plans max_len and says so."""
    r = dict(TINY, vocab=4000, batch=8, seq=512, attn="eager", data=REVIEWS, examples=64)
    dyn = plan(tmp_path, r)
    L = dyn["seq"]
    assert L < 512 and "longest example of 64" in dyn["seq_from"], dyn["seq_from"]
    fixed = plan(tmp_path, dict(r, seq=L, batching="fixed"))
    assert fixed["seq"] == L and fixed["seq_from"].startswith("max_len"), fixed["seq_from"]
    for key in ("peak_allocated", "first_step_peak_allocated", "peak_reserved", "param_bytes", "grad_bytes",
                "optim_bytes", "attention"):
        assert dyn[key] == fixed[key], (key, dyn[key], fixed[key])
    cfg = tmp_path / "nodata.yaml"
    cfg.write_text(config_yaml(dict(TINY, batch=8, seq=512, attn="eager")) + "batching: dynamic\n")
    p = subprocess.run([TXK, "plan", str(cfg)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "batch 8 x seq 512" in p.stdout and "without data" in p.stdout, p.stdout + p.stderr


def test_two_gpus_are_planned_per_gpu(tmp_path):
    """txk plan CFG engine=pytorch gpu=t4x2 parallel=...: each GPU's figures,
    the strategy named and how it is known (DDP: checked against gloo ranks;
    DataParallel and ZeRO-2: not measured)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(config_yaml(dict(TINY, batch=8, seq=128, attn="sdpa")).replace("device: cpu\n", "")
                   .replace("precision: fp32", "precision: fp16"))
    want = {"dataparallel": ("2 GPUs, DataParallel", "GPU 0:", "GPU 1:", "not measured"),
            "ddp": ("2 GPUs, DDP", "each of the 2 ranks:", "gloo"),
            "zero2": ("2 GPUs, DeepSpeed ZeRO-2", "each of the 2 GPUs:", "not measured", "DeepSpeed's own estimate")}
    for parallel, words in want.items():
        p = subprocess.run([TXK, "plan", str(cfg), "engine=pytorch", "gpu=t4x2", f"parallel={parallel}"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        for w in words:
            assert w in p.stdout, (parallel, w, p.stdout)
        j = json.loads(subprocess.run([TXK, "plan", str(cfg), "gpu=t4x2", f"parallel={parallel}", "--json"],
                                      capture_output=True, text=True, timeout=60).stdout)
        assert j["world_size"] == 2 and len(j["gpus"]) == (2 if parallel == "dataparallel" else 1), j
        assert j["peak_reserved"] == max(g["peak_reserved"] for g in j["gpus"])
    # --gpus kaggle plans the pair too
    p = subprocess.run([TXK, "plan", str(cfg), "--gpus", "kaggle"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "t4x2 (DataParallel)" in p.stdout and "not measured" in p.stdout, p.stdout
