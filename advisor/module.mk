# advisor/module.mk — the advisor's benchmark (release flags).
#   bench-advisor  builds $(BUILD)/bench/advisor_bench and runs it; figures in
#                  bench/RESULTS.md ("## advisor").
ADVISOR_BENCH := $(BUILD)/bench/advisor_bench

$(ADVISOR_BENCH): bench/advisor_bench.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@

.PHONY: bench-advisor
bench-advisor: $(ADVISOR_BENCH)
	$(ADVISOR_BENCH)

bench: bench-advisor
