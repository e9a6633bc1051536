"""BERT parity with PyTorch: logits, loss and every parameter gradient.

A tiny random BERT (weights of every kind perturbed away from their init so
that no gradient is trivially zero) is written as an HF folder
(config.json + model.safetensors); the same padded batch goes to the C model
(build/bert_parity, tests/bert/parity_main.c, cpu backend, fp32) and to a
reference written here with HF BertModel's math in float64 torch (transformers
is not installed). Dropout is 0 for the comparison. Agreement is measured per
tensor as max|c - ref| / max|ref| and must be below 1e-4.

Heads: pooled (BertForSequenceClassification), span (BertForQuestionAnswering,
with HF's clamping/ignoring of out-of-range positions), flatten_dense (the
seed's Keras model: each tower's [T, H] output flattened, towers
concatenated, one Dense + softmax cross-entropy). One case stores old-style
names (no "bert." prefix, LayerNorm.gamma/beta) plus the position_ids buffer,
as older checkpoints do.
"""
import json
import math
import os
import subprocess
import zlib

import pytest
import torch

pytestmark = pytest.mark.peer  # on both rows: torch 1.13 and torch 2.x (tests/peers.py)
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
DRIVER = os.path.join(BUILD, "bert_parity")

CFG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           vocab_size=97, max_position_embeddings=24, type_vocab_size=2, layer_norm_eps=1e-12,
           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, hidden_act="gelu",
           model_type="bert")
TOL = 1e-4


def make_weights(head, num_labels, towers, T, gen):
    H, I, L = CFG["hidden_size"], CFG["intermediate_size"], CFG["num_hidden_layers"]
    w = {}

    def lin(name, o, i):
        w[name + ".weight"] = torch.randn(o, i, generator=gen) * 0.1
        w[name + ".bias"] = torch.randn(o, generator=gen) * 0.1

    def ln(name, c):
        w[name + ".weight"] = 1 + torch.randn(c, generator=gen) * 0.1
        w[name + ".bias"] = torch.randn(c, generator=gen) * 0.1

    e = "bert.embeddings."
    w[e + "word_embeddings.weight"] = torch.randn(CFG["vocab_size"], H, generator=gen) * 0.5
    w[e + "position_embeddings.weight"] = torch.randn(CFG["max_position_embeddings"], H, generator=gen) * 0.5
    w[e + "token_type_embeddings.weight"] = torch.randn(2, H, generator=gen) * 0.5
    ln(e + "LayerNorm", H)
    for l in range(L):
        p = f"bert.encoder.layer.{l}."
        for n in ("query", "key", "value"):
            lin(p + "attention.self." + n, H, H)
        lin(p + "attention.output.dense", H, H)
        ln(p + "attention.output.LayerNorm", H)
        lin(p + "intermediate.dense", I, H)
        lin(p + "output.dense", H, I)
        ln(p + "output.LayerNorm", H)
    if head == "pooled":
        lin("bert.pooler.dense", H, H)
        lin("classifier", num_labels, H)
    elif head == "span":
        lin("qa_outputs", 2, H)
    else:
        lin("classifier", num_labels, towers * T * H)
    return {k: v.contiguous() for k, v in w.items()}


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, CFG["layer_norm_eps"])


