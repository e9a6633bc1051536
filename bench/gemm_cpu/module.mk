# bench/gemm_cpu/module.mk — the CPU backend's GEMM beside PyTorch's matmul.
#   make bench-gemm-cpu [GEMM_ARGS="--runs 3 --torch-step-s 1.54"]
GEMM_ARGS ?=

$(BUILD)/bench/gemm_cpu: bench/gemm_cpu/gemm_cpu.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@

.PHONY: bench-gemm-cpu
bench-gemm-cpu: $(BUILD)/bench/gemm_cpu
	$(PY) bench/gemm_cpu/run.py $(BUILD) $(GEMM_ARGS)
