# gpu/cuda/module.mk — the cuda backend plugin and its GPU-only tests.
#
#   $(BUILD)/libtk_cuda.so  the plugin (part of `all`, so CI compiles and links it)
#   build-gpu-tests         the GPU test binaries in $(BUILD)/gpu_tests/ (part of `all`;
#                           built, never run, by `make test`)
#   test-gpu                builds and runs them; needs a GPU
#
# The plugin is self-contained (linked with --no-undefined): binaries dlopen it
# without exporting their own symbols. It is linked -z nodelete: dlclose then
# leaves it, CUDA and CUPTI mapped, because CUPTI's worker thread and the CUDA
# runtime's teardown must not run into unmapped code when a device is closed
# and reopened in one kernel session. Host code is compiled by gcc against the
# toolkit's headers; the kernel files (*.cu, one per op family: README.md)
# go through nvcc. Architectures: native
# SASS for every card Colab and Kaggle hand out in 2026 and their neighbours,
# as far as CUDA 13's nvcc targets them (`nvcc --list-gpu-arch`: compute_75 and
# newer): sm_75 (T4), sm_80 (A100), sm_86 (A10, RTX 30), sm_89 (L4), sm_90
# (H100), sm_100 (B200) and sm_120 (RTX PRO 6000, Colab's G4 and Kaggle's),
# plus compute_120 PTX for cards after that. The K80, P4, P100 and V100 are
# below what CUDA 13 can target: planning profiles only. Seven SASS targets
# cost nvcc time on 2 cores; bench/RESULTS.md has the build before and after.
# -fmad=false: no FMA contraction, so the kernels round exactly as the cpu
# backend (gcc on x86-64 without -mfma) does; they are memory bound anyway.
# attention.cu alone is compiled without it (below).
# Without nvcc the plugin is skipped with a one-line notice.

CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard $(CUDA_HOME)/bin/nvcc))
CUDA_GENCODE ?= -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 \
                -gencode arch=compute_86,code=sm_86 -gencode arch=compute_89,code=sm_89 \
                -gencode arch=compute_90,code=sm_90 -gencode arch=compute_100,code=sm_100 \
                -gencode arch=compute_120,code=[sm_120,compute_120]

