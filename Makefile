# The commands people type.  CMake does the building; this file only names things.
BUILD ?= build
ASAN_BUILD ?= build-asan
PKG_BUILD ?= build-package
FUZZ_BUILD ?= build-fuzz
TSAN_BUILD ?= build-tsan
TSAN_SECONDS ?= 10
FUZZ_CC ?= clang-14
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
JOBS ?= $(shell nproc)
# Suites run in parallel (tests/CMakeLists.txt locks what they share).
TEST_JOBS ?= 2
FUZZ_JOBS ?= $(JOBS)
CMAKE_FLAGS ?=

.PHONY: all deps build test check demo test-asan test-tsan test-valgrind test-gpu fuzz clean format package agentlm bench-peer

all: build

deps:
	@sh .ci/deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: deps
	@$(MAKE) --no-print-directory build
	cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS)

# The inner loop between edits (about a minute): build, then the unit suites and
# the protocol / bad-input suites (ctest label `check`).  No `make deps`.
check: build
	cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS) -L check

demo: deps
	@$(MAKE) --no-print-directory build
	@sh examples/demo.sh $(BUILD)/bin

# The same tests under AddressSanitizer + UndefinedBehaviorSanitizer (run by .ci/run).
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCKV_SANITIZE=ON $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 ctest --output-on-failure -j $(TEST_JOBS)

# ThreadSanitizer (run by .ci/run): commitkvd, commitkv-worker and the bench built
# with -fsanitize=thread, then TSAN_SECONDS of commitkv-bench soak (compressor
# threads, worker kills; CUDA off).  Criterion's forking runner cannot start
# under TSan, so the suites stay with ASan; any report of ours fails this
# (libzmq, not instrumented, is suppressed: tests/tsan.supp).
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCKV_TSAN=ON -DCKV_WITH_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target commitkvd commitkv-worker commitkv-bench
	rm -rf $(TSAN_BUILD)/tsan-logs && mkdir -p $(TSAN_BUILD)/tsan-logs
	TSAN_OPTIONS="log_path=$(CURDIR)/$(TSAN_BUILD)/tsan-logs/report halt_on_error=0 suppressions=$(CURDIR)/tests/tsan.supp" \
	  $(TSAN_BUILD)/bin/commitkv-bench soak --workers 3 --sessions 2 --seconds $(TSAN_SECONDS) --kill-every-ms 1500 \
	  --restart-every-s 0
	@if ls $(TSAN_BUILD)/tsan-logs/report* >/dev/null 2>&1; then \
	  cat $(TSAN_BUILD)/tsan-logs/report*; echo "ThreadSanitizer reported races (above)"; exit 1; fi
	@echo "ThreadSanitizer: no report"

# valgrind memcheck (run by .ci/run): commitkvd of $(BUILD) under valgrind through
# a 10 s soak with worker kills, then through the integration suites of
# VALGRIND_SUITES (every daemon they start runs under memcheck:
# CKV_TEST_DAEMON_WRAP, tests/support/testutil.c; about 2 minutes); any
# memcheck error or definite/indirect leak of the daemon fails it
# (tests/valgrind/commitkvd.sh).  The suites that time the daemon (fairness,
# quotas under load) stay out: memcheck runs it 20-50x slower.
VALGRIND_SUITES ?= test_workers test_fault_matrix test_snapshot test_snapshot_faults test_hostile_arena \
  test_bad_input test_attach_abuse test_protocol_misuse test_remote test_tiers
test-valgrind: deps
	@$(MAKE) --no-print-directory build
	rm -rf $(BUILD)/valgrind-logs && mkdir -p $(BUILD)/valgrind-logs
	CKV_VALGRIND_LOGS=$(CURDIR)/$(BUILD)/valgrind-logs CKV_DAEMON=$(CURDIR)/$(BUILD)/bin/commitkvd \
	  $(BUILD)/bin/commitkv-bench soak --workers 2 --sessions 2 --seconds 10 --kill-every-ms 1500 \
	  --restart-every-s 0 --daemon $(CURDIR)/tests/valgrind/commitkvd.sh
	cd $(BUILD) && CKV_TEST_DAEMON_WRAP=$(CURDIR)/tests/valgrind/commitkvd.sh \
	  CKV_VALGRIND_LOGS=$(CURDIR)/$(BUILD)/valgrind-logs ctest --output-on-failure -j $(TEST_JOBS) \
	  -R "^($$(echo $(VALGRIND_SUITES) | tr ' ' '|'))$$"
	@if [ -n "$$(cat $(BUILD)/valgrind-logs/* 2>/dev/null)" ]; then \
	  cat $(BUILD)/valgrind-logs/*; echo "valgrind reported errors or leaks of commitkvd (above)"; exit 1; fi
	@echo "valgrind: commitkvd clean (no error, no definite or indirect leak)"

# Each libFuzzer target (tests/fuzz) for FUZZ_SECONDS on a copy of its seeds,
# FUZZ_JOBS targets at a time (default: one per core),
# built with clang, ASan and UBSan in $(FUZZ_BUILD); fails on any finding and
# prints the reproducer.  FUZZ_TARGETS="requests arena" runs only those.
fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=$(FUZZ_CC) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKV_FUZZ=ON \
	  -DCKV_WITH_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_all
	FUZZ_JOBS=$(FUZZ_JOBS) sh tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Every GPU check in one go (a machine with an NVIDIA GPU): build, CUDA kernel
# tests against the CPU oracle, CUDA arena tests, GPU kernel benchmark.
test-gpu:
	bash tests/gpu/run.sh

# The .deb (CPack): a build configured for /usr, then cpack.  Prints its path.
package: deps
	cmake -S . -B $(PKG_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr $(CMAKE_FLAGS)
	cmake --build $(PKG_BUILD) -j $(JOBS)
	cd $(PKG_BUILD) && cpack -G DEB
	@ls -1 $(PKG_BUILD)/commitkv_*.deb

# The honest peer (issue 42): ggml's CPU kernels from the llama.cpp source in the npm
# package node-llama-cpp, built into $(BUILD)/peer by bench/peer/build.sh (never part of
# the CMake build or CI), then `commitkv-bench kernels --peer` with PEER_ARGS: each row
# gains ratio_peer (peer time / ours), or says "skipped" where the peer could not be
# built (no npm registry).  PEER_RUN=0: build the peer only.
PEER_ARGS ?= --tokens 32768 --json
PEER_RUN ?= 1
bench-peer: build
	@JOBS=$(JOBS) sh bench/peer/build.sh $(BUILD) || echo "bench-peer: the ggml peer was not built; its rows say skipped"
	@if [ "$(PEER_RUN)" != 0 ]; then uptime >&2; $(BUILD)/bin/commitkv-bench kernels --peer $(BUILD)/peer/bin/ckv-ggml-peer $(PEER_ARGS); fi

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(PKG_BUILD) $(FUZZ_BUILD)

# The agent LM (tools/agentlm/README.md): generate, train the committed
# tools/agentlm/agentlm.bin again from its seed (about 55 minutes on 2 cores;
# AGENTLM_PRESET=gpu on a GPU), export build/agentlm/model.bin, check it against
# the C forward pass, measure recall, print its sha256.  Needs python3-torch.
agentlm:
	sh tools/agentlm/train.sh
