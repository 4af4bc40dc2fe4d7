# One entry point for people and CI. `make demo` runs the main job locally;
# `make test` runs every check CI runs (.ci/run calls it after installing packages).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build

CARGO ?= cargo
TOOLS := target/testbed/bin
# The pinned Node and npm (.ci/node, installed by `make deps` into target/tools/node) come
# before any other on PATH: for ui/, ui/rancher/ and the browser test (integration/tests/ui.rs).
export PATH := $(CURDIR)/target/tools/node/node_modules/.bin:$(PATH)
HELM := $(TOOLS)/helm
CHART := charts/elemental-changelog

.PHONY: build deps deps-demo tools demo test lint fmt-check clippy doc helm-lint deny server unit fmt ui-test ui-extension bench

## build: compile the whole workspace
build:
	$(CARGO) build --locked --workspace

## deps: check Rust and Go, install what the tests need: Debian packages (a C compiler,
## docker-registry, chromium, ...), the pinned Node and npm (.ci/node), ui/ and ui/rancher/ npm packages
deps:
	.ci/deps test

## deps-demo: the same for the demo only (no Node, no chromium)
deps-demo:
	.ci/deps demo

## tools: build etcd, kube-apiserver, kubectl and helm into target/testbed/bin (cached)
tools:
	bash integration/testbed/build.sh

## server: build the binaries the end-to-end tests run: the server, the kubectl plugin and
## the UI extension's file server
server:
	$(CARGO) build --locked -p elemental-changelog-apiserver -p kubectl-elemental -p elemental-changelog-extension-server

## demo: a real control plane with our server registered; Ctrl-C tears it down
demo: deps-demo tools server
	$(CARGO) run --locked -p elemental-changelog-integration --bin demo

## bench: this server next to kube-apiserver and nginx on the real test bed, plus memory,
## re-sync latency and the criterion benches; writes docs/performance.md (not part of `test`;
## BENCH_QUICK=1 for a short run, see docs/development.md#benchmarks); the load generator is a
## release build too (a debug one spends the cores it measures on its own TLS)
BENCH_SERVER ?= $(CURDIR)/target/release/elemental-changelog-apiserver
bench: deps-demo tools
	$(CARGO) build --locked --release -p elemental-changelog-apiserver
	$(CARGO) build --locked --release -p elemental-changelog-integration --bin bench
	ELEMENTAL_CHANGELOG_BIN=$(BENCH_SERVER) $(CARGO) run --locked --release -p elemental-changelog-integration --bin bench

## test: every check: format, clippy, docs, chart, UI unit tests, the Rancher extension's build,
## unit, property and end-to-end tests (integration/tests/ui.rs is the UI's browser test,
## integration/tests/chart.rs serves the built extension as its UIPlugin names it)
test: deps lint tools server ui-test ui-extension
	$(CARGO) test --workspace --locked

## ui-test: type-check the UI (ui/) and run its unit tests on ui/fixtures/
ui-test:
	@test -d ui/node_modules || { echo "ui/node_modules is missing: run 'make deps' (npm ci in ui/)" >&2; exit 1; }
	cd ui && npm run --silent typecheck && npm test --silent

## ui-extension: build the Rancher extension (ui/rancher/pkg/elemental-changelog) with Rancher's
## shell as the extension creator's template does (`build-pkg`: webpack, with the TypeScript
## check); writes ui/rancher/dist-pkg/elemental-changelog-<version>/, which the chart's
## UIPlugin serves (the bundle report is left out, as Rancher's publish script does)
ui-extension:
	@test -d ui/rancher/node_modules || { echo "ui/rancher/node_modules is missing: run 'make deps' (npm ci in ui/rancher/)" >&2; exit 1; }
	cd ui/rancher && npm run --silent build-pkg elemental-changelog
	rm -f ui/rancher/dist-pkg/elemental-changelog-*/report.html

## lint: format check, clippy, rustdoc warnings, helm lint, the dependency policy
lint: fmt-check clippy doc helm-lint deny

## deny: the dependency policy of deny.toml (licenses, banned and duplicate crates, crates.io
## as the only source), offline. It reads the crates of every platform in Cargo.lock (a build
## downloads only this one's): `make deps` (.ci/deps) fetches them, this only checks they are
## there. RustSec advisories need the network: `cargo-deny check advisories`
CARGO_DENY := target/tools/cargo-deny/bin/cargo-deny
deny:
	@test -x $(CARGO_DENY) || { echo "$(CARGO_DENY) is missing: run 'make deps'" >&2; exit 1; }
	@$(CARGO) fetch --locked --offline --quiet || { echo "crates of Cargo.lock are missing from the cargo home: run 'make deps' (cargo fetch --locked, which needs crates.io)" >&2; exit 1; }
	$(CARGO_DENY) --offline check licenses bans sources

fmt-check:
	$(CARGO) fmt --all --check

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

doc:
	RUSTDOCFLAGS=-Dwarnings $(CARGO) doc --workspace --no-deps --locked

helm-lint: tools
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) --set tls.certManager.enabled=true,serviceMonitor.enabled=true,networkPolicy.enabled=true,networkPolicy.from[0].ipBlock.cidr=192.0.2.0/24
	$(HELM) lint --strict $(CHART) --values $(CHART)/ci/rancher-values.yaml
	$(HELM) template elemental-changelog $(CHART) --namespace cattle-elemental-system >/dev/null

## fuzz: run every cargo-fuzz target in fuzz/ for FUZZ_SECONDS each (nightly + cargo-fuzz; not part of `test`)
FUZZ_SECONDS ?= 30
FUZZ_TOOLCHAIN ?= +nightly
FUZZ_TARGETS ?= $(notdir $(basename $(wildcard fuzz/fuzz_targets/*.rs)))

.PHONY: fuzz
fuzz:
	for t in $(FUZZ_TARGETS); do \
		mkdir -p fuzz/target/corpus/$$t; \
		$(CARGO) $(FUZZ_TOOLCHAIN) fuzz run $$t fuzz/target/corpus/$$t fuzz/corpus/$$t -- -max_total_time=$(FUZZ_SECONDS); \
	done

## soak: the real test bed under mixed requests, channel churn and a hostile image for SOAK_SECONDS
## (default 600), sampling RSS, open fds and p99; prints a table and a verdict. Not part of `test`.
SOAK_SECONDS ?= 600
SOAK_SAMPLE_SECONDS ?= 10

.PHONY: soak
soak: tools server
	SOAK_SECONDS=$(SOAK_SECONDS) SOAK_SAMPLE_SECONDS=$(SOAK_SAMPLE_SECONDS) \
		$(CARGO) run --locked -p elemental-changelog-integration --bin soak
