"""pytorch_model.bin read in C with no Python (bert/torchbin.c through the
restricted unpickler): tensors torch.save wrote (Debian's torch; f32, f16,
bf16, an int64 buffer, a strided view and a transposed tensor that share a
storage; the zip format and the legacy one) come back bitwise equal; a pickle
that asks for any other global (os.system) is refused, naming it, and nothing
runs; a truncated file and a storage past the end are errors naming the file."""
import io, os, pickle, subprocess, tempfile, zipfile

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DUMP = os.path.join(ROOT, "build", "bin_dump")


def state_dict():
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    return {
        "a.f32": torch.randn(3, 4),
        "b.f16": torch.randn(5).half(),
        "c.bf16": torch.randn(2, 3).bfloat16(),
        "d.view": base[1:3, ::2],
        "e.transposed": base.t(),
        "f.position_ids": torch.arange(7),
        "g.scalar": torch.tensor(3.5),
    }


def bits(t):
    """the tensor's bytes as integers, so equal means bit for bit (NaN too)"""
    t = t.contiguous()
    as_int = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}.get(t.dtype)
    return t.view(as_int) if as_int else t


def dump(path):
    out = path + ".safetensors"
    r = subprocess.run([DUMP, path, out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    return r, out


@pytest.mark.peer
@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_tensors_read_bitwise_equal(zipped, tmp_path):
    sd = state_dict()
    path = str(tmp_path / "pytorch_model.bin")
    torch.save(sd, path, _use_new_zipfile_serialization=zipped)
    r, out = dump(path)
    assert r.returncode == 0, r.stderr
    got = load_file(out)
    assert set(got) == set(sd)
    for k, want in sd.items():
        assert got[k].dtype == want.dtype and tuple(got[k].shape) == tuple(want.shape), k
        assert torch.equal(bits(got[k]), bits(want)), k


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = os.path.join(tempfile.gettempdir(), "txk-torchbin-pwned")


def test_a_global_outside_the_state_dict_is_refused_and_nothing_runs(tmp_path):
    if os.path.exists(MARKER):
        os.unlink(MARKER)
    payload = pickle.dumps({"w": Evil()}, protocol=2)
    # the zip form: the payload as data.pkl
    zpath = str(tmp_path / "evil_zip.bin")
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_STORED) as z:
        z.writestr("evil_zip/data.pkl", payload)
        z.writestr("evil_zip/version", "3\n")
    # the legacy form: magic, protocol, system info, then the payload
    lpath = str(tmp_path / "evil_legacy.bin")
    with open(lpath, "wb") as f:
        for part in (0x1950a86a20f9469cfc6c, 1001, {"protocol_version": 1001}):
            pickle.dump(part, f, protocol=2)
        f.write(payload)
        pickle.dump([], f, protocol=2)
    for path in (zpath, lpath):
        r, _ = dump(path)
        assert r.returncode == 1
        assert os.path.basename(path) in r.stderr and "system" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert not os.path.exists(MARKER)


@pytest.mark.peer
def test_truncated_and_oversized_files_are_errors(tmp_path):
    sd = state_dict()
    for zipped in (True, False):
        path = str(tmp_path / f"m{int(zipped)}.bin")
        torch.save(sd, path, _use_new_zipfile_serialization=zipped)
        raw = open(path, "rb").read()
        for cut in (len(raw) // 3, len(raw) - 9):
            bad = path + f".cut{cut}"
            with open(bad, "wb") as f:
                f.write(raw[:cut])
            r, _ = dump(bad)
            assert r.returncode == 1 and os.path.basename(bad) in r.stderr, r.stderr
