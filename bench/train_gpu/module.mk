# bench/train_gpu/module.mk — whole training steps on the GPU against HF
# transformers on the same GPU (needs a GPU, the cuda plugin, torch and
# transformers; not part of `make bench`, which runs anywhere).
#   make bench-train-gpu [GPU_TRAIN_ARGS="--rows all"]   (run.py's header: columns, rows, MFU)
#   make bench-train-gpu GPU_TRAIN_ARGS="--techniques --seq 512"
GPU_TRAIN_ARGS ?= --models bert-base-uncased --batch 32

.PHONY: bench-train-gpu
bench-train-gpu: $(BUILD)/bench/train_cpu $(BUILD)/libtk_cuda.so
	TXK_CUDA_PLUGIN=$(abspath $(BUILD)/libtk_cuda.so) python3 bench/train_gpu/run.py $(BUILD) $(GPU_TRAIN_ARGS)
