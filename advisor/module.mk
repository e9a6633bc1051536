# advisor/module.mk — the advisor's benchmark (release flags) and two libFuzzer
# targets: the snapshot / pickle / pytorch_model.bin readers, and the
# pasted-OOM-message reader.
#   bench-advisor  builds $(BUILD)/bench/advisor_bench and runs it; figures in
#                  bench/RESULTS.md ("## advisor").
#   $(BUILD)/fuzz/fuzz_oom_message  tests/advisor/fuzz_oom_message.c with clang,
#                  ASan+UBSan, from advisor/oom_message.c, advisor/diagnoses.c
#                  and gpu/profile.c alone; tests/suites/oom_message_fuzz.sh runs it for 30 s.
ADVISOR_BENCH := $(BUILD)/bench/advisor_bench

$(ADVISOR_BENCH): bench/advisor_bench.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@

.PHONY: bench-advisor
bench-advisor: $(ADVISOR_BENCH)
	$(ADVISOR_BENCH)

bench: bench-advisor

# fuzz_snapshot: libFuzzer over the pickle reader, pytorch_model.bin and the PyTorch snapshot
# reader (tests/advisor/fuzz_snapshot.c), clang with ASan+UBSan, from the few
# sources they need; tests/suites/snapshot_fuzz.sh runs it for 30 s.
SNAP_FUZZ_BIN  := $(BUILD)/fuzz/fuzz_snapshot
SNAP_FUZZ_SRCS := bert/pickle.c bert/torchbin.c bert/safetensors.c advisor/snapshot_decode.c advisor/snapshot_trace.c \
                  advisor/snapshot_frames.c advisor/snapshot_peak.c advisor/snapshot_leak.c advisor/snapshot_diagnose.c \
                  advisor/snapshot.c advisor/snapshot_report.c advisor/diagnoses.c gpu/dtype.c gpu/profile.c
SNAP_FUZZ_FLAGS := -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
                   -Wall -Wextra -Werror -Wno-unused-parameter -Igpu -Ibert -Iadvisor $(PKG_CFLAGS)

all: $(SNAP_FUZZ_BIN)
$(SNAP_FUZZ_BIN): tests/advisor/fuzz_snapshot.c $(SNAP_FUZZ_SRCS) bert/tk_pickle.h bert/tk_torchbin.h advisor/tk_snapshot.h $(wildcard advisor/snapshot_*.h) gpu/tk_gpu.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(SNAP_FUZZ_FLAGS) tests/advisor/fuzz_snapshot.c $(SNAP_FUZZ_SRCS) $(PKG_LIBS) -lm -o $@

FUZZ_CC ?= clang
OOMMSG_FUZZ_BIN := $(BUILD)/fuzz/fuzz_oom_message
OOMMSG_FUZZ_SRCS := tests/advisor/fuzz_oom_message.c advisor/oom_message.c advisor/diagnoses.c gpu/profile.c

all: $(OOMMSG_FUZZ_BIN)
$(OOMMSG_FUZZ_BIN): $(OOMMSG_FUZZ_SRCS) advisor/tk_oom_message.h advisor/tk_facts.h advisor/tk_advisor.h gpu/tk_gpu.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    -Wall -Wextra -Werror -Wno-unused-parameter -I. -Igpu -Ibert -Iadvisor $(PKG_CFLAGS) \
	    $(OOMMSG_FUZZ_SRCS) $(PKG_LIBS) -lm -o $@
