"""%txplan --torch-model / --trainer in the companion (issue 26): a live
transformers model built in IPython is planned with engine: pytorch and the
plan equals `txk plan` of the same config byte for byte; a real Trainer
(issue 34) is read from its TrainingArguments, and advice on it is
TrainingArguments lines that construct; %txhelp is the companion's own.

Runs in-process (IPython's InteractiveShell, this row's torch and
transformers) against this worktree's build: python/ on sys.path and
$TXK_ENGINE_LIB = build/libtxk.so, so nothing is pip-installed. No GPU is
needed: --gpu t4 names the card."""
import json, os, subprocess, sys, warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
TXK = os.path.join(BUILD, "txk")
LIB = os.path.join(BUILD, "libtxk.so")


@pytest.fixture(scope="module")
def shell():
    assert os.path.exists(LIB), f"{LIB} is missing: make build/libtxk.so"
    os.environ.setdefault("TXK_ENGINE_LIB", LIB)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from IPython.testing.globalipapp import get_ipython
    ip = get_ipython()
    ip.run_line_magic("load_ext", "txkernel")
    ip.run_cell("import torch\nfrom transformers import BertConfig, BertForSequenceClassification\n"
                "torch.manual_seed(0)\n"
                "model = BertForSequenceClassification(BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, "
                "num_attention_heads=2, intermediate_size=256, num_labels=3))\n", silent=True)
    return ip


def txplan(ip, line):
    """The plan's bundle (the engine displays it) and what was printed."""
    from IPython.utils.capture import capture_output
    with capture_output() as cap:
        r = ip.run_line_magic("txplan", line)
    bundles = [o.data for o in cap.outputs] + ([r._repr_mimebundle_()[0]] if r is not None else [])
    plans = [b for b in bundles if "engine: pytorch" in b.get("text/plain", "")]
    assert len(plans) == 1, bundles
    return plans[0], cap.stdout


