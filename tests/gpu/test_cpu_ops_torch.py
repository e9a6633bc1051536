"""The cpu backend's ops against PyTorch (CPU, float32).

torch makes the inputs and the reference results (autograd for every
backward, torch.optim.AdamW for the optimizer); the ops run in the C test
binary in its `--torch DIR` mode, which reads DIR/in.bin and writes
DIR/out.bin (records: 32-byte name, i32 kind 0=f32/1=i32, i64 count, data).
Tolerance: 1e-5 relative (plus a small absolute floor for values near 0;
GEMMs sum in another order, so 1e-4 there).
"""
import os
import struct
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD, "tests", "gpu", "test_cpu_ops")


def write_recs(path, recs):
    with open(path, "wb") as f:
        for name, arr in recs.items():
            arr = np.ascontiguousarray(arr)
            kind = 1 if arr.dtype == np.int32 else 0
            arr = arr.astype(np.int32 if kind else np.float32).ravel()
            f.write(name.encode().ljust(32, b"\0"))
            f.write(struct.pack("<iq", kind, arr.size))
            f.write(arr.tobytes())


def read_recs(path):
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while off < len(data):
        name = data[off:off + 32].rstrip(b"\0").decode()
        kind, n = struct.unpack_from("<iq", data, off + 32)
        off += 44
        out[name] = np.frombuffer(data[off:off + 4 * n], dtype=np.int32 if kind else np.float32)
        off += 4 * n
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if not os.path.exists(BIN):
        pytest.fail(f"{BIN} is not built; run make first")
    torch.manual_seed(1234)
    Bt, M, N, K = 3, 17, 23, 31
    B, NH, T = 2, 3, 12
    R, C, V = 40, 24, 19
    ref, inp = {}, {}
    inp["dims"] = np.array([Bt, M, N, K, B, NH, T, V, R, C], dtype=np.int32)

    A, Bm, bias = torch.randn(Bt, M, K), torch.randn(Bt, N, K), torch.randn(N)
    A2 = torch.randn(Bt, K, M)
    inp.update(A=A, B=Bm, A2=A2, bias=bias)
    ref["gemm"] = torch.baddbmm(bias.expand(Bt, M, N), A, Bm.transpose(1, 2))
    ref["gemm_tA"] = 0.5 * torch.bmm(A2.transpose(1, 2), Bm.transpose(1, 2))

    x = (torch.randn(R, C) * 3 + 1).requires_grad_()
    w, b = torch.randn(C).requires_grad_(), torch.randn(C).requires_grad_()
    dy = torch.randn(R, C)
    y = F.layer_norm(x, (C,), w, b, 1e-12)
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), dy)
    inp.update(ln_x=x, ln_w=w, ln_b=b, ln_dy=dy)
    ref.update(ln_y=y, ln_dx=gx, ln_dw=gw, ln_db=gb)

    ex = (torch.randn(4000) * 4).requires_grad_()
    ed = torch.randn(4000)
    g = F.gelu(ex)
    th = torch.tanh(ex)
    inp.update(ew_x=ex, ew_d=ed)
    ref.update(gelu=g, gelu_dx=torch.autograd.grad(g, ex, ed)[0],
               tanh=th, tanh_dx=torch.autograd.grad(th, ex, ed)[0])

    sx = (torch.randn(B, NH, T, T) * 8).requires_grad_()
    mask = torch.ones(B, T, dtype=torch.int32)
    mask[1, 7:] = 0
    sd = torch.randn(B, NH, T, T)
    ext = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    sy = torch.softmax(sx * 0.125 + ext, dim=-1)
    inp.update(sm_x=sx, sm_mask=mask.numpy(), sm_d=sd)
    ref.update(sm_y=sy, sm_dx=torch.autograd.grad(sy, sx, sd)[0])

    logits = (torch.randn(R, V) * 5).requires_grad_()
    labels = torch.randint(0, V, (R,), dtype=torch.int64)
    labels[3] = labels[11] = -100
    loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="none")
    mean_loss = F.cross_entropy(logits, labels, ignore_index=-100)
    inp.update(xe_logits=logits, xe_labels=labels.to(torch.int32).numpy())
    ref.update(xe_loss=loss, xe_dlogits=torch.autograd.grad(mean_loss, logits)[0])

    ids = torch.randint(0, V, (R,), dtype=torch.int64)
    edy = torch.randn(R, C)
    inp.update(emb_ids=ids.to(torch.int32).numpy(), emb_dy=edy)
    ref["emb_dtable"] = torch.zeros(V, C).index_add_(0, ids, edy)
    ref["bias_grad"] = edy.sum(0)

    p = torch.randn(1000)
    grads = torch.randn(3, 1000)
    inp.update(adam_p=p.clone(), adam_g=grads)
    pt = p.clone().requires_grad_()
    opt = torch.optim.AdamW([pt], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for s in range(3):
        pt.grad = grads[s].clone()
        opt.step()
    ref["adam_p"] = pt

    d = tmp_path_factory.mktemp("cpu_ops_torch")
    write_recs(d / "in.bin", {k: (v.detach().numpy() if torch.is_tensor(v) else v) for k, v in inp.items()})
    r = subprocess.run([BIN, "--torch", str(d)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = read_recs(d / "out.bin")
    return got, {k: v.detach().numpy().ravel() for k, v in ref.items()}


TOL = {"gemm": (1e-4, 1e-4), "gemm_tA": (1e-4, 1e-4), "ln_dx": (1e-5, 1e-5), "ln_dw": (1e-5, 1e-5),
       "ln_db": (1e-5, 1e-5), "emb_dtable": (1e-5, 1e-5), "bias_grad": (1e-5, 1e-5),
       "sm_dx": (1e-5, 1e-6), "xe_dlogits": (1e-5, 1e-7)}

NAMES = ["gemm", "gemm_tA", "ln_y", "ln_dx", "ln_dw", "ln_db", "gelu", "gelu_dx", "tanh", "tanh_dx",
         "sm_y", "sm_dx", "xe_loss", "xe_dlogits", "emb_dtable", "bias_grad", "adam_p"]


@pytest.mark.parametrize("name", NAMES)
def test_matches_torch(results, name):
    got, ref = results
    assert name in got, f"the runner wrote no {name}"
    rtol, atol = TOL.get(name, (1e-5, 1e-6))
    g, r = got[name], ref[name]
    assert g.shape == r.shape
    np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, err_msg=name)
