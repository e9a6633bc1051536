# python/module.mk — the Python companion's engine: everything but the kernel
# transport (magics, advisor, bert, gpu) as one shared library that `pip
# install .` puts inside the txkernel package (setup.py calls `make
# build/libtxk.so`), and the companion's install into .venv for the tests.
#
#   $(BUILD)/libtxk.so    -fPIC objects under $(BUILD)/pic/, linked with
#                         --no-undefined against the system libraries, so a
#                         missing symbol fails the build, not the import
#   companion-install     pip install --no-build-isolation . into $(VENV)
#                         (no index needed: setuptools comes with the venv),
#                         and into .venv-colab when scripts/deps.sh made it
#                         (Colab's kernel stack + .venv-t2's torch 2.x),
#                         printing the versions that row runs with
#
# kernel/ is left out on purpose: the host (IPython) is the kernel, and the
# magics use only kernel/tk_kernel.h's types.

EMBED_MODULES := magics app gpu bert torchplan advisor
EMBED_SRCS    := $(wildcard $(addsuffix /*.c,$(EMBED_MODULES)))
EMBED_OBJS    := $(EMBED_SRCS:%.c=$(BUILD)/pic/%.o)
EMBED_LIB     := $(BUILD)/libtxk.so
EMBED_LIBS    := $(shell pkg-config --libs jansson yaml-0.1 libutf8proc libcurl libsodium 2>/dev/null) -lopenblas -lm -ldl -lpthread -fopenmp

$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) -fPIC -c $< -o $@

$(EMBED_LIB): $(EMBED_OBJS)
	$(CC) -shared -Wl,--no-undefined -Wl,-soname,libtxk.so $^ $(EMBED_LIBS) -o $@

COLAB_VENV := .venv-colab

.PHONY: companion-install
companion-install: $(EMBED_LIB)
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps .
	@if [ -x $(COLAB_VENV)/bin/python ]; then \
	  $(COLAB_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps . && \
	  $(COLAB_VENV)/bin/python -c "import sys, importlib.metadata as m; \
	    print('companion: installed into $(COLAB_VENV): Python', sys.version.split()[0], *[f'| {p} {m.version(p)}' for p in \
	    ('ipython', 'ipykernel', 'jupyter_client', 'torch', 'transformers')])"; \
	fi

-include $(EMBED_OBJS:.o=.d)

# The companion against txk train, same config, same run (bench/RESULTS.md
# "## companion"): make bench-companion [COMPANION_BENCH_ARGS="--runs 3 --import-torch"]
COMPANION_BENCH_ARGS ?=
.PHONY: bench-companion
bench-companion: $(BUILD)/txk $(EMBED_LIB)
	$(PY) bench/companion_vs_txk.py --build $(BUILD) $(COMPANION_BENCH_ARGS)
bench: bench-companion

# The release wheel (scripts/wheel.sh): dist/txkernel_bert-*-py3-none-
# manylinux_2_XX_x86_64.whl with the engine, the cuda plugin, txk, txkernel
# and the kernelspec installer, every library they need inside (auditwheel,
# from .venv-wheel, which it makes). Its test: tests/wheel/test_wheel.py.
.PHONY: wheel
wheel:
	TXK_MAKE_JOBS=$(NPROC) bash scripts/wheel.sh
