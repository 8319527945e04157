# swarm - one GNU Makefile for the one binary, its tests and benchmarks.
#
#   make            build build/swarm (prints what it detected)
#   make deps       install missing Debian packages (apt-get, sudo if needed)
#   make test       deps, build, unit tests (Check) and integration scripts
#   make demo       deps, build, train a small model for about a minute, sample
#   make asan       unit tests under AddressSanitizer + UBSan (build-asan/)
#   make bench      benchmarks (never part of make test)
#   make fuzz       libFuzzer targets (clang)
#   V=1             show full commands

.DEFAULT_GOAL := all
BUILD      ?= build
SANITIZER  ?=
CC         ?= cc
V          ?= 0
Q          := $(if $(filter 1,$(V)),,@)
MULTIARCH  := $(shell gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)

ifeq ($(SANITIZER),asan)
BUILD      := build-asan
SAN_FLAGS  := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-format-truncation -MMD -MP -fopenmp $(SAN_FLAGS)
LDFLAGS_BASE := -fopenmp $(SAN_FLAGS)

# ---- detection -------------------------------------------------------------
# OpenBLAS: prefer the OpenMP build so that OpenBLAS and swarm's own loops
# share one thread pool (no spinning pools fighting over the cores).
OPENBLAS_OMP_DIR ?= /usr/lib/$(MULTIARCH)/openblas-openmp
ifneq ($(wildcard $(OPENBLAS_OMP_DIR)/libopenblas.so),)
BLAS_VARIANT := openmp
BLAS_CFLAGS  := -I/usr/include/$(MULTIARCH)/openblas-openmp
BLAS_LIBS    := -L$(OPENBLAS_OMP_DIR) -Wl,-rpath,$(OPENBLAS_OMP_DIR) -lopenblas
else
BLAS_VARIANT := $(shell pkg-config --variable=openblas_config openblas 2>/dev/null | grep -q USE_OPENMP=1 && echo openmp || echo pthread)
BLAS_CFLAGS  := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS    := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
endif
ZMQ_CFLAGS    := $(shell pkg-config --cflags libzmq 2>/dev/null)
ZMQ_LIBS      := $(shell pkg-config --libs libzmq 2>/dev/null || echo -lzmq)
SODIUM_CFLAGS := $(shell pkg-config --cflags libsodium 2>/dev/null)
SODIUM_LIBS   := $(shell pkg-config --libs libsodium 2>/dev/null || echo -lsodium)
CHECK_CFLAGS  := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS    := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck)
CUDA_HOME     ?= /usr/local/cuda
NVCC          := $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))

QUIET_GOALS := deps clean help
ifeq ($(filter $(QUIET_GOALS),$(MAKECMDGOALS)),)
ifeq ($(MAKELEVEL),0)
$(info openblas: $(BLAS_VARIANT) build ($(if $(filter openmp,$(BLAS_VARIANT)),shares the OpenMP pool with swarm,swarm sets its thread count)))
$(info nvcc: $(if $(NVCC),found at $(NVCC) (the CUDA plugin is not part of this build yet),not found, CPU backend only))
endif
endif

