"""`model:` from the HF hub and its cache (bert/hub.c), against a hub this test
serves on 127.0.0.1: the resolve API /{repo}/resolve/{revision}/{file} with
the headers huggingface_hub reads (X-Repo-Commit, ETag, X-Linked-Etag,
X-Linked-Size), a redirect for LFS files to a second server (the CDN), Range requests, the revision and
tree listings snapshot_download asks for, and a log of every request. The
tests marked `peer` run with huggingface_hub 0.x (torch1 row) and 2.x
(torch2 row, tests/peers.py). No traffic leaves 127.0.0.1."""
import hashlib, http.server, json, os, re, subprocess, sys, threading

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TXK = os.environ.get("TXK_BIN") or os.path.join(ROOT, "build", "txk")
DATA = os.path.join(ROOT, "tests", "data")
REPO = "some-org/tiny-bert"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS = (".safetensors", ".bin")


def tiny_repo():
    """config.json, vocab.txt (words of the training texts), tokenizer files and
    model.safetensors of a 2-layer, 32-wide BERT with N(0, 0.02) weights."""
    from safetensors.numpy import save
    words = {}
    with open(os.path.join(DATA, "reviews_train.csv")) as f:
        for w in re.findall(r"[a-z]+", f.read().lower()):
            words[w] = words.get(w, 0) + 1
    letters = [chr(c) for c in range(97, 123)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(".,!?:'\"") + letters + ["##" + c for c in letters]
    vocab += sorted(w for w in words if w not in vocab)[:400]
    H, L, I, V = 32, 2, 64, len(vocab)
    cfg = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": H, "num_hidden_layers": L,
           "num_attention_heads": 2, "intermediate_size": I, "vocab_size": V, "max_position_embeddings": 64,
           "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12}
    rng = np.random.default_rng(7)
    t = {}

    def lin(name, o, i):
        t[name + ".weight"] = (rng.standard_normal((o, i)) * 0.02).astype(np.float32)
        t[name + ".bias"] = np.zeros(o, np.float32)

    def ln(name):
        t[name + ".weight"] = np.ones(H, np.float32)
        t[name + ".bias"] = np.zeros(H, np.float32)

    for n, rows in (("word", V), ("position", 64), ("token_type", 2)):
        t[f"bert.embeddings.{n}_embeddings.weight"] = (rng.standard_normal((rows, H)) * 0.02).astype(np.float32)
    ln("bert.embeddings.LayerNorm")
    for l in range(L):
        p = f"bert.encoder.layer.{l}."
        for q in ("query", "key", "value"):
            lin(p + "attention.self." + q, H, H)
        lin(p + "attention.output.dense", H, H)
        ln(p + "attention.output.LayerNorm")
        lin(p + "intermediate.dense", I, H)
        lin(p + "output.dense", H, I)
        ln(p + "output.LayerNorm")
    lin("bert.pooler.dense", H, H)
    return {"config.json": json.dumps(cfg).encode(), "vocab.txt": ("\n".join(vocab) + "\n").encode(),
            "tokenizer_config.json": json.dumps({"do_lower_case": True}).encode(),
            "model.safetensors": save(t, metadata={"format": "pt"})}


class Hub:
    """The hub's resolve API for a set of repos, with knobs for failures."""

    def __init__(self, repos):
        self.repos, self.log, self.token = repos, [], None
        self.cut = None        # (file, n): the next GET of file sends n bytes, then hangs up
        self.corrupt = set()   # files whose bytes go out with one byte flipped
        self.listing = True    # False: no file list (/api/models/...), as an old mirror
        hub = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def send(self, code, headers, data=b"", body=True):
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if body and data:
                    self.wfile.write(data)

            def answer(self, body):
                hub.log.append((self.command, self.path, self.headers.get("Range")))
                # the LFS store's URLs are signed, as the hub's CDN's are: no token there
                if hub.token and self.headers.get("Authorization") != "Bearer " + hub.token \
                        and not self.path.startswith("/lfs/"):
                    return self.send(401, {"X-Error-Message": "Invalid credentials", "Content-Length": "0"}, body=body)
                m = re.match(r"^/api/models/([^/]+/[^/]+)/revision/([^/]+)$", self.path)
                if m and not hub.listing:
                    return self.send(404, {"Content-Length": "0"}, body=body)
                if m:  # what snapshot_download lists
                    files = hub.repos.get(m.group(1))
                    if files is None:
                        return self.send(404, {"X-Error-Code": "RepoNotFound", "Content-Length": "0"})
                    js = json.dumps({"id": m.group(1), "sha": COMMIT,
                                     "siblings": [{"rfilename": f} for f in files]}).encode()
                    return self.send(200, {"Content-Type": "application/json", "Content-Length": str(len(js))}, js)
                m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/?]+)(?:\?.*)?$", self.path)
                if m:  # what huggingface_hub 1.x+ snapshot_download lists (one page, no Link header)
                    files = hub.repos.get(m.group(1))
                    if files is None:
                        return self.send(404, {"X-Error-Code": "RepoNotFound", "Content-Length": "0"})
                    tree = []
                    for f, data in files.items():
                        e = {"type": "file", "path": f, "size": len(data),
                             "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
                        if f.endswith(LFS):
                            e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                        tree.append(e)
                    js = json.dumps(tree).encode()
                    return self.send(200, {"Content-Type": "application/json", "Content-Length": str(len(js))}, js)
                m = re.match(r"^/lfs/([0-9a-f]{64})$", self.path)
                if m:
                    return self.lfs(m.group(1), body)
                m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", self.path)
                if not m:
                    return self.send(404, {"Content-Length": "0"}, body=body)
                repo, rev, name = m.groups()
                files = hub.repos.get(repo)
                if files is None:
                    return self.send(404, {"X-Error-Code": "RepoNotFound", "Content-Length": "0"}, body=body)
                if rev not in ("main", COMMIT):
                    return self.send(404, {"X-Error-Code": "RevisionNotFound", "Content-Length": "0"}, body=body)
                if name not in files:
                    return self.send(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT,
                                           "Content-Length": "0"}, body=body)
                data = files[name]
                h = {"X-Repo-Commit": COMMIT}
                if name.endswith(LFS):
                    sha = hashlib.sha256(data).hexdigest()
                    h.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                              "ETag": '"%s"' % hashlib.sha1(name.encode()).hexdigest(),
                              "Location": f"http://127.0.0.1:{hub.cdn_port}/lfs/{sha}", "Content-Length": "0"})
                    return self.send(302, h, body=body)
                blob = b"blob %d\0" % len(data) + data
                h.update({"ETag": '"%s"' % hashlib.sha1(blob).hexdigest(), "Content-Length": str(len(data))})
                self.send(200, h, data, body)

            def lfs(self, sha, body):
                hits = [(n, d) for files in hub.repos.values() for n, d in files.items()
                        if hashlib.sha256(d).hexdigest() == sha]
                if not hits:
                    return self.send(404, {"Content-Length": "0"}, body=body)
                name, data = hits[0]
                if name in hub.corrupt:
                    data = bytes([data[0] ^ 1]) + data[1:]
                start = 0
                rg = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
                if rg:
                    start = int(rg.group(1))
                part = data[start:]
                h = {"Content-Length": str(len(part))}
                if rg:
                    h["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                if hub.cut and hub.cut[0] == name and body:
                    n = hub.cut[1]
                    hub.cut = None
                    self.send_response(206 if rg else 200)
                    for k, v in h.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(part[:n])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.send(206 if rg else 200, h, part, body)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # LFS files are served from another origin, as the hub's CDN: huggingface_hub
        # 1.x+ follows a redirect to the same origin and reads the file's metadata
        # there, but stops at one to another and reads it from the 302
        self.cdn = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.cdn_port = self.cdn.server_address[1]
        for srv in (self.srv, self.cdn):
            threading.Thread(target=srv.serve_forever, daemon=True).start()


def sharded(files):
    """The same model as two shards and their index, as transformers writes a big one."""
    from safetensors.numpy import load, save
    t = load(files["model.safetensors"])
    names = sorted(t)
    half = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    out = {k: v for k, v in files.items() if k != "model.safetensors"}
    for shard, ns in half.items():
        out[shard] = save({n: t[n] for n in ns}, metadata={"format": "pt"})
    out["model.safetensors.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": {n: shard for shard, ns in half.items() for n in ns}}).encode()
    return out


