# podnet: build, test, demo and lint. `make test` and `make demo` run
# scripts/setup first (it installs what is missing; needs root); `make demo` asks
# it only for what the demo uses (no Kubernetes build).

SHELL := /bin/bash
export PATH := $(or $(HOME),/root)/.cargo/bin:/usr/local/go/bin:$(PATH)

CARGO ?= cargo

.PHONY: all build release test test-release demo lint clean

all: build

build:
	$(CARGO) build --release

# The binary to install in /opt/cni/bin: static, so each plugin exec skips the
# dynamic loader (0.35 ms less per exec, BENCHMARKS.md), against musl when
# scripts/setup could install its target (scripts/lib/release-target.sh says why:
# glibc's start-up CPU detection costs 0.6 ms per exec on a VM), and not
# position-independent, so no start-up relocations either (with the Kubernetes
# client linked in, a PIE's 26,000 relocations cost 0.3-1 ms per exec), and with
# the plugin's functions laid out together (scripts/lib/release-rustflags.sh).
# Built for an explicit target so the flags do not reach proc macros.
RELEASE_TARGET = $(shell bash scripts/lib/release-target.sh)
RELEASE_RUSTFLAGS = $(shell bash scripts/lib/release-rustflags.sh)
release:
	target=$(RELEASE_TARGET) && \
	RUSTFLAGS="$(RELEASE_RUSTFLAGS)" $(CARGO) build --release --target "$$target" && \
	echo "static binary: target/$$target/release/podnet"

# The plugin's and the daemon's own paths again, against the static release
# binary (optimised, musl, its functions placed by scripts/lib/plugin-symbols.txt):
# the CNI commands through a real CNI client and directly, bad input, and crashes
# at every step. The rest of the suite reaches the release binary already: the
# real-node and cluster tests of `make test` run the image (make image), which
# holds this same binary. TEST_RELEASE_FILTER=all runs the whole suite.
TEST_RELEASE_FILTER ?= cnitool:: core_path:: bad_input:: crash_safety:: journal_faults::
test-release: release
	bash scripts/setup
	PODNET_TEST_BIN="$(CURDIR)/target/$(RELEASE_TARGET)/release/podnet" \
	PODNET_CNI_CLIENT="$(CURDIR)/.cache/bin/$$(cat .cache/cni-client)" \
	$(CARGO) test --test integration -- --skip real_node:: --skip cluster:: \
	$(if $(filter all,$(TEST_RELEASE_FILTER)),,$(TEST_RELEASE_FILTER))

# Every test, with everything it needs built first: scripts/setup (the Kubernetes
# binaries and runtimes, the cnitool client: .cache/cni-client names it) and the
# images the real-node and cluster tests import (make image). A test that cannot
# run here fails, naming what is missing; PODNET_ALLOW_SKIPS=1 lets it skip
# instead, and then the run ends with the count and names of the skipped tests
# (scripts/test-skips). The cluster tests run in a test process of their own,
# beside the rest (scripts/test-all).
test:
	bash scripts/setup
	$(MAKE) image
	rm -f target/test-skips.log
	rc=0; PODNET_SKIP_LOG="$(CURDIR)/target/test-skips.log" \
	PODNET_CNI_CLIENT="$(CURDIR)/.cache/bin/$$(cat .cache/cni-client)" CARGO="$(CARGO)" \
	bash scripts/test-all || rc=$$?; \
	bash scripts/test-skips target/test-skips.log && exit $$rc

demo:
	bash scripts/setup demo
	bash scripts/demo

# ... and scripts/doc-paths: the docs and comments name only modules and items
# that exist; and the unit tests of the soak's driver (scripts/lib/soak/test_*.py);
# and shellcheck on the shell scripts (scripts/, scripts/lib/*.sh, .ci/run);
# and the source's limits (lint/: the checker of function length and its tests, and
# the crate-wide check that no function outside tests is over 100 lines);
# and the Helm chart: helm lint, and deploy/ equal to the chart rendered with its
# defaults (scripts/render-deploy --check; helm from scripts/k8s-binaries).
HELM ?= $(or $(PODNET_K8S_DIR),$(or $(HOME),/root)/.cache/podnet-k8s)/bin/helm
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	python3 scripts/doc-paths
	shellcheck $$(bash scripts/shell-scripts)
	cd scripts/lib/soak && python3 -m unittest -q test_cluster
	$(CARGO) test --test lint_limits
	$(HELM) lint --strict charts/podnet
	PODNET_HELM=$(HELM) bash scripts/render-deploy --check

