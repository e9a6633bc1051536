# kernel/module.mk — the libFuzzer target over the message decoder/verifier and
# the core (tests/kernel/fuzz_msg.c), built with clang and ASan+UBSan from the
# kernel sources alone; tests/suites/kernel_fuzz.sh runs it for 60 s.
FUZZ_CC    ?= clang
FUZZ_BIN   := $(BUILD)/fuzz/fuzz_msg
FUZZ_SRCS  := $(wildcard kernel/*.c)
FUZZ_FLAGS := -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
              -Wall -Wextra -Werror -Wno-unused-parameter -Ikernel $(PKG_CFLAGS)

all: $(FUZZ_BIN)
$(FUZZ_BIN): tests/kernel/fuzz_msg.c $(FUZZ_SRCS) kernel/tk_kernel.h kernel/tk_history.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) tests/kernel/fuzz_msg.c $(FUZZ_SRCS) $(PKG_LIBS) -lpthread -o $@
