# swarm - one GNU Makefile for the one binary, its tests and benchmarks.
#
#   make            build build/swarm (prints what it detected)
#   make deps       install missing Debian packages (apt-get, sudo if needed)
#   make test       deps (and the test tools), build, unit tests (Check) and integration scripts
#   make demo       deps, build, train a small model for about a minute, sample
#   make asan       unit tests under AddressSanitizer + UBSan (build-asan/), and
#                   a swarm under them while garbage floods its port
#   make test-gpu   every CUDA op against the CPU's, the reference files and a
#                   mixed CPU + GPU swarm on CUDA (skips without a GPU)
#   make sim-soak SECONDS=N  swarm sim on fresh seeds for N s (default 600),
#                   printing the seeds it ran and the replay of any failure
#   make bench      benchmarks (never part of make test)
#   make bench-gpu  tokens/s on a GPU beside PyTorch fp32 (skips without a GPU)
#   make fuzz       libFuzzer targets, FUZZ_TIME s each (clang; installs it)
#   make release    build/release/swarm-linux-x86_64, one file for a volunteer
#   V=1             show full commands
#   JOBS=N          what make test, asan and fuzz build at once (default: the cores)

.DEFAULT_GOAL := all
BUILD      ?= build
SANITIZER  ?=
CC         ?= cc
V          ?= 0
JOBS       ?= $(shell nproc 2>/dev/null || echo 1)
Q          := $(if $(filter 1,$(V)),,@)
comma      := ,
MULTIARCH  := $(shell gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)

ifeq ($(SANITIZER),asan)
BUILD      := build-asan
# SWARM_CHECK: the engine's picks over rows by speed checked against a
# read of every row, each time
SAN_FLAGS  := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
              -DSWARM_CHECK
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
JANSSON_CFLAGS := $(shell pkg-config --cflags jansson 2>/dev/null)
JANSSON_LIBS  := $(shell pkg-config --libs jansson 2>/dev/null || echo -ljansson)
MHD_CFLAGS    := $(shell pkg-config --cflags libmicrohttpd 2>/dev/null)
MHD_LIBS      := $(shell pkg-config --libs libmicrohttpd 2>/dev/null || echo -lmicrohttpd)
CHECK_CFLAGS  := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS    := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck)
CUDA_HOME     ?= /usr/local/cuda
NVCC          := $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
# GPUs the plugin has machine code for (CUDA 13 still accepts sm_75), and the
# PTX that newer GPUs compile at load time
CUDA_ARCHS    ?= 75 80 86 89 90
CUDA_PTX      ?= 90

