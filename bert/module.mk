# bert/module.mk — extra build rules for bert/.
# tok_dump: the C side of the tokenizer parity test (tests/bert/test_tokenizer_hf.py)
# and of bench/tokenizer_bench.py; release build so the bench measures -O2 code.
$(BUILD)/tok_dump: tests/bert/tok_dump.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@
all: $(BUILD)/tok_dump

# train_parity: the C side of tests/bert/test_optim_torch.py (AdamW + clipping +
# schedule vs torch); ASan build, it is a test.
$(BUILD)/train_parity: tests/bert/train_parity_main.c $(LIB_ASAN)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -Itests $< $(LIB_ASAN) $(LIBS) -o $@
all: $(BUILD)/train_parity

# bert_parity: the C side of tests/bert/test_parity_torch.py (model logits, loss
# and every gradient vs a torch reference); ASan build, it is a test.
$(BUILD)/bert_parity: tests/bert/parity_main.c $(LIB_ASAN)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -Itests $< $(LIB_ASAN) $(LIBS) -o $@
all: $(BUILD)/bert_parity

# Tokenizer throughput against HF tokenizers (bench/tokenizer_bench.py).
.PHONY: bench-tokenizer
bench-tokenizer: $(BUILD)/tok_dump
	$(PY) bench/tokenizer_bench.py --build $(BUILD)
bench: bench-tokenizer

# bin_dump: the C side of tests/bert/test_torchbin.py (pytorch_model.bin read
# without Python, written back as safetensors); ASan build, it is a test.
$(BUILD)/bin_dump: tests/bert/bin_dump.c $(LIB_ASAN)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -Itests $< $(LIB_ASAN) $(LIBS) -o $@
all: $(BUILD)/bin_dump

# What a bert-base checkpoint-STEP costs: bytes, save and load time
# (bench/checkpoint_bench.c; figures in bench/RESULTS.md "## checkpoints").
CKPT_DIR ?= /tmp
$(BUILD)/bench/checkpoint_bench: bench/checkpoint_bench.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@
.PHONY: bench-checkpoint
bench-checkpoint: $(BUILD)/bench/checkpoint_bench
	$(BUILD)/bench/checkpoint_bench $(CKPT_DIR) 2
bench: bench-checkpoint