def torch_bin(safetensors_bytes):
    """The same weights as torch.save writes them (pytorch_model.bin)."""
    import io
    import torch
    from safetensors.torch import load
    buf = io.BytesIO()
    torch.save(load(safetensors_bytes), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def hub():
    files = tiny_repo()
    only_bin = {k: v for k, v in files.items() if k != "model.safetensors"}
    only_bin["pytorch_model.bin"] = torch_bin(files["model.safetensors"])
    h = Hub({REPO: files, "some-org/sharded-bert": sharded(files), "some-org/bin-bert": only_bin})
    yield h
    h.srv.shutdown()
    h.cdn.shutdown()


@pytest.fixture
def env(tmp_path, hub):
    hub.log.clear()
    hub.token, hub.cut, hub.corrupt, hub.listing = None, None, set(), True
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    e.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "home"),
             HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    return e


def cfg(tmp_path, model, extra=""):
    p = tmp_path / ("cfg%d.yaml" % len(list(tmp_path.glob("cfg*.yaml"))))
    p.write_text(f"model: {model}\ntrain_file: {DATA}/reviews_train.csv\ndev_file: {DATA}/reviews_dev.csv\n"
                 f"max_examples: 64\nmax_len: 32\nbatch_size: 16\nepochs: 1\nmax_steps: 2\ndevice: cpu\n"
                 f"threads: 1\n{extra}")
    return str(p)


