"""The advisor has one table of diagnoses (issue 40): the plan, the pasted
message and the snapshot each fill the one facts record (tk_facts.h) and run
the one ordered table of rules in advisor/diagnoses.c; no other file of
advisor/ holds a rule array, a rule's functions or a diagnosis or fix type of
its own, and every rule names the evidence it proves. A source check, so it
fails the moment a second table or a reader's own rules come back."""
import glob, os, re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ADVISOR = os.path.join(ROOT, "advisor")
TABLE = "diagnoses.c"
READERS = {"advisor.c": "read_plan_facts", "oom_message.c": "read_facts", "snapshot_diagnose.c": "read_snap_facts"}


def sources():
    out = {}
    for p in sorted(glob.glob(os.path.join(ADVISOR, "*.[ch]"))):
        with open(p, encoding="utf-8") as f:
            # comments out: words about rules are not rules
            out[os.path.basename(p)] = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    return out


def test_one_rule_array_in_diagnoses_c():
    src = sources()
    arrays = {name: re.findall(r"\btk_rule\s+\w+\s*\[\s*\]", text) for name, text in src.items()}
    assert arrays[TABLE] and len(arrays[TABLE]) == 1, f"{TABLE}: expected one tk_rule array, found {arrays[TABLE]}"
    others = {n: a for n, a in arrays.items() if a and n != TABLE}
    assert not others, f"rule arrays outside {TABLE}: {others}"
    # no table of another shape: an array of structs holding proves/say functions
    for name, text in src.items():
        if name == TABLE:
            continue
        assert not re.search(r"\bPLAN_RULES\b|\bRULES\s*\[", text), f"{name}: a rule table outside {TABLE}"
        assert not re.search(r"\b(?:static\s+)?(?:int|void)\s+(?:proves|say)_\w+\s*\(", text), \
            f"{name}: a rule's function (proves_/say_) outside {TABLE}"


def test_no_reader_owns_diagnosis_or_fix_types():
    src = sources()
    for name, text in src.items():
        for t in ("tk_oommsg_diag", "tk_oommsg_fix", "tk_snap_diag", "tk_snap_fix", "plan_rule"):
            assert not re.search(r"\b%s\b" % t, text), f"{name}: {t} is back"
    # the rule type is declared once, in the facts header
    decl = [n for n, t in src.items() if re.search(r"typedef\s+struct\s+tk_rule\s*\{", t)]
    assert decl == ["tk_facts.h"], decl


def test_every_reader_fills_the_facts_and_runs_the_table():
    src = sources()
    for name, reader in READERS.items():
        text = src[name]
        assert re.search(r"\b%s\s*\(" % reader, text), f"{name}: its reader {reader} is gone"
        assert re.search(r"\btk_diagnose(?:_into)?\s*\(\s*&f\s*,", text), \
            f"{name}: does not run the one table over its facts"


def test_every_rule_names_its_evidence():
    text = sources()[TABLE]
    body = re.search(r"tk_rule\s+RULES\s*\[\s*\]\s*=\s*\{(.*?)\n\};", text, re.S).group(1)
    rows = re.findall(r"\{\s*(TK_DIAG_\w+)\s*,\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+),\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,\s*(\d)\s*\}",
                      body)
    n_rows = body.count("{TK_DIAG_")
    assert rows and len(rows) == n_rows, f"{len(rows)} rows read of {n_rows}"
    for kind, evidence, proves, say, fix, last in rows:
        words = "".join(re.findall(r"\"((?:[^\"\\]|\\.)*)\"", evidence))
        assert len(words) >= 10, f"{kind} ({proves}): its evidence is not named"
        assert proves.startswith("proves_") and say.startswith("say_"), (kind, proves, say)
    # each reader's rules are in it: the message's, the plan's, the snapshot's
    names = {r[2] for r in rows}
    for p in ("proves_held", "proves_frag", "proves_other", "proves_capacity", "proves_lottery", "proves_snap_leak",
              "proves_snap_frag"):
        assert p in names, p


def test_step_code_has_one_writer():
    """The code of a step change (half the batch, shorter sequences, fp16,
    checkpointing) in each API is written by tk_fix_code.h (tk_step_code,
    tk_loop_code) for the message and the snapshot alike, and by fix_code.c
    for a planned config: the diagnoses and the readers write none of it,
    nor does the snapshot's planner (snapshot_plan.c) with the recognised
    model's numbers. Launcher lines for several GPUs (torchrun, accelerate,
    DeepSpeed) are written once too (tk_launch_code), for a planned config
    and a pasted message alike."""
    src = sources()
    api_code = re.compile(r'"[^"\n]*(?:TrainingArguments\(|gradient_checkpointing|GradScaler|per_device_train_batch_size'
                          r'|batch_size: |precision: fp16|recompute: layers|set_global_policy|max_length=)')
    for name in ("diagnoses.c", "oom_message.c", "snapshot_diagnose.c", "advisor.c", "snapshot_plan.c"):
        hits = api_code.findall(src[name])
        assert not hits, f"{name} writes step code itself: {hits[:3]}"
    assert re.search(r"\btk_step_code\s*\(", src["tk_fix_code.h"])
    assert len(re.findall(r"\btk_step_code\s*\(", src["diagnoses.c"])) >= 8  # the message's four, the snapshot's four
    launcher = re.compile(r'"[^"\n]*(?:!torchrun |!accelerate launch|DataParallel\(model)')
    for name, text in src.items():
        if name != "tk_fix_code.h":
            assert not launcher.findall(text), f"{name} writes launcher lines itself: {launcher.findall(text)[:2]}"
    assert re.search(r"\btk_launch_code\s*\(", src["fix_code.c"]) and re.search(r"\btk_launch_code\s*\(", src["diagnoses.c"])