clean:
	$(CARGO) clean
	rm -rf .cache

# Performance run (root): podnet vs ptp/bridge + host-local vs the kernel floor,
# resource figures; results in target/bench/ (see BENCHMARKS.md). BENCH_MICRO=1
# also runs the criterion micro-benchmarks (cargo bench).
.PHONY: bench bench-operator bench-agent-scale bench-cluster
bench:
	bash scripts/setup
	bash scripts/bench

# Operator scale (root): 1,000 and 5,000 CiliumNodes created at once against a real
# kube-apiserver; time until all have CIDRs, operator CPU and RSS, API writes per
# node, podnet and cilium-operator v1.20.2 in the same run (BENCHMARKS.md; the first
# run builds cilium-operator-generic: scripts/k8s-binaries peers).
bench-operator:
	bash scripts/setup
	bash scripts/bench-operator

# Agent scale (root): one node's agent against 1,000 and 5,000 simulated nodes on a
# real kube-apiserver, podnet (tunnel, native) and flanneld v0.28.10 (VXLAN) in the
# same run: time and CPU to converge, RSS, churn of 100 joins + 100 deletions, watch
# bytes, API requests at rest (BENCHMARKS.md; the first run builds flanneld:
# scripts/k8s-binaries flannel).
bench-agent-scale:
	bash scripts/setup
	bash scripts/bench-agent-scale

# Cluster figures (root): a multi-pool burst on a fresh node (blocks through the
# operator and the API server), API-server writes per mode for 100 pod ADD+DEL and
# per node join, agent memory on a node of a 5,000-pod cluster (BENCHMARKS.md).
bench-cluster:
	bash scripts/setup
	bash scripts/bench-cluster

# Fuzzing (not part of `make test` or CI; needs the nightly toolchain, installs
# cargo-fuzz if missing): builds fuzz/ and runs each target for FUZZ_SECONDS,
# one after the other, printing a summary line per target. See fuzz/README.md.
FUZZ_SECONDS ?= 60

.PHONY: fuzz
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash fuzz/run.sh $(FUZZ_TARGETS)

# Container images without a container engine (scripts/oci-image writes OCI
# archives from the Containerfiles), into target/image/: podnet (the static
# release binary and this host's nft with its libraries and loader, tagged with the
# crate version: deploy/ uses that tag), the pod sandbox's pause (gcc -static) and
# busybox for test pods (Debian's busybox-static). `ctr images import` and so
# scripts/node take them.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
IMAGE_DIR := target/image

.PHONY: image node node-down
image: release
	@test -x /usr/sbin/nft || { echo "make image: /usr/sbin/nft is missing: apt-get install nftables" >&2; exit 1; }
	@for f in /usr/sbin/nft $$(ldd /usr/sbin/nft | grep -o '/[^ ]*'); do \
		grep -v "^ *#" Containerfile | grep -qF "$$f" || { echo "make image: nft needs $$f (ldd /usr/sbin/nft), which Containerfile does not copy" >&2; exit 1; }; done
	python3 scripts/oci-image --stage nft=/ Containerfile "target/$(RELEASE_TARGET)/release" ghcr.io/podnet/podnet:$(VERSION) $(IMAGE_DIR)/podnet.oci.tar
	mkdir -p $(IMAGE_DIR)/pause
	gcc -static -O2 -Wall -Wextra -Werror -o $(IMAGE_DIR)/pause/pause images/pause/pause.c
	python3 scripts/oci-image images/pause/Containerfile $(IMAGE_DIR)/pause registry.k8s.io/pause:3.10 $(IMAGE_DIR)/pause.oci.tar
	@if readelf -l /bin/busybox 2>/dev/null | grep -q 'interpreter'; then \
		echo "make image: /bin/busybox is dynamically linked: apt-get install busybox-static" >&2; exit 1; fi
	python3 scripts/oci-image images/busybox/Containerfile /bin localhost/busybox:1.35 $(IMAGE_DIR)/busybox.oci.tar

