# bench/train_cpu/module.mk — whole training steps against PyTorch on the CPU.
#   make bench-train-cpu [TRAIN_ARGS="--models bert-mini,bert-small --threads 2"]
# prints samples/s and peak memory of both, and the ratios; then the tokenizer's
# MB/s against HF tokenizers (bench/tokenizer_bench.py), the other half of the
# fine-tuner's throughput.
TRAIN_ARGS ?= --models bert-mini,bert-small --batch 16 --seq 128

$(BUILD)/bench/train_cpu: bench/train_cpu/train_cpu.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@

.PHONY: bench-train-cpu
bench-train-cpu: $(BUILD)/bench/train_cpu $(BUILD)/tok_dump
	$(PY) bench/train_cpu/run.py $(BUILD) $(TRAIN_ARGS)
	$(PY) bench/tokenizer_bench.py --build $(BUILD)
bench: bench-train-cpu
