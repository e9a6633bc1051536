# gpu/module.mk — extras of the device runtime: the allocator benchmark.
#
#   bench-alloc   builds $(BUILD)/bench/alloc_bench (release flags) and runs it;
#                 its figures are recorded in bench/RESULTS.md ("## allocator").
# `make bench` runs it along with the other modules' benchmarks.

ALLOC_BENCH := $(BUILD)/bench/alloc_bench

$(ALLOC_BENCH): bench/alloc_bench.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@

.PHONY: bench-alloc
bench-alloc: $(ALLOC_BENCH)
	$(ALLOC_BENCH)

bench: bench-alloc
