# txkernel — root build. Each module folder's sources are picked up by wildcard;
# a module that needs more (a plugin, a fuzz target, a python test peer) adds a
# <module>/module.mk, included below, so modules never edit each other's rules.
#
#   make demo   install what is missing, build, install the kernelspec, run demo 1
#   make test   install what is missing, build, run every test (last line: N passed, N failed)

CC       ?= gcc
PREFIX   ?= /usr/local
BUILD    := build
MODULES  := kernel magics app gpu bert torchplan advisor
PKGCFG   := libzmq libsodium jansson yaml-0.1 libutf8proc libcurl
VENV     := .venv
PY       := $(VENV)/bin/python

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGCFG) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGCFG) 2>/dev/null)

WARN     := -Wall -Wextra -Werror -Wno-unused-parameter
CSTD     := -std=gnu11 -fopenmp
INCS     := -I. -Igpu -Ikernel -Imagics -Iapp -Ibert -Itorchplan -Iadvisor
REL_CFLAGS  := $(CSTD) -O2 -g $(WARN) $(INCS) $(PKG_CFLAGS) -MMD -MP
ASAN_CFLAGS := $(CSTD) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
               -fno-sanitize-recover=undefined -DTK_HOST_CHAOS $(WARN) $(INCS) $(PKG_CFLAGS) -MMD -MP
LIBS     := $(PKG_LIBS) -lopenblas -lyaml -lm -ldl -lpthread -fopenmp

SRCS      := $(wildcard $(addsuffix /*.c,$(MODULES)))
REL_OBJS  := $(SRCS:%.c=$(BUILD)/rel/%.o)
ASAN_OBJS := $(SRCS:%.c=$(BUILD)/asan/%.o)
LIB_REL   := $(BUILD)/libtk.a
LIB_ASAN  := $(BUILD)/libtk_asan.a

# C unit tests: tests/<module>/test_*.c, one binary each, built with ASan+UBSan.
TEST_SRCS := $(wildcard tests/*/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)

BINS := $(BUILD)/txk $(BUILD)/txkernel

.PHONY: all deps test demo install clean test-gpu bench
all: $(BINS) $(TEST_BINS)

deps: $(VENV)/.deps-ok
$(VENV)/.deps-ok: scripts/deps.sh
	bash scripts/deps.sh

$(BUILD)/rel/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) -c $< -o $@
$(BUILD)/asan/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -c $< -o $@

# The cpu backend never reads errno or the FP exception flags; GCC 12 takes
# `#pragma GCC optimize("no-math-errno")` for the blends but still keeps
# sqrtf scalar (sqrtss plus an errno call per element) unless the flag is on
# the command line: AdamW's loop was scalar.
$(BUILD)/rel/gpu/cpu_backend.o $(BUILD)/pic/gpu/cpu_backend.o: REL_CFLAGS += -fno-math-errno -fno-trapping-math
$(BUILD)/asan/gpu/cpu_backend.o: ASAN_CFLAGS += -fno-math-errno -fno-trapping-math

$(LIB_REL): $(REL_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(LIB_ASAN): $(ASAN_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/txk: cli/txk.c $(LIB_REL)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@
$(BUILD)/txkernel: cli/txkernel.c $(LIB_REL)
	$(CC) $(REL_CFLAGS) $< $(LIB_REL) $(LIBS) -o $@

$(BUILD)/tests/%: tests/%.c tests/tk_test.h $(LIB_ASAN)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -Itests $< $(LIB_ASAN) $(LIBS) -o $@

-include $(wildcard */module.mk */*/module.mk)

install: $(BINS)
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(BUILD)/txkernel $(BUILD)/txk $(DESTDIR)$(PREFIX)/bin/
	$(MAKE) --no-print-directory kernelspec-install

# the build runs one compile per core: CI starts from a clean clone, and three
# builds of every source (release, ASan, -fPIC) plus the cuda fatbin are
# minutes one at a time on 2 cores
NPROC    := $(shell nproc 2>/dev/null || echo 1)

test: deps
	$(MAKE) --no-print-directory -j$(NPROC) all
	$(MAKE) --no-print-directory install
	$(MAKE) --no-print-directory -j$(NPROC) companion-install
	$(PY) tests/run_all.py

demo: deps
	$(MAKE) --no-print-directory -j$(NPROC) all
	$(MAKE) --no-print-directory install
	$(PY) demo_notebooks/run_demo.py

clean:
	rm -rf $(BUILD)

-include $(REL_OBJS:.o=.d) $(ASAN_OBJS:.o=.d) $(TEST_BINS:=.d)
