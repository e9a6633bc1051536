# app/module.mk — the reference pages, generated from the option table and
# the config key table (issue 39: usage text exists once).

.PHONY: docs
docs: $(BUILD)/txk
	$(PY) scripts/gen_reference.py $(BUILD)/txk docs/reference
