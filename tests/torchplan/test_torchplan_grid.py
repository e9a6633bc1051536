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
    return a


SHIM = os.path.join(os.environ.get("BUILD", os.path.join(ROOT, "build")), "tests", "torchplan",
                    "liballoc_events.so")


def reference(python, rows, shim=False):
    """torch_reference.py over rows in one process (torch imported once);
    one dict per row. shim: its events from alloc_events.c, not the profiler."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([reference_args(r) + (["--shim"] if shim else []) for r in rows], f)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    if shim:
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
    out = reference(T2, list(ROWS.values()))
    print(f"\nreference: {len(ROWS)} rows in {time.time() - t0:.1f} s on torch {out[0]['torch']} + "
          f"transformers {out[0]['transformers']}")
    return dict(zip(ROWS, out))


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


def check_peaks(name, got, ref):
    """Both steps' peaks within 3 % of torch's, never under by more than 1 %."""
    for key in ("peak_allocated", "first_step_peak_allocated"):
        ratio = got[key] / ref[key]
        print(f"{name}: {key} planned {got[key]} torch {ref['torch']} {ref[key]} ratio {ratio:.4f}")
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
    # one GPU's step: two GPUs (a pair's profile or world_size) are refused by name, never planned as one
    for extra, key in (("gpu: t4x2\n", "gpu: t4x2 is 2 GPUs"), ("gpu: t4\nworld_size: 2\n", "world_size: 2")):
        cfg.write_text(config_yaml(dict(TINY, batch=2, seq=64, attn="eager")).replace("device: cpu\n", "") + extra)
        p = subprocess.run([TXK, "plan", str(cfg)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and key in p.stderr and "plans one GPU's step" in p.stderr, p.stderr
