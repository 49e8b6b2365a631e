# flock build, test and demo. Everything a fresh machine needs is installed
# by the targets themselves (as root).
GO      ?= go
# conformance uses bash (PIPESTATUS)
SHELL   := /bin/bash
BIN     := bin
CMDS    := flock flock-agent flockctl flock-installer flock-policy flock-relay
# --version of every binary (cmd/internal/buildinfo), stamped by the linker:
# the same with -buildvcs=false or without .git (the go command's VCS stamp
# is the fallback).
# The release: the file VERSION is the one source of the binaries' version,
# the image tag `make image` builds and the tag deploy/ installs
# (deploy_test checks they agree).
RELEASE := $(shell cat VERSION)
VERSION ?= $(RELEASE)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
BUILDINFO := code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo
LDFLAGS := -s -w -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT)
# controller-gen renders k8s/apis into deepcopy code and the CRD in deploy/crd.
# v0.19.x is the line built on the Kubernetes 1.34 libraries.
CONTROLLER_GEN_VERSION ?= v0.19.0
CONTROLLER_GEN := $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

.PHONY: bench scale image release build test unit fuzz reliability soak demo demo-down deps vet clean generate generate-check e2e e2e-window conformance third-party

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags conformance ./e2e/
	$(GO) mod tidy -diff

# Unit tests only: no root needed (the few that need root skip without it;
# `make test` runs them and fails them if it cannot).
unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /e2e)

# Every fuzz target for FUZZTIME each, one after the other (seed corpora in
# <package>/testdata/fuzz/; plain `go test` runs them as regression tests).
FUZZTIME ?= 10s
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) ./.ci/fuzz
	# NetworkPolicy verdicts compiled for the kernel against the engine:
	# 20 times make test's corpus, from a new seed (printed; FLOCK_SEED=
	# replays it). One goroutine: without -race.
	FLOCK_SEED=$${FLOCK_SEED:-$$(date +%s)} FLOCK_VERDICTS_SCALE=20 FLOCK_REQUIRE_ROOT=1 $(GO) test -count=1 -v -run Differential ./k8s/netpol/verdicts

# RELIABILITY.md, generated: the fault tests (BFD, ToR failures, agent
# restarts under traffic, the crash storm, NetworkPolicy and node faults
# in TestKubernetes, Services under load in TestServicesTraffic, upgrades
# and downgrades under load in TestUpgrade) and the
# fuzz targets record
# their figures as JSON lines, e2e/cmd/reliability renders them. `make
# soak` is the same with the 10-minute BFD soak per ToR (CI runs 10 s).
# Each fault test runs RELIABILITY_REPEATS times (go test -count): the
# document gives n and min / median / max per fault, and marks a fault
# run fewer than 3 times. It records the commit (-dirty), the date and
# the machine, stamped before the tests run.
RELIABILITY_TESTS   ?= TestBFD$$|TestToRFailures|TestUnnumberedToRReplaced|TestAgentRestartUnderTraffic|TestCrashStorm|TestKubernetes$$|TestServicesTraffic$$|TestUpgrade$$
RELIABILITY_REPEATS ?= 3
# RELIABILITY_MERGE=1 (with RELIABILITY_TESTS narrowed): replace the
# sections of the tests run, keep the others' earlier rows (marked).
RELIABILITY_MERGE   ?=
RELIABILITY_OUT     := $(CURDIR)/out/reliability.jsonl
RELIABILITY_META    := $(CURDIR)/out/reliability.meta.json
FLOCK_BFD_SOAK    ?=
reliability: deps build
	@mkdir -p out && rm -f $(RELIABILITY_OUT) $(RELIABILITY_META)
	$(GO) run ./e2e/cmd/reliability -stamp $(RELIABILITY_META)
	FLOCK_RELIABILITY_OUT=$(RELIABILITY_OUT) FLOCK_BFD_SOAK=$(FLOCK_BFD_SOAK) $(GO) test -race -count=$(RELIABILITY_REPEATS) -timeout $$((90 * $(RELIABILITY_REPEATS)))m -p 1 -run '$(RELIABILITY_TESTS)' ./e2e/
	$(if $(RELIABILITY_MERGE),,FLOCK_RELIABILITY_OUT=$(RELIABILITY_OUT) FUZZTIME=$(FUZZTIME) GO=$(GO) ./.ci/fuzz)
	$(GO) run ./e2e/cmd/reliability -in $(RELIABILITY_OUT) -meta $(RELIABILITY_META) -out RELIABILITY.md $(if $(RELIABILITY_MERGE),-merge) -cmd 'make $(if $(FLOCK_BFD_SOAK),soak,reliability)$(if $(filter-out 3,$(RELIABILITY_REPEATS)), RELIABILITY_REPEATS=$(RELIABILITY_REPEATS))$(if $(RELIABILITY_MERGE), RELIABILITY_TESTS=$(RELIABILITY_TESTS) RELIABILITY_MERGE=1)'

