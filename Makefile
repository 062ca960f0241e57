# nvfp4moe - one hand-written Makefile (the only build system).
#
#   make            library (static + shared) and the CLI, CUDA parts too when nvcc is found
#   make run        the main job: `nvfp4moe run` on the built-in default layer
#   make test       builds everything and runs the CPU test suite, the Python package's tests too
#                   when $(PYTHON) exists (default /usr/bin/python3, Debian's, with python3-numpy)
#   make gpu-test   (CUDA builds, on a GPU machine) the GPU correctness test
#   make install PREFIX=/usr/local    (runs ldconfig when PREFIX is /usr or /usr/local, as root)
#   make uninstall PREFIX=/usr/local  removes what install put there
#   make CUDA=0     force a CPU-only build;  make CC=clang  build host code with clang
#   make DEPS=0 JANSSON_PREFIX=DIR   no package installs; jansson unpacked under DIR (the GPU
#                   machine has no package registry: see bench/device.sh)
#   make fuzz       build the libFuzzer targets of tests/fuzz/ (clang, ASan + UBSan) and run each
#                   for FUZZ_SECONDS (default 60) from its seed corpus; CI: make fuzz FUZZ_SECONDS=20
#
# Source lists are globs: a new src/<subsystem>/*.c, kernels/*.cu, tools/*.c, tools/*.cu or
# tests/test_*.c is picked up without editing this file. Debian packages the build needs are installed by `make deps`, which
# run/test/all call first (as root, or through sudo).

PREFIX   ?= /usr/local
BUILD    ?= build
CC       ?= cc
CUDA_HOME ?= $(firstword $(wildcard /usr/local/cuda) /usr/local/cuda)
NVCC     ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard $(CUDA_HOME)/bin/nvcc))

# CUDA=auto (default): build the CUDA backends when nvcc exists.
CUDA ?= auto
ifeq ($(CUDA),auto)
  ifneq ($(NVCC),)
    CUDA := 1
  else
    CUDA := 0
  endif
endif

# python3-numpy: tests/test_emulation.c checks the codec and EMULATION against a numpy
# transcription of vLLM's code, run with /usr/bin/python3; the Python package's tests use it too.
DEB_PKGS := libjansson-dev pkg-config python3-numpy
# The Python that runs the Python package's tests (python/tests/, through tests/python.sh).
PYTHON   ?= $(or $(NVFP4MOE_PYTHON),/usr/bin/python3)
PY_TESTS := $(if $(wildcard $(PYTHON)),tests/python.sh)
# Parallel sub-builds: the CUDA files take most of a build's time and compile independently.
JOBS     ?= $(shell nproc 2>/dev/null || echo 2)

CSTD     := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE
WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter
OPT      ?= -O2 -g
# No fused multiply-add contraction: the codec must round exactly as vLLM's reference does.
CFLAGS   += -ffp-contract=off
# Hidden by default: the shared library exports the NVFP4MOE_API declarations of include/ only.
CFLAGS   += $(CSTD) $(WARN) $(OPT) -fPIC -fvisibility=hidden -pthread -Iinclude -Isrc -I.
LDLIBS   += -ljansson -lm -pthread
ifneq ($(JANSSON_PREFIX),)
  JANSSON_LIB := $(JANSSON_PREFIX)/usr/lib/x86_64-linux-gnu
  CFLAGS += -I$(JANSSON_PREFIX)/usr/include
  LDLIBS := -L$(JANSSON_LIB) -Wl,-rpath,$(abspath $(JANSSON_LIB)) $(LDLIBS)
endif
DEPS ?= 1

# Hopper (sm_90a: wgmma/setmaxnreg) plus Ampere (sm_80: mma.sync, cp.async; runs on sm_80+).
CUDA_GENCODE ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_GENCODE) -Xcompiler -fPIC -Xcompiler -fvisibility=hidden -Xcompiler -Wall \
             -Iinclude -Isrc -Ikernels --expt-relaxed-constexpr -lineinfo