def bert(w, ids, tt, mask):
    """HF BertModel.forward (absolute positions, erf GELU, additive mask)."""
    B, T = ids.shape
    H, NH = CFG["hidden_size"], CFG["num_attention_heads"]
    HS = H // NH
    e = "bert.embeddings."
    x = (w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][torch.arange(T)]
         + w[e + "token_type_embeddings.weight"][tt])
    x = layer_norm(x, w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"])
    ext = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min

    def lin(name, v):
        return v @ w[name + ".weight"].t() + w[name + ".bias"]

    def heads(v):
        return v.view(B, T, NH, HS).permute(0, 2, 1, 3)

    for l in range(CFG["num_hidden_layers"]):
        p = f"bert.encoder.layer.{l}."
        q, k, v = (heads(lin(p + "attention.self." + n, x)) for n in ("query", "key", "value"))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HS) + ext, dim=-1)
        ctx = (probs @ v).permute(0, 2, 1, 3).reshape(B, T, H)
        a = layer_norm(lin(p + "attention.output.dense", ctx) + x,
                       w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
        f = torch.nn.functional.gelu(lin(p + "intermediate.dense", a))
        x = layer_norm(lin(p + "output.dense", f) + a,
                       w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    return x


def reference(head, w, batch, towers):
    w = {k: v.double().requires_grad_(True) for k, v in w.items()}
    ids, tt, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    T = ids.shape[-1]
    h = bert(w, ids.reshape(-1, T), tt.reshape(-1, T), mask.reshape(-1, T))
    ce = torch.nn.functional.cross_entropy
    if head == "pooled":
        pooled = torch.tanh(h[:, 0] @ w["bert.pooler.dense.weight"].t() + w["bert.pooler.dense.bias"])
        logits = pooled @ w["classifier.weight"].t() + w["classifier.bias"]
        loss = ce(logits, batch["labels"], ignore_index=-100)
    elif head == "span":
        logits = h @ w["qa_outputs.weight"].t() + w["qa_outputs.bias"]   # (B, T, 2)
        s, e = logits[..., 0], logits[..., 1]
        ign = s.size(1)
        sp = batch["start_positions"].clamp(0, ign)
        ep = batch["end_positions"].clamp(0, ign)
        loss = (ce(s, sp, ignore_index=ign) + ce(e, ep, ignore_index=ign)) / 2
    else:
        B = ids.shape[0]
        flat = h.reshape(B, towers * T * CFG["hidden_size"])
        logits = flat @ w["classifier.weight"].t() + w["classifier.bias"]
        loss = ce(logits, batch["labels"])
    loss.backward()
    return logits.detach().reshape(-1), loss.detach(), {k: v.grad for k, v in w.items()}


def rel_err(c, ref):
    """max|c - ref| / max|ref|. The key biases' true gradient is exactly zero
    (softmax ignores a per-row shift), so the scale has a floor of 1e-3: such a
    tensor passes only if fp32 noise stays under 1e-7 absolute."""
    c, ref = c.double().reshape(-1), ref.double().reshape(-1)
    scale = max(ref.abs().max().item(), 1e-3)
    return (c - ref).abs().max().item() / scale


def old_names(w):
    out = {}
    for k, v in w.items():
        k = k[5:] if k.startswith("bert.") else k
        if "LayerNorm.weight" in k:
            k = k.replace("LayerNorm.weight", "LayerNorm.gamma")
        elif "LayerNorm.bias" in k:
            k = k.replace("LayerNorm.bias", "LayerNorm.beta")
        out[k] = v
    out["embeddings.position_ids"] = torch.arange(CFG["max_position_embeddings"])[None, :]
    return out


CASES = [  # id, head, labels, towers, B, T, old-style names
    ("pooled", "pooled", 3, 1, 4, 12, False),
    ("span", "span", 2, 1, 3, 10, False),
    ("flatten_dense", "flatten_dense", 5, 2, 3, 8, False),
    ("pooled_old_names", "pooled", 2, 1, 2, 9, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_parity(case, tmp_path):
    name, head, nl, towers, B, T, old = case
    assert os.access(DRIVER, os.X_OK), f"{DRIVER} is not built (make {DRIVER})"
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    w = make_weights(head, nl, towers, T, gen)
    (tmp_path / "config.json").write_text(json.dumps(CFG))
    save_file(old_names(w) if old else w, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})

    shape = (B, towers, T) if head == "flatten_dense" else (B, T)
    ids = torch.randint(1, CFG["vocab_size"], shape, generator=gen)
    lens = torch.randint(T // 2, T + 1, shape[:-1], generator=gen)
    lens.view(-1)[0] = T
    mask = (torch.arange(T) < lens[..., None]).long()
    ids = ids * mask                          # [PAD] = 0 past each length
    tt = ((torch.arange(T) >= (lens[..., None] // 2)) & (mask > 0)).long()
    batch = {"input_ids": ids, "token_type_ids": tt, "attention_mask": mask}
    if head == "span":
        sp = torch.randint(0, T, (B,), generator=gen)
        sp[-1] = T + 3                         # out of range: ignored, as HF
        batch["start_positions"] = sp
        batch["end_positions"] = torch.clamp(sp + 1, max=T - 1)
    else:
        labels = torch.randint(0, nl, (B,), generator=gen)
        if head == "pooled":
            labels[-1] = -100                  # ignored example
        batch["labels"] = labels
    save_file({k: v.contiguous() for k, v in batch.items()}, str(tmp_path / "batch.safetensors"))

    out = tmp_path / "out.safetensors"
    r = subprocess.run([DRIVER, str(tmp_path), head, str(nl), str(towers), str(T),
                        str(tmp_path / "batch.safetensors"), str(out)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    c = load_file(str(out))

    ref_logits, ref_loss, ref_grads = reference(head, w, batch, towers)
    if head == "span":   # C writes (B, T, 2) like qa_outputs
        ref_logits = ref_logits.reshape(-1)
    errs = {"logits": rel_err(c["logits"], ref_logits),
            "eval_logits": rel_err(c["eval_logits"], ref_logits),
            "loss": rel_err(c["loss"], ref_loss.reshape(1)),
            "eval_loss": rel_err(c["eval_loss"], ref_loss.reshape(1))}
    for k, g in ref_grads.items():
        key = "grad." + k
        assert key in c, f"C did not write {key}"
        assert tuple(c[key].shape) == tuple(g.shape), key
        errs[key] = rel_err(c[key], g)
    bad = {k: v for k, v in errs.items() if not v < TOL}
    assert not bad, f"relative errors above {TOL}: {bad}"
    # Every other gradient of the reference is far from zero, so the check means
    # something. Exact zeros by shift invariance of a softmax: key biases; for the
    # span head also qa_outputs.bias and the last LayerNorm's bias (its gradient
    # is the per-row sum of d logits times a fixed vector).
    zero = ("key.bias",) + (("qa_outputs.bias", f"layer.{CFG['num_hidden_layers'] - 1}.output.LayerNorm.bias")
                            if head == "span" else ())
    small = [k for k, g in ref_grads.items() if not k.endswith(zero) and not g.abs().max() > 1e-3]
    assert not small, f"reference gradients too small to test: {small}"