def txk(env, *args):
    r = subprocess.run([TXK, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def snapshot(env):
    return os.path.join(env["HF_HUB_CACHE"], "models--some-org--tiny-bert", "snapshots", COMMIT)


@pytest.mark.peer
def test_train_downloads_and_huggingface_hub_finds_it(tmp_path, env, hub):
    import huggingface_hub as hh
    rc, out = txk(env, "train", cfg(tmp_path, REPO))
    assert rc == 0, out
    assert f"model: {REPO} (revision main, commit {COMMIT[:12]}): downloaded" in out
    assert "weights: loaded" in out and "random init" not in out
    assert "vocabulary: " + snapshot(env) in out
    assert re.search(r"download model\.safetensors: .* of ", out)
    # HF's layout: refs/main holds the commit, snapshot files are relative links into blobs/
    repo_dir = os.path.join(env["HF_HUB_CACHE"], "models--some-org--tiny-bert")
    assert open(os.path.join(repo_dir, "refs", "main")).read() == COMMIT
    link = os.readlink(os.path.join(snapshot(env), "model.safetensors"))
    assert link == "../../blobs/" + hashlib.sha256(hub.repos[REPO]["model.safetensors"]).hexdigest()
    # the LFS file went HEAD (302) then GET on the redirect; the repo's file list was asked (for the small
    # files, then for the weights once the plan fit), so the files it lacks (special_tokens_map.json,
    # tokenizer.json) never were
    assert ("GET", "/lfs/" + link.split("/")[-1], None) in hub.log
    assert {p for m, p, _ in hub.log if p.startswith("/api/models/")} == {f"/api/models/{REPO}/revision/{COMMIT}"}
    assert not any(p.endswith(("special_tokens_map.json", "tokenizer.json")) for _, p, _ in hub.log), hub.log
    # huggingface_hub finds txk's files in the same cache, with no request
    n = len(hub.log)
    for f in ("config.json", "vocab.txt", "model.safetensors"):
        assert hh.try_to_load_from_cache(REPO, f, cache_dir=env["HF_HUB_CACHE"]) == os.path.join(snapshot(env), f)
    assert hh.snapshot_download(REPO, cache_dir=env["HF_HUB_CACHE"], local_files_only=True) == snapshot(env)
    # and txk trains again from the cache alone
    rc, out = txk(env, "train", cfg(tmp_path, REPO))
    assert rc == 0 and "from the HF cache" in out, out
    assert len(hub.log) == n, hub.log[n:]


@pytest.mark.peer
def test_txk_uses_a_cache_huggingface_hub_filled_without_a_request(tmp_path, env, hub):
    from huggingface_hub import snapshot_download
    cache = env["HF_HUB_CACHE"]
    got = snapshot_download(REPO, cache_dir=cache, endpoint=hub.url)
    assert got == snapshot(env) and os.path.islink(os.path.join(got, "model.safetensors"))
    hub.log.clear()
    rc, out = txk(env, "train", cfg(tmp_path, REPO))
    assert rc == 0 and "from the HF cache" in out and "weights: loaded" in out, out
    assert hub.log == []
    # so does a plan, which never downloads
    rc, out = txk(env, "plan", cfg(tmp_path, REPO))
    assert rc == 0 and hub.log == [], out


def test_interrupted_download_resumes_with_a_range_request(tmp_path, env, hub):
    size = len(hub.repos[REPO]["model.safetensors"])
    hub.cut = ("model.safetensors", 4096)
    rc, out = txk(env, "train", cfg(tmp_path, REPO))
    assert rc == 1 and "broke off after 4096 of %d bytes" % size in out and "resumes" in out, out
    blobs = os.path.join(env["HF_HUB_CACHE"], "models--some-org--tiny-bert", "blobs")
    part = [f for f in os.listdir(blobs) if f.endswith(".incomplete")]
    assert len(part) == 1 and os.path.getsize(os.path.join(blobs, part[0])) == 4096
    rc, out = txk(env, "train", cfg(tmp_path, REPO))
    assert rc == 0 and "weights: loaded" in out, out
    assert any(m == "GET" and p.startswith("/lfs/") and r == "bytes=4096-" for m, p, r in hub.log), hub.log
    assert not [f for f in os.listdir(blobs) if f.endswith(".incomplete")]


def test_corrupted_bytes_are_detected_in_transit_and_in_the_cache(tmp_path, env, hub):
    hub.corrupt = {"model.safetensors"}
    rc, out = txk(env, "train", cfg(tmp_path, REPO))
    assert rc == 1 and "corrupted in transit" in out, out
    blobs = os.path.join(env["HF_HUB_CACHE"], "models--some-org--tiny-bert", "blobs")
    assert not [f for f in os.listdir(blobs) if len(f.split(".")[0]) == 64]  # nothing kept under its sha256
    hub.corrupt = set()
    rc, out = txk(env, "train", cfg(tmp_path, REPO))
    assert rc == 0, out
    sha = hashlib.sha256(hub.repos[REPO]["model.safetensors"]).hexdigest()
    blob = os.path.join(blobs, sha)
    data = bytearray(open(blob, "rb").read())
    data[100] ^= 0xFF
    open(blob, "wb").write(bytes(data))
    rc, out = txk(env, "train", cfg(tmp_path, REPO))
    assert rc == 1 and "corrupted in the HF cache" in out and sha in out, out


def test_errors_say_what_to_do(tmp_path, env, hub):
    c = cfg(tmp_path, REPO)
    hub.token = "hf_secret"
    rc, out = txk(env, "train", c)
    assert rc == 1 and "HTTP 401" in out and "set HF_TOKEN" in out, out
    os.makedirs(env["HF_HOME"])
    with open(os.path.join(env["HF_HOME"], "token"), "w") as f:  # what `huggingface-cli login` writes
        f.write("hf_secret\n")
    rc, out = txk(env, "train", c, "max_steps=1")
    assert rc == 0, out
    hub.token = None
    rc, out = txk(env, "train", cfg(tmp_path, "some-org/no-such-bert"))
    assert rc == 1 and "HTTP 404 for repo some-org/no-such-bert, revision main, file config.json" in out, out
    rc, out = txk(env, "train", c, "revision=v9")
    assert rc == 1 and "revision v9" in out and "the revision does not exist" in out, out
    off = dict(env, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "empty"))
    n = len(hub.log)
    rc, out = txk(off, "train", c)
    assert rc == 1 and "HF_HUB_OFFLINE=1" in out and "not in the HF cache" in out, out
    assert len(hub.log) == n
    # a full disk: the partial blob is /dev/full, where every write fails with ENOSPC
    full = dict(env, HF_HUB_CACHE=str(tmp_path / "full"))
    sha = hashlib.sha256(hub.repos[REPO]["model.safetensors"]).hexdigest()
    blobs = os.path.join(full["HF_HUB_CACHE"], "models--some-org--tiny-bert", "blobs")
    os.makedirs(blobs)
    os.symlink("/dev/full", os.path.join(blobs, sha + ".incomplete"))
    rc, out = txk(full, "train", c)
    assert rc == 1 and "No space left on device" in out and "the disk is full" in out and "HF_HUB_CACHE" in out, out
    dead = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = dead.server_address[1]
    dead.server_close()  # nobody listens there now
    rc, out = txk(dict(env, HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HUB_CACHE=str(tmp_path / "c2")), "train", c)
    assert rc == 1 and "cannot reach the hub" in out and "HF_HUB_OFFLINE=1" in out and "local folder" in out, out


def test_random_init_only_when_asked(tmp_path, env, hub):
    dead = dict(env, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="1")
    rc, out = txk(dead, "train", cfg(tmp_path, "bert-tiny", "init: random\n"))
    assert rc == 0 and "random init" in out and "init: random" in out, out
    rc, out = txk(dead, "train", cfg(tmp_path, "bert-tiny"))
    assert rc == 1 and "prajjwal1/bert-tiny" in out and "not in the HF cache" in out, out
    # a folder without weights is no excuse for random weights either
    folder = tmp_path / "shape"
    folder.mkdir()
    (folder / "config.json").write_bytes(hub.repos[REPO]["config.json"])
    (folder / "vocab.txt").write_bytes(hub.repos[REPO]["vocab.txt"])
    rc, out = txk(dead, "train", cfg(tmp_path, str(folder)))
    assert rc == 1 and "has no weights" in out and "init: random" in out, out
    # planning a hub id that is not in the cache fetches its config and tokenizer, never its weights
    hub.log.clear()
    rc, out = txk(env, "plan", cfg(tmp_path, REPO))
    assert rc == 0, out
    got = {p.rsplit("/", 1)[1] for m, p, _ in hub.log if "/resolve/" in p}
    assert got == {"config.json", "vocab.txt", "tokenizer_config.json"}, hub.log
    assert not any(p.startswith("/lfs/") for _, p, _ in hub.log), hub.log


@pytest.mark.peer
def test_sharded_weights_load_as_one_and_bin_is_named(tmp_path, env, hub):
    """A sharded checkpoint (the index and every shard it names) is fetched
    and loads as the one-file model does: the same training losses.
    A repo with only pytorch_model.bin is fetched and trains the same too."""
    runs = {}
    for repo in (REPO, "some-org/sharded-bert", "some-org/bin-bert"):
        rc, out = txk(env, "train", cfg(tmp_path, repo), "--json")
        assert rc == 0 and "weights: loaded" in out, out
        runs[repo] = [{k: v for k, v in row.items() if k not in ("seconds", "samples_per_s")}
                      for row in json.loads(out[out.index("["):out.rindex("]") + 1])]
    snap = os.path.join(env["HF_HUB_CACHE"], "models--some-org--sharded-bert", "snapshots", COMMIT)
    for f in ("model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert os.path.isfile(os.path.join(snap, f)), f
    assert not os.path.exists(os.path.join(snap, "model.safetensors"))
    assert runs[REPO] == runs["some-org/sharded-bert"] == runs["some-org/bin-bert"] and runs[REPO][0]["train_loss"] > 0
    snap = os.path.join(env["HF_HUB_CACHE"], "models--some-org--bin-bert", "snapshots", COMMIT)
    assert os.path.isfile(os.path.join(snap, "pytorch_model.bin"))


def test_notebook_shows_download_progress_in_place(tmp_path, env, hub):
    """%%txtrain in the kernel: the download is one progress line, shown with
    display_data and then updated in place with update_display_data."""
    from jupyter_client.manager import KernelManager
    sys.path.insert(0, os.path.join(ROOT, "tests", "kernel"))
    import txk_util as u
    km = KernelManager(kernel_name=u.dev_kernel_name())
    km.start_kernel(env=env, cwd=ROOT)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=30)
        body = open(cfg(tmp_path, REPO)).read()
        reply, outs = u.run_cell(kc, "%%txtrain\n" + body, timeout=120)
    finally:
        u.stop(km, kc)
    assert reply["content"]["status"] == "ok", outs
    fetch = [m for m in outs if m["msg_type"] in ("display_data", "update_display_data")
             and m["content"].get("transient", {}).get("display_id", "").startswith("txfetch")]
    assert fetch[0]["msg_type"] == "display_data" and len({m["content"]["transient"]["display_id"] for m in fetch}) == 1
    assert all(m["msg_type"] == "update_display_data" for m in fetch[1:]) and len(fetch) >= 3
    last = fetch[-1]["content"]["data"]
    size = len(hub.repos[REPO]["model.safetensors"])
    assert last["application/json"] == {"file": "model.safetensors", "done": size, "total": size}
    assert "download model.safetensors" in last["text/plain"]


def test_waits_for_the_lock_huggingface_hub_takes(tmp_path, env, hub):
    """huggingface_hub writes a blob under flock on .locks/<repo>/<etag>.lock;
    txk takes the same lock, so the two never write one .incomplete file."""
    import fcntl, time
    sha = hashlib.sha256(hub.repos[REPO]["model.safetensors"]).hexdigest()
    locks = os.path.join(env["HF_HUB_CACHE"], ".locks", "models--some-org--tiny-bert")
    os.makedirs(locks)
    with open(os.path.join(locks, sha + ".lock"), "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        p = subprocess.Popen([TXK, "train", cfg(tmp_path, REPO)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 30
        while not any(p_.endswith("model.safetensors") for _, p_, _ in hub.log) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # it has asked for the file's etag; it must not fetch the bytes while we hold the lock
        assert p.poll() is None and not any(m == "GET" and q.startswith("/lfs/") for m, q, _ in hub.log), hub.log
        fcntl.flock(lk, fcntl.LOCK_UN)
        out, _ = p.communicate(timeout=120)
    assert p.returncode == 0 and "weights: loaded" in out, out
    assert any(m == "GET" and q == "/lfs/" + sha for m, q, _ in hub.log)


def test_a_hub_without_the_file_list_is_asked_file_by_file(tmp_path, env, hub):
    """An older hub or mirror that does not serve /api/models/{repo}/revision/
    {rev}: every file is asked for, a 404 meaning the repo lacks it; a repo
    with tokenizer.json and no vocab.txt (as transformers 5 saves) trains."""
    hub.listing = False
    files = dict(hub.repos[REPO])
    vocab = files.pop("vocab.txt").decode().split("\n")[:-1]
    files["tokenizer.json"] = json.dumps({
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": {t: i for i, t in enumerate(vocab)}},
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"}}).encode()
    hub.repos["some-org/tokjson-bert"] = files
    try:
        rc, out = txk(env, "train", cfg(tmp_path, "some-org/tokjson-bert"))
    finally:
        del hub.repos["some-org/tokjson-bert"]
    assert rc == 0 and "weights: loaded" in out, out
    assert "tokenizer.json" in out  # the vocabulary note names the file read
    asked = [p.rsplit("/", 1)[1] for m, p, _ in hub.log if m == "HEAD" and "/resolve/" in p]
    assert "vocab.txt" in asked and "special_tokens_map.json" in asked  # asked, answered 404
    assert any(p.startswith("/api/models/") for _, p, _ in hub.log)