# What was detected is said once, by the make that builds. demo and test
# install what is missing first (make deps) and then build in a make of
# their own, which detects afresh and says it (SAY_DETECTED=1): on a fresh
# machine the first make's answer is what was there before the install.
QUIET_GOALS := deps clean help
DEPS_FIRST  := demo test
ifeq ($(MAKELEVEL),0)
SAY_DETECTED := $(if $(filter $(QUIET_GOALS) $(DEPS_FIRST),$(MAKECMDGOALS)),,1)
endif
ifeq ($(SAY_DETECTED),1)
$(info openblas: $(BLAS_VARIANT) build ($(if $(filter openmp,$(BLAS_VARIANT)),shares the OpenMP pool with swarm,swarm sets its thread count)))
$(info nvcc: $(if $(NVCC),found at $(NVCC)$(comma) building the CUDA plugin ($(patsubst %,sm_%,$(CUDA_ARCHS)) + PTX compute_$(CUDA_PTX)),not found$(comma) CPU backend only))
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
INC_swarm := -Iswarm -Inet $(ZMQ_CFLAGS) $(SODIUM_CFLAGS) $(JANSSON_CFLAGS)
INC_node  := -Inode -Iblas -Iswarm -Inet $(ZMQ_CFLAGS) $(SODIUM_CFLAGS) $(JANSSON_CFLAGS) $(MHD_CFLAGS)
# Kernels may be vectorised harder (no value in them is ever inf or NaN on
# purpose: inputs from peers are checked before they reach a kernel); the
# optimizer must round the same way on every x86-64 build (DESIGN.md 7):
# vectorised too (sqrtps and divps round as sqrtss and divss: the same
# bits, 3.5x faster), but never contracted or reassociated.
EXTRA_blas/cpu.c  := -O3 -fno-trapping-math -fno-math-errno -ffinite-math-only -fno-signed-zeros
EXTRA_node/optim.c := -ffp-contract=off -fno-fast-math -fno-math-errno -fvect-cost-model=dynamic
# the sim's synthetic gradients, a micro-batch's added over a whole stage: vectorised
# (each element on its own, nothing reassociated), and so not at the mercy
# of where the linker puts a scalar loop (one place ran it 1.6x slower)
EXTRA_swarm/sim_peer.c := -fvect-cost-model=dynamic

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
BLAS_OBJ  := $(call obj,$(BLAS_SRC))
NET_OBJ   := $(call obj,$(NET_SRC))
SWARM_OBJ := $(call obj,$(SWARM_SRC))
NODE_OBJ  := $(call obj,$(NODE_SRC)) $(BUILD)/obj/corpus.o $(BUILD)/obj/dashboard_page.o
LIBS      := $(BLAS_LIBS) $(ZMQ_LIBS) $(SODIUM_LIBS) -lm -ldl -lpthread
# what links node/ and swarm/ links these too (the status document: the engine writes
# it, swarm status reads it, with jansson; swarm status --serve, with libmicrohttpd)
NODE_LIBS := $(JANSSON_LIBS) $(MHD_LIBS)

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
$(BUILD)/obj/dashboard_page.o: node/dashboard_page.S node/dashboard.html
	@mkdir -p $(@D)
	@$(if $(Q),echo "  AS    $<")
	$(Q)$(CC) -c -DDASHBOARD_PATH='"node/dashboard.html"' $< -o $@

# ---- the CUDA plugin -------------------------------------------------------
# blas/cuda.cu becomes $(BUILD)/swarm-cuda.so, which swarm dlopens at run time
# (blas/backend.c); cudart is linked in statically, so libcublas is all it
# needs from the CUDA toolkit at run time. The swarm binary links neither.
CUDA_ROOT   := $(if $(NVCC),$(abspath $(dir $(NVCC))..))
CUDA_LIB    := $(firstword $(wildcard $(CUDA_ROOT)/lib64 $(CUDA_ROOT)/targets/x86_64-linux/lib))
CUDA_PLUGIN := $(if $(NVCC),$(BUILD)/swarm-cuda.so)
NVCC_FLAGS  := -std=c++17 -O3 -Werror all-warnings \
               -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror,-Wno-format-truncation \
               $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
               -gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX)

$(BUILD)/obj/blas/cuda.o: blas/cuda.cu blas/blas.h blas/rows.h
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVCC_FLAGS) -Iblas -c $< -o $@

$(BUILD)/swarm-cuda.so: $(BUILD)/obj/blas/cuda.o blas/cuda.map
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(NVCC) -shared -cudart static $< -o $@ $(if $(CUDA_LIB),-L$(CUDA_LIB)) -lcublas \
	    -Xlinker --version-script=blas/cuda.map,--no-undefined$(if $(CUDA_LIB),$(comma)-rpath$(comma)$(CUDA_LIB))

# The same source on the CPU (tests/cuda_emu.h): check_cuda holds its kernels
# to the CPU backend in `make test`, on machines without a GPU or nvcc.
HAVE_CXX := $(shell command -v $(CXX) 2>/dev/null)
CUDA_EMU := $(if $(HAVE_CXX),$(BUILD)/swarm-cuda-emu.so)
$(BUILD)/swarm-cuda-emu.so: blas/cuda.cu blas/blas.h blas/rows.h tests/cuda_emu.h tests/mk-cuda-emu.sh
	@mkdir -p $(BUILD)/obj/tests
	@$(if $(Q),echo "  CXX   $@ (blas/cuda.cu on the CPU)")
	$(Q)sh tests/mk-cuda-emu.sh blas/cuda.cu $(BUILD)/obj/tests/cuda_emu.cc
	$(Q)$(CXX) -std=c++17 -O2 -g -U_FORTIFY_SOURCE -fPIC -shared -fvisibility=hidden -Wall -Wextra \
	    -Werror -Wno-format-truncation -include tests/cuda_emu.h -Iblas $(BLAS_CFLAGS) \
	    $(BUILD)/obj/tests/cuda_emu.cc -o $@ $(BLAS_LIBS)

