# tests/torchplan/module.mk — the LD_PRELOAD library that reads torch's CPU
# allocator events where its profiler cannot (torch 1.13: no kineto).
AE_SO := $(BUILD)/tests/torchplan/liballoc_events.so
all: $(AE_SO)
$(AE_SO): tests/torchplan/alloc_events.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -O2 -Wall -Wextra -Werror -fPIC -shared $< -o $@ -ldl