# A one-node Kubernetes cluster (kubelet + a runtime) to try podnet on: see
# scripts/node (PODNET_NODE_RUNTIME=containerd2 or crio: builds them first). Then
# `scripts/node kubectl apply -f deploy/`.
node: image
	bash scripts/k8s-binaries >/dev/null
	if [ "$${PODNET_NODE_RUNTIME:-containerd1}" != containerd1 ]; then bash scripts/k8s-binaries runtimes >/dev/null; fi
	bash scripts/node start

node-down:
	bash scripts/node stop

# Pod start-up latency on the real node: podnet (deploy/) against bridge +
# host-local, same run, same node (scripts/bench-node; ~2 min).
.PHONY: bench-node
bench-node: image
	bash scripts/k8s-binaries >/dev/null
	bash scripts/bench-node

# podnet against flannel on the three-node cluster, side by side in one run
# (root): pod start-up and release, API server load, agent memory, and pod-to-pod
# and pod-to-Service throughput and latency (scripts/bench-peers, BENCHMARKS.md;
# BENCH_PARTS=net for the network part alone).
.PHONY: bench-peers
bench-peers: image
	bash scripts/k8s-binaries peers runtimes >/dev/null
	$(CARGO) build
	bash scripts/bench-peers

# L2 announcements on the three-node dual-stack cluster (root), tunnel and native:
# failover measured from the world (10 power-offs of the answering node) and the
# agents' API requests at rest with 1, 100 and 1,000 LoadBalancer Services
# (scripts/bench-l2, BENCHMARKS.md; report in target/bench-l2/report.md).
.PHONY: bench-l2
bench-l2: image
	bash scripts/k8s-binaries >/dev/null
	bash scripts/bench-l2

# Pod bandwidth limits (root): 10 and 100 Mbit/s pods across two nodes, podnet's
# shaping against the reference bandwidth plugin chained after podnet, with iperf3;
# ADD latency with the option off and on (scripts/bench-bandwidth, BENCHMARKS.md).
.PHONY: bench-bandwidth
bench-bandwidth:
	bash scripts/bench-bandwidth

# A real multi-node cluster (root): a control plane and PODNET_CLUSTER_NODES
# (default 3) nodes, each a kubelet + a runtime (PODNET_CLUSTER_RUNTIMES; default
# containerd 2, CRI-O, containerd 1.6) + kube-proxy in network and mount namespaces
# of their own, CoreDNS, and podnet from deploy/ (scripts/cluster, docs/cluster.md). Done when every node is Ready. Then `scripts/cluster kubectl ...`.
.PHONY: cluster cluster-down
cluster: image
	bash scripts/k8s-binaries runtimes >/dev/null
	bash scripts/cluster start
	bash scripts/cluster kubectl apply -f deploy/
	bash scripts/cluster kubectl wait --for=condition=Ready node --all --timeout=300s

cluster-down:
	bash scripts/cluster stop

# Kubernetes' own e2e network tests (v1.37.2) against podnet on a fresh 3-node
# cluster per routing mode (tunnel, then native): JUnit and summaries in
# target/conformance/ (docs/conformance.md). PODNET_CONFORMANCE_MODES picks the
# modes, PODNET_CONFORMANCE_FOCUS/_SKIP the specs (FOCUS=sig-network-broad: every
# [sig-network] spec that can run here; FOCUS=cnp: sig-network's
# ClusterNetworkPolicy suite instead). The cluster must not be running.
.PHONY: conformance
conformance: image
	bash scripts/setup
	bash scripts/k8s-binaries e2e runtimes >/dev/null
	bash scripts/e2e-images
	bash scripts/conformance

# An hour of faults on the three-node cluster under pod churn (root; issue 40):
# scripts/soak, SOAK_MINUTES (60), SOAK_ROUTING (tunnel|native), SOAK_SEED (the
# faults' sequence, printed), SOAK_SETTLE (300 s). Report: target/soak/report.md
# and soak.png (docs/soak.md); exit 1 on any violation.
.PHONY: soak
soak:
	bash scripts/setup
	$(MAKE) image
	bash scripts/soak