soak:
	$(MAKE) reliability FLOCK_BFD_SOAK=10m

# Debian packages the labs need: BIRD 2 and FRR as ToR routers.
deps:
	@command -v bird >/dev/null && command -v vtysh >/dev/null && test -x /usr/lib/cni/ptp || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bird2 frr containernetworking-plugins; }

# The whole suite: unit tests, then the root-only integration tests in real
# network namespaces with real BIRD and FRR ToRs (they build the binaries
# themselves).
# The e2e packages run one at a time: they share the host (network
# namespaces, a Kubernetes node, /opt/cni/bin).
test: deps vet build
	FLOCK_REQUIRE_ROOT=1 $(GO) test -race -count=1 -timeout 10m $$($(GO) list ./... | grep -v /e2e)
	$(GO) test -race -count=1 -timeout 60m -p 1 ./e2e/...

# The project's Kubernetes end-to-end tests (root) on one release of the
# tested window: K8S=1.37 (the newest: Kubernetes v1.37.2, containerd
# v2.4.2; what `make test` and CI run) or K8S=1.35 (the oldest: v1.35.4,
# containerd v1.7.35). Everything is built from the Go module proxy and
# cached in /var/cache/flock-e2e by version.
K8S      ?= 1.37
K8S_TESTS ?= TestKubernetes
e2e: deps build
	FLOCK_K8S=$(K8S) $(GO) test -race -count=1 -timeout 90m -p 1 -run '$(K8S_TESTS)' ./e2e/

# Kubernetes' own e2e suite (network tests, built from the lab's release,
# cached) against the lab with flock, kube-proxy (nftables) and CoreDNS:
# the [sig-network] Conformance tests on an IPv6-primary and an
# IPv4-primary dual-stack node, and an IPv6-only one, and the NetworkPolicy
# suite; CONFORMANCE.md is written from the results. CONFORMANCE_FAMILIES
# and CONFORMANCE_SUITES (conformance, netpol, netpol-ci) narrow it; CI
# runs `conformance netpol-ci` on the IPv6-primary node.
CONFORMANCE_FAMILIES ?= ipv6 ipv4 ipv6only
CONFORMANCE_SUITES   ?= conformance netpol
CONFORMANCE_OUT      := $(CURDIR)/out/conformance.jsonl
conformance: deps build
	mkdir -p out && rm -f $(CONFORMANCE_OUT)
	for f in $(CONFORMANCE_FAMILIES); do \
	  FLOCK_CONFORMANCE_FAMILY=$$f FLOCK_CONFORMANCE_SUITES='$(CONFORMANCE_SUITES)' FLOCK_CONFORMANCE_OUT=$(CONFORMANCE_OUT) \
	    $(GO) test -tags conformance -count=1 -timeout 90m -p 1 -run '^TestConformance$$' -v ./e2e/ 2>&1 | tee out/conformance-$$f.log | grep -E '^(=== RUN|--- |    conformance_test|ok|FAIL|PASS)' ; \
	  test $${PIPESTATUS[0]} -eq 0 || fail=1; \
	done; \
	$(GO) run ./e2e/cmd/conformance -in $(CONFORMANCE_OUT) -out CONFORMANCE.md; \
	test -z "$$fail"

# Both ends of the window, one after the other.
e2e-window:
	$(MAKE) e2e K8S=1.35
	$(MAKE) e2e K8S=1.37

