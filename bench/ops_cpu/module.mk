# bench/ops_cpu/module.mk — the cpu backend's per-op benchmark against PyTorch.
#   make bench-ops-cpu [OPS_ARGS="--hidden 512 --threads 2"]
# prints the two tables one after the other (same ops, shapes, threads, measure).
OPS_ARGS ?= --hidden 256 --threads 1

$(BUILD)/bench/ops_cpu: bench/ops_cpu/ops_cpu.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@

.PHONY: bench-ops-cpu
bench-ops-cpu: $(BUILD)/bench/ops_cpu
	$(BUILD)/bench/ops_cpu $(OPS_ARGS)
	$(PY) bench/ops_cpu/ops_torch.py $(OPS_ARGS)
bench: bench-ops-cpu

# A whole fine-tuning micro-step (forward + backward) against the same model in torch.
#   make bench-step-cpu [STEP_ARGS="--model bert-small --threads 2"]
STEP_ARGS ?= --model bert-mini --batch 32 --seq 128 --threads 1

$(BUILD)/bench/step_cpu: bench/ops_cpu/step_cpu.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@

.PHONY: bench-step-cpu
bench-step-cpu: $(BUILD)/bench/step_cpu
	$(BUILD)/bench/step_cpu $(STEP_ARGS)
	$(PY) bench/ops_cpu/step_torch.py $(STEP_ARGS)
bench: bench-step-cpu
