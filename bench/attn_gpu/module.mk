# bench/attn_gpu/module.mk — fused attention's kernels timed on the GPU (each
# kernel the cuda backend has: the card's pick, T4's sm75 path, the reference).
# Needs a GPU; the binary is built by `all` so that it cannot rot.
#   make bench-attn-gpu [ATTN_ARGS="--seq 128,512 --dtypes fp16,bf16"]
ATTN_ARGS ?= --batch 32 --heads 12 --seq 128,512 --dtypes fp16,bf16,fp32

$(BUILD)/bench/attn_gpu: bench/attn_gpu/attn_gpu.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@
all: $(BUILD)/bench/attn_gpu

.PHONY: bench-attn-gpu
bench-attn-gpu: $(BUILD)/bench/attn_gpu $(BUILD)/libtk_cuda.so
	TXK_CUDA_PLUGIN=$(abspath $(BUILD)/libtk_cuda.so) $(BUILD)/bench/attn_gpu $(ATTN_ARGS)
