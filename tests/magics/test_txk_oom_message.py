"""txk advise --from-error and txk plan --gpus from a shell: the pasted seed
message diagnosed (as text, as JSON with exactly the issue's fields), text
that holds no message answered in one line, and the seed's config on each
Colab card equal, byte for byte, to a plan with that card's `gpu:` profile."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
SEED = os.path.join("examples", "seed_colab.yaml")
MSG = os.path.join("tests", "data", "oom_messages", "00_seed_p4.txt")


def txk(*args, stdin=None):
    return subprocess.run([TXK, *args], input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=ROOT, timeout=120)


def test_from_error_json_fields():
    r = txk("advise", "--from-error", MSG, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) == {"requested", "total", "allocated", "reserved", "reserved_unallocated", "free",
                      "process_in_use", "card", "unreliable", "diagnoses", "fixes"}
    assert d["total"] == 7977901752 and d["requested"] == 25165824 and d["card"] == "p4"
    assert d["process_in_use"] is None and d["unreliable"] == []
    ids = [x["id"] for x in d["diagnoses"]]
    assert "headroom" in ids and "card_lottery" in ids, ids
    assert all(set(f) == {"text", "code"} for f in d["fixes"])


def test_from_error_with_config_plans_on_the_card():
    with open(os.path.join(ROOT, MSG), "rb") as f:
        r = txk("advise", SEED, "--from-error", "-", stdin=f.read())
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "fits on T4, P100, V100-16, L4, A100-40; not on K80 or P4" in out
    assert "The config planned on p4:" in out


def test_no_message_one_line():
    for text in (b"", b"\x00\xffnot a message\n", b"CUDA out of memory.", b"x" * (1 << 20)):
        r = txk("advise", "--from-error", "-", stdin=text)
        assert r.returncode == 1 and r.stdout == b"no OOM message found\n", (text[:20], r.stdout, r.stderr)


def test_gpus_colab_equals_gpu_profile_plans():
    r = txk("plan", SEED, "--gpus", "colab", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    names = [c["card"] for c in d["cards"]]
    assert names == ["k80", "p4", "t4", "p100", "v100-16", "l4", "a100-40"]
    for c in d["cards"]:
        p = json.loads(txk("plan", SEED, "--gpu", c["card"], "--json").stdout)
        assert (p["peak_reserved"], p["capacity"], p["fits"], p["margin"]) == \
            (c["peak_reserved"], c["budget"], c["fits"], c["margin"]), c["card"]
    assert d["sentence"] == "fits on T4, P100, V100-16, L4, A100-40; not on K80 or P4: which card the runtime gets decides"
    r = txk("plan", SEED, "--gpus", "mars")
    assert r.returncode == 1 and b"colab, kaggle or all" in r.stderr


def test_fix_auto_for_colab_fits_every_card(tmp_path):
    out = str(tmp_path / "fixed.yaml")
    r = txk("advise", SEED, "--fix", "auto", "--for", "colab", "-o", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(txk("plan", out, "--gpus", "colab", "--json").stdout)
    assert all(c["fits"] and c["margin"] >= c["budget"] // 20 for c in d["cards"]), d["cards"]
    assert d["sentence"].startswith("fits on every card")
    r = txk("advise", SEED, "--fix", "3", "--for", "colab")
    assert r.returncode == 2 and b"--for colab|kaggle|all goes with --fix auto" in r.stderr
