# bench/torch_peers/module.mk — txkernel beside PyTorch 2.x and 1.13: the
# per-example memory slope (plan for a CUDA card vs PyTorch's allocator on
# the CPU) and CPU samples/s. Needs the torch 2.x venv (.venv-t2, or
# TORCH2_PY=...); minutes on 2 cores (bert-base steps on the CPU).
#   make bench-torch-peers [TORCH_PEERS_ARGS="--skip-speed"]
TORCH2_PY ?= $(CURDIR)/.venv-t2/bin/python
TORCH_PEERS_ARGS ?=

.PHONY: bench-torch-peers
bench-torch-peers: $(BUILD)/txk $(BUILD)/bench/train_cpu
	$(PY) bench/torch_peers/run.py $(BUILD) --torch2 $(TORCH2_PY) --torch1 $(PY) $(TORCH_PEERS_ARGS)