# ---- the binary ------------------------------------------------------------
all: $(BUILD)/swarm $(CUDA_PLUGIN) $(BUILD)/wanproxy
.PHONY: all deps test test-gpu check-all demo asan bench bench-gpu fuzz clean help install sim-soak

$(BUILD)/swarm: $(BUILD)/obj/node/main.o $(NODE_OBJ) $(SWARM_OBJ) $(NET_OBJ) $(BLAS_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(NODE_LIBS) $(LIBS) -o $@

# ---- tests -----------------------------------------------------------------
TEST_RUNNERS := $(patsubst tests/%.c,$(BUILD)/%,$(wildcard tests/check_*.c))
$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS_BASE) $(INC_node) -Itests $(CHECK_CFLAGS) -c $< -o $@
$(BUILD)/check_%: $(BUILD)/obj/tests/check_%.o $(NODE_OBJ) $(SWARM_OBJ) $(NET_OBJ) $(BLAS_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(CHECK_LIBS) $(NODE_LIBS) $(LIBS) -o $@

# a stand-in plugin: check_blas tests how a plugin is found, loaded and checked
$(BUILD)/check_blas: | $(BUILD)/fake-cuda.so
$(BUILD)/check_cuda: | $(CUDA_EMU)
$(BUILD)/fake-cuda.so: tests/fake_cuda.c blas/blas.h
	@mkdir -p $(@D)
	$(Q)$(CC) -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden -Iblas $< -o $@

# keep test objects between builds (they are intermediate to the pattern rule)
.SECONDARY:

deps:
	@sh scripts/deps.sh
# make test's: also what the dashboard's tests run (a browser, Prometheus)
deps-test:
	@sh scripts/deps.sh test
.PHONY: deps-test

# `make test` installs what is missing, then re-reads this Makefile so the
# detection sees the new packages.
# (built JOBS at a time first; the tests run one after another, with no
# jobs in the environment of the make some of them run)
test: deps-test
	@$(MAKE) --no-print-directory -j$(JOBS) SAY_DETECTED=1 $(TEST_BINS)
	@$(MAKE) --no-print-directory check-all

SECONDS ?= 600
sim-soak: $(BUILD)/swarm
	@sh scripts/sim-soak.sh $(BUILD) --seconds $(SECONDS)

# A test-only swarm whose nodes can lie (--misbehave, node/daemon*.c): the
# same objects but the daemon's, compiled with SWARM_MISBEHAVE.
MISBEHAVE_OBJ := $(BUILD)/obj/node/daemon-misbehave.o $(BUILD)/obj/node/daemon_flags-misbehave.o
$(BUILD)/obj/node/%-misbehave.o: node/%.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC    $< (misbehave)")
	$(Q)$(CC) $(CFLAGS_BASE) $(INC_node) -DSWARM_MISBEHAVE -c $< -o $@
$(BUILD)/swarm-misbehave: $(BUILD)/obj/node/main.o $(MISBEHAVE_OBJ) $(SWARM_OBJ) $(NET_OBJ) $(BLAS_OBJ) \
                          $(filter-out $(BUILD)/obj/node/daemon.o $(BUILD)/obj/node/daemon_flags.o,$(NODE_OBJ))
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(NODE_LIBS) $(LIBS) -o $@

TEST_BINS := $(BUILD)/swarm $(CUDA_PLUGIN) $(TEST_RUNNERS) $(BUILD)/rogue $(BUILD)/garbage \
             $(BUILD)/swarm-misbehave $(BUILD)/wanproxy $(BUILD)/bgpt_diff
check-all: $(TEST_BINS)
	@sh tests/run.sh $(BUILD)


# On a machine with a GPU: every CUDA op against the CPU's (check_cuda), the
# model tests against the PyTorch reference on CUDA, a swarm of a CPU and a
# GPU replica. Each part says SKIP and passes where there is no usable GPU.
test-gpu: $(BUILD)/swarm $(CUDA_PLUGIN) $(BUILD)/check_cuda $(BUILD)/check_node
	@sh tests/gpu.sh $(BUILD)

bench-gpu: $(BUILD)/swarm $(CUDA_PLUGIN)
	@sh scripts/bench-gpu.sh $(BUILD)

# the unit tests, then a swarm under ASan while garbage floods its port
asan:
	@$(MAKE) --no-print-directory -j$(JOBS) SANITIZER=asan $(patsubst build/%,build-asan/%,$(TEST_RUNNERS)) build-asan/swarm build-asan/garbage
	@SWARM_UNIT_ONLY=1 sh tests/run.sh build-asan
	@echo "== tests/test_garbage.sh"
	@sh tests/test_garbage.sh build-asan

demo: deps
	@$(MAKE) --no-print-directory SAY_DETECTED=1 $(BUILD)/swarm
	@sh scripts/demo.sh $(BUILD)

bench: $(BUILD)/swarm $(BUILD)/bench_gemm $(BUILD)/bench_net
	@sh scripts/bench-train.sh $(BUILD)
	@sh scripts/bench-net.sh $(BUILD)

# test-only misbehaving peers (tests/test_swarm.sh, tests/test_garbage.sh)
$(BUILD)/rogue: $(BUILD)/obj/tests/rogue.o $(NET_OBJ)
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(LIBS) -o $@
$(BUILD)/garbage: $(BUILD)/obj/tests/garbage.o $(NET_OBJ)
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(LIBS) -o $@

# the tests' comparison of two weight files (tests/test_audit.sh)
$(BUILD)/bgpt_diff: $(BUILD)/obj/tests/bgpt_diff.o $(NODE_OBJ) $(SWARM_OBJ) $(NET_OBJ) $(BLAS_OBJ)
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(NODE_LIBS) $(LIBS) -o $@

# a TCP relay that emulates a slow, far, lossy link where the kernel has no
# netem (scripts/wan-swarm.sh); it knows nothing of swarm
$(BUILD)/wanproxy: $(BUILD)/obj/tests/wanproxy.o
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ -lm -o $@

$(BUILD)/bench_gemm: $(BUILD)/obj/tests/bench_gemm.o $(BLAS_OBJ)
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(LIBS) -o $@

# ---- fuzz targets, and their seed corpora replayed by the unit tests --------
# A target per decoder of untrusted bytes (tests/fuzz.h). Without libFuzzer,
# check_net and check_node replay tests/corpus/<target> through them.
$(BUILD)/check_net: $(BUILD)/obj/tests/fuzz_wire.o $(BUILD)/obj/tests/fuzz_keys.o \
                    $(BUILD)/obj/tests/fuzz_meta.o $(BUILD)/obj/tests/fuzz.o
$(BUILD)/check_node: $(BUILD)/obj/tests/fuzz_files.o $(BUILD)/obj/tests/fuzz_status.o \
                     $(BUILD)/obj/tests/fuzz.o

# make fuzz [FUZZ_TIME=seconds per target] [FUZZ_TARGETS="wire keys"]
# [FUZZ_JOBS=N]: build each target with clang (libFuzzer, ASan, UBSan) and
# run it from its seed corpus for FUZZ_TIME seconds, FUZZ_JOBS targets at a
# time (default: one a core); new inputs go to build-fuzz/corpus/<target>,
# a crash to build-fuzz/crash-<target>-*, and make stops there.
FUZZ_CC      ?= clang
FUZZ_TIME    ?= 60
FUZZ_JOBS    ?= $(JOBS)
FUZZ_TARGETS ?= wire files keys meta status
FUZZ_BUILD   := build-fuzz
FUZZ_FLAGS   := -std=c11 -D_GNU_SOURCE -DSWARM_LIBFUZZER -O1 -g -fno-omit-frame-pointer \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
                -Inet -Inode -Iblas -Iswarm -Itests $(BLAS_CFLAGS) $(ZMQ_CFLAGS) $(SODIUM_CFLAGS) \
                $(JANSSON_CFLAGS) $(MHD_CFLAGS) -DDASHBOARD_PATH='"node/dashboard.html"'
FUZZ_LIBS    := $(ZMQ_LIBS) $(SODIUM_LIBS) -lm -lpthread
FUZZ_SRC_wire   := tests/fuzz_wire.c net/wire.c net/codec.c
FUZZ_SRC_keys   := tests/fuzz_keys.c $(NET_SRC)
FUZZ_SRC_meta   := tests/fuzz_meta.c $(NET_SRC) swarm/engine_decode.c
FUZZ_SRC_files  := tests/fuzz_files.c node/files.c node/model.c
FUZZ_SRC_status := tests/fuzz_status.c node/status.c node/cmd_status.c node/join.c node/dashboard.c \
                   node/dashboard_page.S $(NET_SRC)
FUZZ_LIBS_status := $(JANSSON_LIBS) $(MHD_LIBS)
FUZZ_LEN_wire   := 16384
FUZZ_LEN_files  := 16384
FUZZ_LEN_keys   := 4096
FUZZ_LEN_meta   := 4096
FUZZ_LEN_status := 8192

.SECONDEXPANSION:
$(FUZZ_BUILD)/fuzz_%: $$(FUZZ_SRC_$$*) tests/fuzz.h net/net.h net/wire.h node/node.h
	@mkdir -p $(@D)
	@$(if $(Q),echo "  FUZZ  $@")
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) $(FUZZ_SRC_$*) $(FUZZ_LIBS_$*) $(FUZZ_LIBS) -o $@

