# txkernel — root build. Each module folder's sources are picked up by wildcard;
# a module that needs more (a plugin, a fuzz target, a python test peer) adds a
# <module>/module.mk, included below, so modules never edit each other's rules.
#
#   make          build the binaries, the test binaries and the cuda plugin
#   make check    the C unit tests under ASan/UBSan: no virtualenvs, minutes
#   make demo     install what the demo needs, build txk and txkernel, install
#                 the kernelspec, run demo 1 (no torch, no browser, no plugin)
#   make test     install everything, build, run every test (last line: N passed, N failed)

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

.PHONY: all deps deps-demo check test demo install clean test-gpu bench
all: $(BINS) $(TEST_BINS)

# two tiers of set-up (scripts/deps.sh): the demo's (compiler, C libraries,
# Debian's Jupyter client) and the tests' (that, the PyPI peers, both torch
# rows, chromium)
deps: $(VENV)/.deps-ok
$(VENV)/.deps-ok: scripts/deps.sh
	bash scripts/deps.sh test
deps-demo: $(VENV)/.deps-demo
$(VENV)/.deps-demo: scripts/deps.sh
	bash scripts/deps.sh demo

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

# the demo runs on the cpu in the installed kernel: only the two binaries
demo: deps-demo
	$(MAKE) --no-print-directory -j$(NPROC) $(BINS)
	$(MAKE) --no-print-directory install
	$(PY) demo_notebooks/run_demo.py

# the C unit tests alone (tests/run_all.py filtered to build/tests/: the ASan
# binaries, no suites, no pytest)
check: deps-demo
	$(MAKE) --no-print-directory -j$(NPROC) $(TEST_BINS)
	$(PY) tests/run_all.py build/tests/

clean:
	rm -rf $(BUILD)

-include $(REL_OBJS:.o=.d) $(ASAN_OBJS:.o=.d) $(TEST_BINS:=.d)