# Benchmarks (root): one table, every figure beside a baseline measured in
# the same run (CNI ADD/DEL against ptp+host-local through libcni and
# through an exec of cnitool per call, route latency on the ToR's wire and
# FIB, scale, memory against a bare GoBGP, restart, claim cost against a
# real kube-apiserver), written to BENCHMARKS.md (generated figures only;
# the hand-kept history is e2e/cmd/bench/CHANGES.md). A figure whose
# measurement failed fails the run. BENCH_FLAGS=-h lists the knobs.
bench: build deps
	$(GO) run ./e2e/cmd/bench -out BENCHMARKS.md $(BENCH_FLAGS)

# Scale (root, not in CI; about an hour at the full envelope): the lab's
# kube-apiserver filled to fractions of Kubernetes' 5,000-node envelope,
# one node running flock-agent, flock-policy and kube-proxy (the baseline)
# against it at rest and under churn; written to SCALE.md.
# SCALE_FLAGS=-h lists the knobs (-sizes 0.02 for a quick run).
scale: build deps
	$(GO) run ./e2e/cmd/scale -out SCALE.md $(SCALE_FLAGS)

# Local demo lab: BIRD ToR + two flock nodes, pods, BGP, pings, teardown.
# DEMO_FLAGS=-keep leaves it running; `make demo-down` removes it.
demo: deps build
	$(GO) run ./e2e/cmd/demo $(DEMO_FLAGS)

demo-down:
	$(GO) run ./e2e/cmd/demo -down

# Regenerate zz_generated.deepcopy.go and the CRD from the API types
# (`go run pkg@version` leaves go.mod alone).
generate:
	$(CONTROLLER_GEN) object paths=./k8s/apis/... crd paths=./k8s/apis/... output:crd:artifacts:config=deploy/crd

# third_party/kube-network-policies: the module at its pinned version with
# flock's patches (third_party/patches) applied; go.mod replaces it.
third-party:
	./third_party/update.sh

# Fail when the checked-in generated files are stale.
generate-check: generate third-party
	@git diff --exit-code -- third_party || { echo 'third_party is stale: run make third-party and commit'; exit 1; }
	@git diff --exit-code -- deploy/admin-network-policy/crd || { echo 'the AdminNetworkPolicy CRDs are stale: run make third-party and commit'; exit 1; }
	@test -z "$$(git status --porcelain -- deploy/admin-network-policy/crd)" || { git status --porcelain -- deploy/admin-network-policy/crd; echo 'untracked AdminNetworkPolicy CRDs: commit them'; exit 1; }
	@git diff --exit-code -- k8s/apis deploy/crd || { echo 'generated files are stale: run make generate and commit'; exit 1; }
	@test -z "$$(git status --porcelain -- k8s/apis deploy/crd)" || { git status --porcelain -- k8s/apis deploy/crd; echo 'untracked generated files: commit them'; exit 1; }

# The container image as a docker-archive tarball, built offline (no
# registry, no Docker engine): `ctr -n k8s.io images import out/flock-image.tar`.
IMAGE ?= docker.io/fritzlab/flock:$(RELEASE)
image:
	$(GO) run ./deploy/imagetar/mkimage -tag $(IMAGE) -out out/flock-image.tar

# The release, from the file VERSION (a VERSION=... here changes nothing),
# into out/release/<VERSION>/: bin/linux-<arch>/ (every binary, stamped as
# `make build` stamps them), flock-image-<VERSION>.tar (tagged
# docker.io/fritzlab/flock:<VERSION>), deploy/ (the manifests, pinned to
# that tag), RELEASE-NOTES.md (CHANGELOG.md's section) and SHA256SUMS.
# It refuses a VERSION that is not vMAJOR.MINOR.PATCH unless
# RELEASE_ALLOW_DEV=1, a CHANGELOG.md without the version's section (a -dev
# version's is Unreleased) and manifests pinned to another tag
# (deploy/release/release_test.go checks what it writes).
RELEASE_ALLOW_DEV ?=
release:
	$(GO) run ./deploy/release/mkrelease -out out/release -commit $(COMMIT) $(if $(filter 1,$(RELEASE_ALLOW_DEV)),-allow-dev)

clean:
	rm -rf $(BIN)
