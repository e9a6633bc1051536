# app/module.mk — the docs the engine itself writes: the reference pages,
# generated from the option table and the config key table (issue 39: usage
# text exists once), and the pictures the docs show, drawn by the engine
# (docs/figures.py through libtxk.so).

.PHONY: docs
docs: $(BUILD)/txk $(BUILD)/libtxk.so
	$(PY) scripts/gen_reference.py $(BUILD)/txk docs/reference
	$(PY) docs/figures.py