fuzz: deps-fuzz
	@$(MAKE) --no-print-directory -j$(JOBS) $(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_TARGETS))
	@$(MAKE) --no-print-directory -j$(FUZZ_JOBS) $(patsubst %,fuzz-run-%,$(FUZZ_TARGETS))

# one target for FUZZ_TIME s on a core of its own (the time is per target)
fuzz-run-%: $(FUZZ_BUILD)/fuzz_%
	@mkdir -p $(FUZZ_BUILD)/corpus/$*
	@echo "== fuzz_$*: $(FUZZ_TIME) s from tests/corpus/$*"
	@$< -max_total_time=$(FUZZ_TIME) -max_len=$(FUZZ_LEN_$*) -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/crash-$*- $(FUZZ_BUILD)/corpus/$* tests/corpus/$* \
	    >$(FUZZ_BUILD)/fuzz_$*.log 2>&1 \
	    || { tail -40 $(FUZZ_BUILD)/fuzz_$*.log; \
	         echo "fuzz_$*: a finding: the input is $(FUZZ_BUILD)/crash-$*-*; fix the decoder," \
	              "then add the input to tests/corpus/$* (as bad-... or ok-...)"; exit 1; }
	@grep -E "^(stat::number_of_executed_units|stat::new_units_added|Done)" $(FUZZ_BUILD)/fuzz_$*.log