CUDA_PLUGIN := $(BUILD)/libtk_cuda.so
CUDA_DIR    := gpu/cuda
CUDA_HOBJS  := $(patsubst $(CUDA_DIR)/%.c,$(BUILD)/cuda/%.o,$(wildcard $(CUDA_DIR)/*.c))
CUDA_DOBJS  := $(patsubst $(CUDA_DIR)/%.cu,$(BUILD)/cuda/%.o,$(wildcard $(CUDA_DIR)/*.cu))
CUDA_INCS   := -I. -Igpu -I$(CUDA_DIR) -I$(CUDA_HOME)/include
CUDA_LIBDIR := $(CUDA_HOME)/lib64

GPU_TEST_SRCS := $(wildcard tests/gpu_cuda/gpu_*.c)
GPU_TEST_BINS := $(GPU_TEST_SRCS:tests/gpu_cuda/%.c=$(BUILD)/gpu_tests/%)

.PHONY: build-gpu-tests test-gpu

ifeq ($(NVCC),)

$(CUDA_PLUGIN):
	@echo "gpu/cuda: nvcc not found (PATH, $(CUDA_HOME)/bin): the cuda plugin is not built"
build-gpu-tests:
	@echo "gpu/cuda: nvcc not found: GPU tests not built"
test-gpu:
	@echo "gpu/cuda: nvcc not found: cannot build the cuda plugin"; exit 1

else

$(BUILD)/cuda/%.o: $(CUDA_DIR)/%.c $(CUDA_DIR)/module.mk
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -O2 -g -fPIC -fvisibility=hidden $(WARN) $(CUDA_INCS) -MMD -MP -c $< -o $@

# -lineinfo (ncu's source view) for every file but attention.cu, whose fully
# unrolled tiles make the line tables twice its code (sm_80 alone: a 3.4 MB
# object with them, 1.1 MB without; the plugin, 7 architectures: 33.5 MB
# with them, 18.1 MB without, 12.0 MB before the tensor-core kernels):
# `make CUDA_ATTN_LINEINFO=-lineinfo` puts them back for a profiling build.
CUDA_LINEINFO := -lineinfo
CUDA_ATTN_LINEINFO ?=
$(BUILD)/cuda/attention.o: CUDA_LINEINFO := $(CUDA_ATTN_LINEINFO)

# attention.cu has no bit-exact contract (its tests hold it to a tolerance):
# FMA contraction on, and ptxas -v's registers and spills of its kernels held
# to gpu/cuda/ptxas_check.sh's budgets (the log beside the object; a kernel
# over budget fails the build and removes the object). Issue 43.
CUDA_FMAD := -fmad=false
CUDA_PTXAS :=
$(BUILD)/cuda/attention.o: CUDA_FMAD :=
$(BUILD)/cuda/attention.o: CUDA_PTXAS := -Xptxas -v
$(BUILD)/cuda/attention.o: $(CUDA_DIR)/ptxas_check.sh

$(BUILD)/cuda/%.o: $(CUDA_DIR)/%.cu $(CUDA_DIR)/module.mk
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O2 $(CUDA_LINEINFO) $(CUDA_FMAD) $(CUDA_PTXAS) $(CUDA_GENCODE) $(CUDA_INCS) \
	    -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Wno-unused-parameter -Werror all-warnings \
	    -MMD -MP -c $< -o $@ $(if $(CUDA_PTXAS),2> $@.ptxas || { grep -v '^ptxas info\|bytes stack frame' $@.ptxas >&2; exit 1; })
	$(if $(CUDA_PTXAS),@sh $(CUDA_DIR)/ptxas_check.sh $@.ptxas || { rm -f $@; exit 1; })

# The CUDA runtime is linked in (-cudart static); cuBLAS, cuBLASLt and CUPTI
# are opened at run time from CUDA 13 or 12, whichever the machine has
# (cuda_dynload.c), so one plugin (and one wheel) serves both.
$(CUDA_PLUGIN): $(CUDA_HOBJS) $(CUDA_DOBJS) $(CUDA_DIR)/module.mk
	$(NVCC) -shared $(CUDA_GENCODE) -cudart static -o $@ $(CUDA_HOBJS) $(CUDA_DOBJS) \
	    -Xlinker --no-undefined -Xlinker -z,nodelete -ldl -lrt -lpthread

# GPU tests link the release library (ASan and the CUDA driver do not mix)
# and reach the plugin the way the binaries do: gpu/dev.c dlopens it
# (run.sh points TXK_CUDA_PLUGIN at this build's copy).
$(BUILD)/gpu_tests/%: tests/gpu_cuda/%.c tests/gpu_cuda/gpu_common.h tests/tk_test.h $(LIB_REL) $(CUDA_PLUGIN)
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) -Itests -I$(CUDA_DIR) $< $(LIB_REL) $(LIBS) -o $@

build-gpu-tests: $(GPU_TEST_BINS)

# `make test` runs gpu_ops and gpu_model with the plugin's kernels and launchers
# (every *.cu here, compiled by g++ into one translation unit) on host threads instead of a GPU:
# tests/gpu_cuda_host/cuda_emu.h. The others need the CUDA runtime or CUPTI.
EMU_OBJ := $(BUILD)/emu/cuda_emu_backend.o
EMU_CXXFLAGS := -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fno-sanitize-recover=undefined $(WARN) $(INCS) -Itests -I$(CUDA_DIR) -I$(CUDA_HOME)/include -MMD -MP
$(EMU_OBJ): tests/gpu_cuda_host/cuda_emu_backend.cpp $(CUDA_DIR)/module.mk
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
EMU_TESTS := $(BUILD)/tests/gpu_cuda_host/test_cuda_emu_ops $(BUILD)/tests/gpu_cuda_host/test_cuda_emu_model
$(BUILD)/tests/gpu_cuda_host/test_cuda_emu_%: tests/gpu_cuda/gpu_%.c tests/gpu_cuda/gpu_common.h tests/tk_test.h \
                                             $(EMU_OBJ) $(LIB_ASAN)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -DTK_CUDA_EMU -Itests -I$(CUDA_DIR) -I$(CUDA_HOME)/include $< $(EMU_OBJ) $(LIB_ASAN) \
	    $(LIBS) -lstdc++ -o $@
all: $(EMU_TESTS)
-include $(EMU_OBJ:.o=.d)
# mma.cuh's steps alone against plain matrix products (header-only: no libtk)
EMU_MMA_TEST := $(BUILD)/tests/gpu_cuda_host/test_cuda_mma
$(EMU_MMA_TEST): tests/gpu_cuda_host/test_cuda_mma.cpp tests/tk_test.h $(CUDA_DIR)/module.mk
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $< -o $@
all: $(EMU_MMA_TEST)
-include $(EMU_MMA_TEST).d

test-gpu: build-gpu-tests
	@bash tests/gpu_cuda/run.sh $(BUILD)

endif

all: $(CUDA_PLUGIN) build-gpu-tests

-include $(CUDA_HOBJS:.o=.d) $(CUDA_DOBJS:.o=.d)