# ---- modules ---------------------------------------------------------------
# Each module compiles with only the include paths it may use:
#   blas <- node -> swarm -> net
BLAS_SRC  := $(wildcard blas/*.c)
NET_SRC   := $(wildcard net/*.c)
SWARM_SRC := $(wildcard swarm/*.c)
NODE_SRC  := $(filter-out node/main.c,$(wildcard node/*.c))

INC_blas  := -Iblas $(BLAS_CFLAGS)
INC_net   := -Inet $(ZMQ_CFLAGS) $(SODIUM_CFLAGS)
INC_swarm := -Iswarm -Inet $(ZMQ_CFLAGS) $(SODIUM_CFLAGS)
INC_node  := -Inode -Iblas -Iswarm -Inet $(ZMQ_CFLAGS) $(SODIUM_CFLAGS)
# Kernels may be vectorised harder (no value in them is ever inf or NaN on
# purpose: inputs from peers are checked before they reach a kernel); the
# optimizer must round the same way on every x86-64 build (DESIGN.md 7).
EXTRA_blas/cpu.c  := -O3 -fno-trapping-math -fno-math-errno -ffinite-math-only -fno-signed-zeros
EXTRA_node/optim.c := -ffp-contract=off -fno-fast-math

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
BLAS_OBJ  := $(call obj,$(BLAS_SRC))
NET_OBJ   := $(call obj,$(NET_SRC))
SWARM_OBJ := $(call obj,$(SWARM_SRC))
NODE_OBJ  := $(call obj,$(NODE_SRC)) $(BUILD)/obj/corpus.o
LIBS      := $(BLAS_LIBS) $(ZMQ_LIBS) $(SODIUM_LIBS) -lm -ldl -lpthread

$(BUILD)/obj/blas/%.o: blas/%.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS_BASE) $(INC_blas) $(EXTRA_$<) -c $< -o $@
$(BUILD)/obj/net/%.o: net/%.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS_BASE) $(INC_net) $(EXTRA_$<) -c $< -o $@
$(BUILD)/obj/swarm/%.o: swarm/%.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS_BASE) $(INC_swarm) $(EXTRA_$<) -c $< -o $@
$(BUILD)/obj/node/%.o: node/%.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS_BASE) $(INC_node) $(EXTRA_$<) -c $< -o $@

# The default corpus built into the binary: swarm's own documentation and
# sources, so `swarm train` and `make demo` work without any data file.
CORPUS_FILES := README.md $(sort $(wildcard docs/*.md)) $(sort $(wildcard blas/*.[ch] net/*.[ch] swarm/*.[ch] node/*.[ch]))
$(BUILD)/corpus.txt: $(CORPUS_FILES)
	@mkdir -p $(@D)
	$(Q)cat $^ > $@
$(BUILD)/obj/corpus.o: node/corpus.S $(BUILD)/corpus.txt
	@mkdir -p $(@D)
	@$(if $(Q),echo "  AS    $<")
	$(Q)$(CC) -c -DCORPUS_PATH='"$(BUILD)/corpus.txt"' $< -o $@

# ---- the binary ------------------------------------------------------------
all: $(BUILD)/swarm $(BUILD)/wanproxy
.PHONY: all deps test check-all demo asan bench fuzz clean help install

$(BUILD)/swarm: $(BUILD)/obj/node/main.o $(NODE_OBJ) $(SWARM_OBJ) $(NET_OBJ) $(BLAS_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(LIBS) -o $@

# ---- tests -----------------------------------------------------------------
TEST_RUNNERS := $(patsubst tests/%.c,$(BUILD)/%,$(wildcard tests/check_*.c))
$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS_BASE) $(INC_node) -Itests $(CHECK_CFLAGS) -c $< -o $@
$(BUILD)/check_%: $(BUILD)/obj/tests/check_%.o $(NODE_OBJ) $(SWARM_OBJ) $(NET_OBJ) $(BLAS_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(CHECK_LIBS) $(LIBS) -o $@

# keep test objects between builds (they are intermediate to the pattern rule)
.SECONDARY:

deps:
	@sh scripts/deps.sh

# `make test` installs what is missing, then re-reads this Makefile so the
# detection sees the new packages.
test: deps
	@$(MAKE) --no-print-directory check-all

check-all: $(BUILD)/swarm $(TEST_RUNNERS) $(BUILD)/rogue $(BUILD)/wanproxy
	@sh tests/run.sh $(BUILD)

asan:
	@$(MAKE) --no-print-directory SANITIZER=asan $(patsubst build/%,build-asan/%,$(TEST_RUNNERS)) build-asan/swarm
	@SWARM_UNIT_ONLY=1 sh tests/run.sh build-asan

demo: deps
	@$(MAKE) --no-print-directory $(BUILD)/swarm
	@sh scripts/demo.sh $(BUILD)

bench: $(BUILD)/swarm $(BUILD)/bench_gemm $(BUILD)/bench_net
	@sh scripts/bench-train.sh $(BUILD)
	@sh scripts/bench-net.sh $(BUILD)

# a test-only misbehaving peer (tests/test_swarm.sh)
$(BUILD)/rogue: $(BUILD)/obj/tests/rogue.o $(NET_OBJ)
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(LIBS) -o $@

# a TCP relay that emulates a slow, far, lossy link where the kernel has no
# netem (scripts/wan-swarm.sh); it knows nothing of swarm
$(BUILD)/wanproxy: $(BUILD)/obj/tests/wanproxy.o
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ -lm -o $@

$(BUILD)/bench_gemm: $(BUILD)/obj/tests/bench_gemm.o $(BLAS_OBJ)
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(LIBS) -o $@

# ---- net: fuzz targets and benchmark (rules for net/ live here) ----------
# check_net replays the fuzz target's seed corpus (tests/corpus/wire).
$(BUILD)/check_net: $(BUILD)/obj/tests/fuzz_wire.o

# make fuzz [FUZZ_TIME=seconds]: build the libFuzzer target with clang and
# run it from the seed corpus; new inputs go to build-fuzz/corpus/wire,
# crashes to build-fuzz/crash-*. Needs only net's pure decoder and codecs.
FUZZ_CC    ?= clang
FUZZ_TIME  ?= 60
FUZZ_BUILD := build-fuzz
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -fno-omit-frame-pointer \
              -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Inet $(ZMQ_CFLAGS)
FUZZ_SRC   := tests/fuzz_wire.c net/wire.c net/codec.c

$(FUZZ_BUILD)/fuzz_wire: $(FUZZ_SRC) net/net.h net/wire.h
	@mkdir -p $(@D)
	@$(if $(Q),echo "  FUZZ  $@")
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) $(FUZZ_SRC) -lm -o $@

fuzz: $(FUZZ_BUILD)/fuzz_wire
	@mkdir -p $(FUZZ_BUILD)/corpus/wire
	cd $(FUZZ_BUILD) && ./fuzz_wire -max_total_time=$(FUZZ_TIME) -max_len=16384 \
	    -print_final_stats=1 corpus/wire ../tests/corpus/wire

# make bench-net: loopback round trips and throughput with CURVE, codec MB/s
$(BUILD)/bench_net: $(BUILD)/obj/tests/bench_net.o $(NET_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(LIBS) -o $@

bench-net: $(BUILD)/bench_net
	@sh scripts/bench-net.sh $(BUILD)
.PHONY: bench-net
# ---- end net ---------------------------------------------------------------

PREFIX ?= /usr/local
install: $(BUILD)/swarm
	install -D -m 755 $(BUILD)/swarm $(DESTDIR)$(PREFIX)/bin/swarm

clean:
	rm -rf build build-asan

help:
	@sed -n '2,12p' Makefile

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