deps-fuzz:
	@sh scripts/deps.sh fuzz
.PHONY: deps-fuzz

# make bench-net: loopback round trips and throughput with CURVE, codec MB/s
$(BUILD)/bench_net: $(BUILD)/obj/tests/bench_net.o $(NET_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(LIBS) -o $@

bench-net: $(BUILD)/bench_net
	@sh scripts/bench-net.sh $(BUILD)
.PHONY: bench-net

# scripts/bench-dashboard.sh: what a STATUS reply costs the engine, and a
# dashboard the router (beside its own CPU use)
$(BUILD)/bench_status: $(BUILD)/obj/tests/bench_status.o $(SWARM_OBJ) $(NET_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS_BASE) $^ $(JANSSON_LIBS) $(LIBS) -o $@

# ---- make release: one file for a volunteer ---------------------------------
# $(BUILD)/release/swarm-linux-x86_64: $(BUILD)/swarm's objects, linked so
# that only glibc stays dynamic (libc, libm, ld-linux; also libdl, libpthread
# and librt on a glibc older than 2.34). OpenBLAS, libzmq, libsodium, jansson
# and what they pull in (libstdc++, libgomp, libgfortran, libquadmath, libgcc;
# libzmq's libpgm, libnorm + libprotokit, libbsd + libmd) come from their .a
# files, the ones pkg-config --static lists, in one link group so their order
# does not matter; a member goes in only when something references it (of
# OpenBLAS, all its DYNAMIC_ARCH kernels: most of the 30 MB). docs/release.md.
#
# GSSAPI: Debian's libzmq.a has its Kerberos mechanism built in, and Debian
# ships no static libgssapi_krb5 (nor libkrb5, libk5crypto). Linked
# dynamically they would bring six non-glibc libraries back; a libzmq built
# from source without them costs minutes on 2 cores and a deb-src entry.
# swarm never uses GSSAPI: libzmq makes a GSSAPI mechanism only for a socket
# whose own ZMQ_MECHANISM is GSSAPI (zmtp_engine.cpp, handshake_v3_x: a peer's
# greeting cannot ask for one), and swarm sets only CURVE. So the release
# links no-gssapi.o in their place: every gss_* function libzmq.a references
# (read with nm, so the list follows libzmq) returns GSS_S_FAILURE, and the
# GSS_C_NT_* name types are NULL. (Leaving them weak and undefined does not
# link into a PIE: libzmq reads the name types PC-relative.)
#
# GnuTLS: Debian's libmicrohttpd.a has HTTPS built in, and Debian ships no
# static libp11-kit, which a static libgnutls needs. swarm status --serve
# never asks for TLS (no MHD_USE_TLS: libmicrohttpd calls GnuTLS only for
# a daemon started with it, and gnutls_global_init at load), so the release
# links no-gnutls.o instead: gnutls_global_init succeeds, every other
# gnutls_* function libmicrohttpd.a references (read with nm) returns
# GNUTLS_E_INVALID_REQUEST, and gnutls_malloc is NULL.
RELEASE       := $(BUILD)/release
RELEASE_BIN   := $(RELEASE)/swarm-linux-x86_64
RELEASE_ZMQ_A ?= /usr/lib/$(MULTIARCH)/libzmq.a
RELEASE_MHD_A ?= /usr/lib/$(MULTIARCH)/libmicrohttpd.a
RELEASE_GSS   := -lgssapi_krb5 -lkrb5 -lk5crypto -lcom_err -lkrb5support
RELEASE_GLIBC := -pthread -lpthread -lrt -lm -ldl
# libnorm.pc lists these for parts of libnorm that libzmq never reaches (the
# link takes nothing from them), and libzmq3-dev does not bring all their .a
RELEASE_UNUSED := -lxml2 -licui18n -licuuc -licudata -lz -llzma
# (deferred: pkg-config runs only when the release is linked)
RELEASE_PC     = $(shell pkg-config --static --libs libzmq libsodium jansson 2>/dev/null \
                   || echo -lzmq -lstdc++ -lpgm -lnorm -lprotokit -lbsd -lmd -lsodium -ljansson)
RELEASE_LIBS   = -Wl,-Bstatic -Wl,--start-group $(filter -L% -l%,$(BLAS_LIBS)) \
                 $(patsubst lib%.a,-l%,$(filter-out -L% $(RELEASE_GSS) $(RELEASE_GLIBC) $(RELEASE_UNUSED),$(RELEASE_PC))) \
                 -lmicrohttpd -lstdc++ -lgfortran -lquadmath -lgomp -Wl,--end-group \
                 -Wl,-Bdynamic -static-libgcc -Wl,--as-needed -lm -ldl -lpthread -lrt

release: $(RELEASE_BIN) $(if $(CUDA_PLUGIN),$(RELEASE)/swarm-cuda.so)
	@echo "release: $(RELEASE_BIN), $$(du -m $(RELEASE_BIN) | cut -f1) MB, dynamic:" \
	    "$$(readelf -d $(RELEASE_BIN) | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
	$(if $(CUDA_PLUGIN),@echo "release: $(RELEASE)/swarm-cuda.so beside it (needs libcublas on the GPU machine)")
.PHONY: release

$(RELEASE)/obj/no-gssapi.c: $(wildcard $(RELEASE_ZMQ_A))
	@mkdir -p $(@D)
	@test -f $(RELEASE_ZMQ_A) || { echo "make release: no $(RELEASE_ZMQ_A): it comes with libzmq3-dev" \
	    "(make deps), or set RELEASE_ZMQ_A=/path/to/libzmq.a"; exit 1; }
	$(Q){ echo "// generated by make release from nm -u $(RELEASE_ZMQ_A) (Makefile: GSSAPI)"; \
	  nm -u $(RELEASE_ZMQ_A) 2>/dev/null | awk '$$1 == "U" && $$2 ~ /^gss_/ { f[$$2] = 1 } \
	    $$1 == "U" && $$2 ~ /^GSS_C_/ { d[$$2] = 1 } \
	    END { for (s in f) print "unsigned int " s "(void) { return 13u << 16; } // GSS_S_FAILURE"; \
	          for (s in d) print "const void *" s ";" }' | LC_ALL=C sort; } >$@
$(RELEASE)/obj/no-gssapi.o: $(RELEASE)/obj/no-gssapi.c
	$(Q)$(CC) -std=c11 -O2 -Wall -Wextra -Werror -c $< -o $@

$(RELEASE)/obj/no-gnutls.c: $(wildcard $(RELEASE_MHD_A))
	@mkdir -p $(@D)
	@test -f $(RELEASE_MHD_A) || { echo "make release: no $(RELEASE_MHD_A): it comes with libmicrohttpd-dev" \
	    "(make deps), or set RELEASE_MHD_A=/path/to/libmicrohttpd.a"; exit 1; }
	$(Q){ echo "// generated by make release from nm -u $(RELEASE_MHD_A) (Makefile: GnuTLS)"; \
	  nm -u $(RELEASE_MHD_A) 2>/dev/null | awk '$$1 == "U" && $$2 ~ /^gnutls_/ { f[$$2] = 1 } \
	    END { for (s in f) if (s == "gnutls_malloc") print "void *gnutls_malloc;"; \
	          else if (s == "gnutls_global_init") print "int gnutls_global_init(void) { return 0; }"; \
	          else print "long " s "(void) { return -50; } // GNUTLS_E_INVALID_REQUEST" }' \
	    | LC_ALL=C sort; } >$@
$(RELEASE)/obj/no-gnutls.o: $(RELEASE)/obj/no-gnutls.c
	$(Q)$(CC) -std=c11 -O2 -Wall -Wextra -Werror -c $< -o $@

$(RELEASE_BIN): $(BUILD)/obj/node/main.o $(NODE_OBJ) $(SWARM_OBJ) $(NET_OBJ) $(BLAS_OBJ) $(RELEASE)/obj/no-gssapi.o \
                $(RELEASE)/obj/no-gnutls.o
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD    $@ (static but for glibc)")
	$(Q)$(CC) $(filter-out -fopenmp,$(LDFLAGS_BASE)) $^ $(RELEASE_LIBS) -o $@

$(RELEASE)/swarm-cuda.so: $(CUDA_PLUGIN)
	@mkdir -p $(@D)
	$(Q)cp $< $@

PREFIX ?= /usr/local
install: $(BUILD)/swarm $(CUDA_PLUGIN)
	install -D -m 755 $(BUILD)/swarm $(DESTDIR)$(PREFIX)/bin/swarm
	$(if $(CUDA_PLUGIN),install -D -m 755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/swarm/swarm-cuda.so)

clean:
	rm -rf build build-asan build-fuzz

help:
	@sed -n '2,15p' Makefile

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