def test_torch_model_equals_txk_plan(shell, tmp_path):
    bundle, yaml = txplan(shell, "--torch-model model --batch 4 --seq 128 --gpu t4 --show-config")
    assert "engine: pytorch" in yaml and "num_labels: 3" in yaml and "gpu: t4" in yaml, yaml
    # the model is its own shape, not a preset it is not (issue 34: a bert-large shape showed bert-base-cased)
    assert "model:" not in yaml and "hidden: 64" in yaml and "layers: 2" in yaml, yaml
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml)
    cli = subprocess.run([TXK, "plan", str(cfg)], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert bundle["text/plain"] == cli.stdout
    assert "engine: pytorch" in bundle["text/plain"] and "batch 4 x seq 128" in bundle["text/plain"]


def test_checkpointing_and_frozen_embeddings_are_read(shell):
    shell.run_cell("model.gradient_checkpointing_enable()\n"
                   "for p in model.bert.embeddings.parameters(): p.requires_grad_(False)\n", silent=True)
    try:
        _, yaml = txplan(shell, "--torch-model model --batch 2 --seq 64 --gpu t4 --show-config")
        assert "recompute: layers" in yaml and "freeze: embeddings" in yaml, yaml
    finally:
        shell.run_cell("model.gradient_checkpointing_disable()\n"
                       "for p in model.parameters(): p.requires_grad_(True)\n", silent=True)


def test_bad_name_is_an_error(shell):
    with pytest.raises(Exception, match="no_such_model: no such variable"):
        shell.run_line_magic("txplan", "--torch-model no_such_model --gpu t4")
    # a bad card is the flag's error, never a line of the YAML the user did not write
    with pytest.raises(Exception) as e:
        shell.run_line_magic("txplan", "--torch-model model --gpu t5")
    assert "gpu: 't5' is not a known GPU profile" in str(e.value) and "cell:" not in str(e.value), str(e.value)


def test_gpus_plans_each_card_of_the_platform(shell):
    """Issue 34: --gpus kaggle was a usage error; it plans each Kaggle card."""
    from IPython.utils.capture import capture_output
    with capture_output() as cap:
        r = shell.run_line_magic("txplan", "--torch-model model --batch 4 --seq 128 --gpus kaggle --json")
    bundles = [o.data for o in cap.outputs] + ([r._repr_mimebundle_()[0]] if r is not None else [])
    js = [b["application/json"] for b in bundles if "application/json" in b]
    assert js and js[-1]["platform"] == "kaggle", bundles
    assert [c["gpu"] for c in js[-1]["cards"]][:3] == ["t4", "t4x2", "p100"] and all("usable" in c for c in js[-1]["cards"])


def test_no_future_warning_from_the_checkpointing_flag(shell):
    """Issue 34: transformers 5 warns on is_gradient_checkpointing; the
    current attribute is read instead (this row's transformers)."""
    shell.run_cell("model.gradient_checkpointing_enable()", silent=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            _, yaml = txplan(shell, "--torch-model model --batch 2 --seq 64 --gpu t4 --show-config")
        assert "recompute: layers" in yaml, yaml
    finally:
        shell.run_cell("model.gradient_checkpointing_disable()", silent=True)


def test_txhelp_is_the_companions(shell):
    """%txhelp lists this kernel's magics, %%txwatch among them, and
    %txhelp txwatch is its help (issue 34)."""
    from IPython.utils.capture import capture_output
    with capture_output() as cap:
        shell.run_line_magic("txhelp", "")
    assert "%%txwatch" in cap.stdout and "%txplan" in cap.stdout and "every cell starts with a magic" not in cap.stdout
    with capture_output() as cap:
        shell.run_line_magic("txhelp", "txwatch")
    assert cap.stdout.startswith("%%txwatch") and "OutOfMemoryError" in cap.stdout, cap.stdout
    with capture_output() as cap:
        shell.run_line_magic("txhelp", "txplan")
    assert "--torch-model" in cap.stdout and "--gpus" in cap.stdout


def test_trainer_arguments_are_read(shell, tmp_path):
    """--trainer reads trainer.model and a real transformers Trainer's
    TrainingArguments (issue 34: built here, accelerate in the row). fp16 is
    set on the built arguments: TrainingArguments refuses fp16 without a CUDA
    device at construction, which this machine has not."""
    shell.user_ns["out_dir"] = str(tmp_path / "out")
    shell.run_cell("from transformers import Trainer, TrainingArguments\n"
                   "args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=2, "
                   "gradient_accumulation_steps=4, gradient_checkpointing=True, optim='adamw_bnb_8bit', report_to=[])\n"
                   "trainer = Trainer(model=model, args=args)\n"
                   "trainer.args.fp16 = True\n", silent=True)
    assert type(shell.user_ns["trainer"]).__name__ == "Trainer"
    bundle, yaml = txplan(shell, "--trainer trainer --seq 64 --gpu t4 --show-config")
    for line in ("batch_size: 2", "accumulate: 4", "precision: fp16", "recompute: layers", "optimizer: adamw8bit",
                 "api: trainer", f"output_dir: {json.dumps(str(tmp_path / 'out'))}"):
        assert line in yaml, yaml
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml)
    cli = subprocess.run([TXK, "plan", str(cfg)], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and bundle["text/plain"] == cli.stdout, cli.stderr


def test_two_gpus_are_planned(shell, tmp_path):
    """--gpu t4x2: the same C plan per GPU (DataParallel, what the Trainer does
    on two GPUs without a launcher, labelled not measured), equal to txk plan."""
    bundle, yaml = txplan(shell, "--torch-model model --batch 4 --seq 64 --gpu t4x2 --show-config")
    assert "gpu: t4x2" in yaml, yaml
    text = bundle["text/plain"]
    assert "2 GPUs, DataParallel" in text and "GPU 0:" in text and "GPU 1:" in text and "not measured" in text, text
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml)
    cli = subprocess.run([TXK, "plan", str(cfg)], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and cli.stdout == text, cli.stderr


def test_trainer_default_optim_is_fused():
    """transformers 5's TrainingArguments default (adamw_torch_fused, torch >=
    2.8) is planned as torch.optim.AdamW(fused=True), not as foreach."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from txkernel.torch_model import OPTIMS
    assert OPTIMS["adamw_torch_fused"] == "adamw_torch_fused" and OPTIMS["adamw_torch"] == "adamw"


def test_torch_version_picks_its_rules():
    """The notebook's torch picks the rules: its own 2.x minor (where cuBLAS
    keeps its workspaces changed across them), 1.11-1.13 (softmax keeps its
    output only), 1.10 and older (softmax keeps its input too); a newer torch
    than the rules were read for gets the newest, said in a comment."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from txkernel.torch_model import torch_rules, torch_rules_note
    assert [torch_rules(v) for v in ("2.15.0+cu132", "2.11.0+cu130", "2.0.1", "1.13.0a0", "1.11.0", "1.10.2+cu113",
                                     "1.9.0", "2.16.0")] == \
        ["2.15", "2.11", "2.0", "1.13", "1.13", "1.10", "1.10", "2.15"]
    assert torch_rules_note("2.11.0") == "" and torch_rules_note("1.13.1") == ""
    assert "2.16.0 is newer" in torch_rules_note("2.16.0")


def test_advice_on_a_real_trainer_is_its_own_api(shell, tmp_path):
    """Issue 34 must-show 3: after %txplan --trainer (fp16 and gradient
    checkpointing on), %txadvise offers neither; every fix is a
    TrainingArguments or tokenizer line with the user's numbers, and every
    TrainingArguments line constructs in this row's transformers."""
    from IPython.utils.capture import capture_output
    from transformers import TrainingArguments
    shell.user_ns["out_dir"] = str(tmp_path / "out")
    shell.run_cell("from transformers import Trainer, TrainingArguments\n"
                   "args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=64, "
                   "gradient_checkpointing=True, report_to=[])\n"
                   "trainer = Trainer(model=model, args=args)\ntrainer.args.fp16 = True\n", silent=True)
    txplan(shell, "--trainer trainer --seq 512 --gpu t4")
    with capture_output() as cap:
        r = shell.run_line_magic("txadvise", "--json")
    bundles = [o.data for o in cap.outputs] + ([r._repr_mimebundle_()[0]] if r is not None else [])
    advice = [b["application/json"] for b in bundles if "application/json" in b][-1]
    assert advice["api"] == "trainer" and advice["candidates"], advice
    built = 0
    for c in advice["candidates"]:
        assert not any(w in c["label"] for w in ("fp16", "bf16", "recompute")), c["label"]
        for ln in (c.get("code") or "").splitlines():
            assert "GradScaler" not in ln and "gradient_checkpointing" not in ln and "fp16" not in ln, ln
            if ln.startswith("TrainingArguments("):
                m = __import__("re").search(r"per_device_train_batch_size=(\d+), gradient_accumulation_steps=(\d+)", ln)
                if m and c["label"].startswith("accumulate"):
                    assert int(m.group(1)) * int(m.group(2)) == 64, ln
                a = eval(ln.split("   #")[0], {"TrainingArguments": TrainingArguments})
                assert a.output_dir == str(tmp_path / "out")
                built += 1
    assert built >= 2, advice["candidates"]


@pytest.mark.peer
def test_checkpointing_is_read_without_a_future_warning():
    """Issue 34: transformers 5's is_gradient_checkpointing warns
    (FutureWarning: use is_activation_checkpointing); the config is read from
    the current attribute, on each row's transformers."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("TXK_ENGINE_LIB", LIB)  # the flags are read from the engine's option table
    from txkernel import torch_model
    from transformers import BertConfig, BertForSequenceClassification
    m = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=64))
    m.gradient_checkpointing_enable()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        yaml, flags = torch_model.config_yaml(torch_model.parse(["--torch-model", "m", "--gpu", "t4"]), {"m": m})
    assert "recompute: layers" in yaml and flags == ["--gpu", "t4"], yaml