SRC_C    := $(sort $(wildcard src/*/*.c))
SRC_CU   := $(sort $(wildcard kernels/*.cu))
TOOL_C   := $(sort $(wildcard tools/*.c))
# The bench tool's own kernels (random weights, the cuBLAS baseline's helpers): not in the library.
TOOL_CU  := $(sort $(wildcard tools/*.cu))
TEST_C   := $(sort $(wildcard tests/test_*.c))
GPU_TEST_C := $(sort $(wildcard tests/gpu_*.c))

OBJ      := $(SRC_C:%.c=$(BUILD)/obj/%.o)
ifeq ($(CUDA),1)
  CFLAGS += -DNVFP4MOE_HAVE_CUDA -I$(CUDA_HOME)/include
  OBJ    += $(SRC_CU:%.cu=$(BUILD)/obj/%.o)
  LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
  # Expert parallelism's NCCL transport (src/ep/nccl.c): compiled when nccl.h is there; libnccl
  # is loaded at run time (dlopen), so nothing links -lnccl and CPU runs never need it.
  ifneq ($(wildcard $(CUDA_HOME)/include/nccl.h),)
    CFLAGS += -DNVFP4MOE_HAVE_NCCL
  endif
endif
TOOL_OBJ := $(TOOL_C:%.c=$(BUILD)/obj/%.o)
ifeq ($(CUDA),1)
  TOOL_OBJ += $(TOOL_CU:%.cu=$(BUILD)/obj/%.o)
endif

VERSION  := $(shell sed -n 's/^\#define NVFP4MOE_VERSION_\(MAJOR\|MINOR\|PATCH\) //p' include/nvfp4moe.h | paste -sd.)
SOMAJOR  := $(firstword $(subst ., ,$(VERSION)))
LIB_A    := $(BUILD)/libnvfp4moe.a
# libnvfp4moe.so.X.Y.Z, its SONAME libnvfp4moe.so.X and the link-time name libnvfp4moe.so
LIB_SO_REAL := $(BUILD)/libnvfp4moe.so.$(VERSION)
LIB_SO   := $(BUILD)/libnvfp4moe.so
HEADERS  := include/nvfp4moe.h include/nvfp4moe_experimental.h
CLI      := $(BUILD)/nvfp4moe
TESTS    := $(TEST_C:tests/%.c=$(BUILD)/tests/%)
GPU_TESTS := $(GPU_TEST_C:tests/%.c=$(BUILD)/tests/%)

.PHONY: all deps run test gpu-test install uninstall clean cuda-objs
all: deps
	@$(MAKE) --no-print-directory -j$(JOBS) build-all

.PHONY: build-all
build-all: $(LIB_A) $(LIB_SO) $(CLI) $(TESTS) $(if $(filter 1,$(CUDA)),$(GPU_TESTS))

# Installs the Debian packages the build needs, once. Does nothing when they are present.
deps:
	@[ "$(DEPS)" = 0 ] && exit 0; missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

HDRS     := $(wildcard include/*.h src/*/*.h tools/*.h tests/*.h kernels/*.h)

$(BUILD)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(wildcard include/*.h kernels/*.cuh kernels/*.h tools/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# Every .cu file, compiled (CI runs this: it has nvcc but no GPU).
cuda-objs: $(SRC_CU:%.cu=$(BUILD)/obj/%.o) $(TOOL_CU:%.cu=$(BUILD)/obj/%.o)

$(LIB_A): $(OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# --exclude-libs: the static cudart linked in stays hidden too.
$(LIB_SO_REAL): $(OBJ)
	$(CC) -shared -Wl,-soname,libnvfp4moe.so.$(SOMAJOR) -Wl,--exclude-libs,ALL -o $@ $^ $(LDLIBS)

$(LIB_SO): $(LIB_SO_REAL)
	ln -sf libnvfp4moe.so.$(VERSION) $(BUILD)/libnvfp4moe.so.$(SOMAJOR)
	ln -sf libnvfp4moe.so.$(SOMAJOR) $@

$(CLI): $(TOOL_OBJ) $(LIB_A)
	$(CC) -o $@ $(TOOL_OBJ) $(LIB_A) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(LIB_A) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

# The GPU tests also link the bench tool's helper kernels (random weights, the copy, read probes).
$(BUILD)/tests/gpu_%: tests/gpu_%.c $(LIB_A) $(TOOL_CU:%.cu=$(BUILD)/obj/%.o) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(TOOL_CU:%.cu=$(BUILD)/obj/%.o) $(LIB_A) $(LDLIBS)

run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) $(CLI)
	./$(CLI) run

# Runs every CPU test; each prints "N passed, N failed"; the last line sums them. The Python tests
# load this build's shared library.
test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) build-all
	@NVFP4MOE_CLI=$(CLI) NVFP4MOE_LIBRARY=$(abspath $(LIB_SO)) NVFP4MOE_PYTHON=$(PYTHON) \
	    tests/run_all.sh $(TESTS) $(PY_TESTS)

gpu-test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) build-all
	@for t in $(GPU_TESTS); do echo "== $$t"; $$t || exit 1; done

LIBDIR   = $(DESTDIR)$(PREFIX)/lib
# A system-wide install refreshes the loader's cache (ldconfig), so the library is found at once.
SYSTEM_PREFIXES := /usr /usr/local

install: all
	install -d $(DESTDIR)$(PREFIX)/include $(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(HEADERS) $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(LIB_A) $(LIBDIR)/
	install -m 755 $(LIB_SO_REAL) $(LIBDIR)/
	ln -sf libnvfp4moe.so.$(VERSION) $(LIBDIR)/libnvfp4moe.so.$(SOMAJOR)
	ln -sf libnvfp4moe.so.$(SOMAJOR) $(LIBDIR)/libnvfp4moe.so
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' \
	    -e 's|@VERSION@|$(VERSION)|' \
	    -e 's|@LIBS_PRIVATE@|$(filter-out -ljansson,$(LDLIBS))|' \
	    nvfp4moe.pc.in > $(LIBDIR)/pkgconfig/nvfp4moe.pc
	@if [ -z "$(DESTDIR)" ] && [ -n "$(filter $(PREFIX),$(SYSTEM_PREFIXES))" ] && [ "$$(id -u)" = 0 ] && \
	    command -v ldconfig >/dev/null 2>&1; then echo ldconfig; ldconfig; fi

uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/include/,$(notdir $(HEADERS)))
	rm -f $(LIBDIR)/libnvfp4moe.a $(LIBDIR)/libnvfp4moe.so $(LIBDIR)/libnvfp4moe.so.$(SOMAJOR) \
	      $(LIBDIR)/libnvfp4moe.so.$(VERSION) $(LIBDIR)/pkgconfig/nvfp4moe.pc $(DESTDIR)$(PREFIX)/bin/nvfp4moe
	@if [ -z "$(DESTDIR)" ] && [ -n "$(filter $(PREFIX),$(SYSTEM_PREFIXES))" ] && [ "$$(id -u)" = 0 ] && \
	    command -v ldconfig >/dev/null 2>&1; then echo ldconfig; ldconfig; fi

# ---- fuzzing: clang's libFuzzer, with AddressSanitizer and UndefinedBehaviorSanitizer ----
# Every tests/fuzz/fuzz_NAME.c is a target, run with tests/fuzz/NAME.dict and the seeds in
# tests/fuzz/corpus/NAME; what it finds goes to $(FUZZ_BUILD)/corpus/NAME (the seeds are not
# changed), a crashing input to $(FUZZ_BUILD)/crash-NAME-*. Each run prints its executions and
# coverage; a crash, a leak or a timeout fails the target.
FUZZ_SECONDS ?= 60
FUZZ_BUILD   ?= build-fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_NAMES   := $(patsubst tests/fuzz/%.c,%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_TOOLS   := $(filter-out $(BUILD)/obj/tools/nvfp4moe.o,$(TOOL_OBJ))

.PHONY: fuzz fuzz-build fuzz-targets
fuzz-build: deps
	@$(MAKE) --no-print-directory -j$(JOBS) CUDA=0 CC=clang BUILD=$(FUZZ_BUILD) \
	    OPT="-O1 -g $(FUZZ_SAN) -fsanitize=fuzzer-no-link" LDLIBS="-ljansson -lm -pthread $(FUZZ_SAN)" fuzz-targets

fuzz-targets: $(FUZZ_NAMES:%=$(BUILD)/fuzz/%)

$(BUILD)/fuzz/%: tests/fuzz/%.c tests/fuzz/fuzz_util.h $(LIB_A) $(FUZZ_TOOLS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_TOOLS) $(LIB_A) $(LDLIBS)

# Absolute paths: the CLI target runs each input in a scratch working directory.
FUZZ_DIR := $(abspath $(FUZZ_BUILD))
fuzz: fuzz-build
	@status=0; for t in $(FUZZ_NAMES); do n=$${t#fuzz_}; mkdir -p $(FUZZ_DIR)/corpus/$$n; \
	  log=$(FUZZ_DIR)/$$t.log; \
	  $(FUZZ_DIR)/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -timeout=30 -rss_limit_mb=2048 -max_len=65536 \
	    -close_fd_mask=3 -print_final_stats=1 -dict=$(CURDIR)/tests/fuzz/$$n.dict \
	    -artifact_prefix=$(FUZZ_DIR)/crash-$$n- $(FUZZ_DIR)/corpus/$$n $(CURDIR)/tests/fuzz/corpus/$$n >$$log 2>&1; rc=$$?; \
	  runs=$$(sed -n 's/^stat::number_of_executed_units: *//p' $$log); \
	  cov=$$(grep -o 'cov: [0-9]*' $$log | tail -n 1); ft=$$(grep -o 'ft: [0-9]*' $$log | tail -n 1); \
	  echo "$$t: $(FUZZ_SECONDS) s, $${runs:-?} executions, $${cov:-cov: ?}, $${ft:-ft: ?}, exit $$rc"; \
	  if [ $$rc != 0 ]; then tail -n 40 $$log; status=1; fi; \
	done; exit $$status

clean:
	rm -rf $(BUILD)
