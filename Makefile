# noderun: `make run` runs the bundled examples, `make test` runs every test.
# Both install what is missing from Debian's packages (run as root).

GO          ?= go
BIN         := bin/noderun
RUN_DEPS    := containerd runc containernetworking-plugins iptables busybox-static
# gcc and libc6-dev: the race detector needs cgo; systemd-journal-remote
# writes the journal file the node log query's journalctl test reads;
# libseccomp-dev and pkg-config: make test-runtimes builds runc with seccomp.
TEST_DEPS   := $(RUN_DEPS) docker-registry iproute2 procps gcc libc6-dev e2fsprogs mount systemd-journal-remote libseccomp-dev pkg-config dbus-daemon
EXAMPLE_IMG := examples/images/busybox.tar
VERSION     := $(shell git describe --always --dirty 2>/dev/null || echo dev)
# A static binary (no libc to match on an appliance) is also 8 MiB smaller;
# the tags drop grpc's x/net/trace (and html/template) and urfave/cli's man
# page generator. e2e/harness_test.go and bench/ build the same way.
BUILD_ENV   := CGO_ENABLED=0
# noderun_logdriver embeds the containers' log driver, a program of its own
# (internal/logdriver) that build compiles first for the same platform and
# gzips.
BUILD_TAGS  := grpcnotrace,urfave_cli_no_docs,noderun_logdriver
DRIVER      := internal/logdriver/bin/log-driver

.PHONY: all build run test test-loaded test-short chaos soak soak-check lint deps test-deps example-image clean docs size-check

all: build

build:
	$(BUILD_ENV) $(GO) build -trimpath -ldflags "-s -w" -o $(DRIVER) ./internal/logdriver/driver
	gzip -9nf $(DRIVER)
	$(BUILD_ENV) $(GO) build -trimpath -tags $(BUILD_TAGS) -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN) .

# The release binary's budget: 30 MiB. make test fails over it; the output
# says by how much, so a feature's cost is seen where it is added.
MAX_BYTES := 31457280

size-check: build
	@size=$$(stat -c %s $(BIN)); \
	if [ $$size -gt $(MAX_BYTES) ]; then \
		echo "$(BIN) is $$size bytes: $$((size - $(MAX_BYTES))) over its budget of $(MAX_BYTES) (30 MiB)"; exit 1; \
	fi; \
	echo "$(BIN) is $$size bytes: $$(($(MAX_BYTES) - size)) under its budget of $(MAX_BYTES) (30 MiB)"

# Installs only the packages that are missing; apt-get update runs only then.
deps:
	@./.ci/install-packages $(RUN_DEPS)

test-deps:
	@./.ci/install-packages $(TEST_DEPS)
	@./.ci/pid-max

# An offline image packed from the host's busybox-static, named as the
# examples expect, so nothing is pulled from the internet.
example-image: deps
	$(GO) run ./internal/ociimage/cmd/mkimage -o $(EXAMPLE_IMG) -name docker.io/library/busybox:1.36

run: deps build example-image
	./$(BIN) --manifests examples/pods --images-dir examples/images

# The unit packages (not e2e and bench, which drive real daemons) run
# once more under the race detector.
RACE_PKGS := . ./cni/... ./crilog/... ./internal/... ./kubeapi/... ./manifests/... ./mirror/... ./runner/... ./systemd/...

test: test-deps lint size-check
	$(GO) test -count=1 -timeout 15m ./...
	CGO_ENABLED=1 $(GO) test -race -short -count=1 $(RACE_PKGS)

# make test on a busy machine: one busy loop pinned to each CPU for the
# whole run (.ci/loaded), killed afterwards whatever the result. Tests must
# hold here: a test that times the machine instead of noderun fails.
test-loaded:
	./.ci/loaded $(MAKE) test

# The e2e core (pods, restarts, adoption, exec, logs, images, network)
# against each containerd and runc pair: NODERUN_TEST_CONTAINERD=1.6
# (Debian's packages, what every other target runs), 1.7 and 2.x (built
# from their Go modules at the tags internal/testnode/runtimes.go names,
# cached in ~/.cache/noderun-test/runtimes; the first build takes minutes).
# Every pair runs; the ones that failed are named at the end.
RUNTIMES      ?= 1.6 1.7 2.x
RUNTIME_TESTS := TestPodRunsWithExpandedEnv|TestManifestEditReplacesPod|TestManifestRemovalCleansUp|TestInitContainerFillsEmptyDir|TestCrashLoopBackoff|TestRestartPolicyNever|TestLifecycleLivenessRestarts|TestLifecycleOOMKilled|TestLifecyclePreStop|TestRestartAdoptsRunningPods|TestManagedContainerdReusedAfterCrash|TestFirstStartWithoutSystemd|TestStartKillsStrayShim|TestPodsShareOneShim|TestKubectlLogsAndExec|TestLifecycleExecProbeTimeout|TestLogRotation|TestContainersLogThroughTheEmbeddedDriver|TestLogsWrittenWhileNoderunDown|TestImagesImportCommand|TestRegistryMirrorThenOfflineFallback|TestPodIPServesHTTP|TestPodToPodAndHostPort|TestPodDNSAndHostsFiles|TestUserNamespaces

.PHONY: test-runtimes
test-runtimes: test-deps
	@failed=; for rt in $(RUNTIMES); do \
		echo "== NODERUN_TEST_CONTAINERD=$$rt"; \
		NODERUN_TEST_CONTAINERD=$$rt $(GO) test -count=1 -timeout 40m -run '^($(RUNTIME_TESTS))$$' ./e2e || failed="$$failed $$rt"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-runtimes failed for:$$failed"; exit 1; fi

# A kubeadm control plane with noderun as the node agent (issue 36): builds
# kubeadm, kube-apiserver, kube-controller-manager, kube-scheduler and the
# etcd kubeadm expects from their Go modules at CONTROLPLANE's two patch
# versions (internal/testnode/kube.go; cached in ~/.cache/noderun-test/kube,
# the first build takes long), proves mirror mode against a real API server,
# then runs kubeadm init, upgrade apply to the second version and reset.
# kubeadm's dirs (/etc/kubernetes, /var/lib/etcd, /var/lib/kubelet, which
# reset empties) are tmpfs in a mount namespace of the test's own, which
# its containerd, noderun and kubeadm share: the host's stay untouched.
CONTROLPLANE ?= v1.34.2,v1.34.3

.PHONY: test-controlplane
test-controlplane: test-deps
	mkdir -p /etc/kubernetes /var/lib/etcd /var/lib/kubelet
	unshare --mount --propagation private sh -c 'for d in /etc/kubernetes /var/lib/etcd /var/lib/kubelet; do mount -t tmpfs controlplane $$d; done; \
		NODERUN_CONTROLPLANE=$(CONTROLPLANE) $(GO) test -count=1 -timeout 150m -run "^(TestMirrorModeAgainstAPIServer|TestKubeadmControlPlane)$$" -v ./e2e'

# The fault-injection suite at the issue's full sizes (make test runs it
# small); it prints a summary: scenarios, pods, healthy restarts, leaks, time.
chaos: test-deps
	NODERUN_CHAOS=long $(GO) test -count=1 -run 'TestChaos' -timeout 60m -v ./e2e

# The chaos suite's soak mode: one node kept busy for DURATION (pod churn,
# crashing and killed containers, probes, log follows, API watches) while
# its resources are sampled into soak-results/; it fails on growth. The
# timeout is DURATION plus 30m: Go adds up a duration's repeated units.
DURATION ?= 2h

soak: test-deps
	NODERUN_SOAK=$(DURATION) $(GO) test -count=1 -run 'TestSoak$$' -timeout $(DURATION)30m -v ./e2e

# Judges a soak's sample file again (CSV=soak-results/soak-....csv), also
# one still being written, its windows scaled to what it holds so far.
soak-check:
	NODERUN_SOAK_CHECK=$(abspath $(CSV)) $(GO) test -short -count=1 -run 'TestSoakCheck$$' -v ./e2e

test-short:
	$(GO) test -short ./...

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...

clean:
	rm -rf bin $(EXAMPLE_IMG) $(DRIVER).gz

# docs/reference/flags.md and fields.md, generated from the command line and
# manifests/fields.go; tests fail when they are stale.
docs:
	$(GO) generate . ./manifests

# Benchmarks against the floor (containerd + CNI driven directly); see
# docs/performance.md. Not part of `make test`, which runs a smoke.
BENCH_DEPS := $(RUN_DEPS) iproute2 e2fsprogs mount

.PHONY: bench bench-profile bench-profile-probes bench-peers

bench:
	@./.ci/install-packages $(BENCH_DEPS)
	$(GO) run ./bench -out bench-results/latest.json

# `make bench-peers` (issue 40): noderun, the floor, the kubelet in
# standalone static-pod mode (built from its Go module, cached in
# ~/.cache/noderun-test/kube) and podman kube play, side by side in one run;
# the table goes to stdout and bench-results/peers.md.
bench-peers:
	@./.ci/install-packages $(BENCH_DEPS) podman
	$(GO) run ./bench -peers -bursts 10,30,100 -peers-out bench-results/peers.md

bench-profile:
	@./.ci/install-packages $(BENCH_DEPS)
	$(GO) run ./bench -profile bench-results
	$(GO) tool pprof -top -nodecount=40 bench-results/noderun-cpu.pprof > bench-results/noderun-cpu.txt
	$(GO) tool pprof -top -nodecount=40 -sample_index=inuse_space bench-results/noderun-heap.pprof > bench-results/noderun-heap.txt
	$(GO) tool pprof -top -nodecount=40 -sample_index=alloc_space bench-results/noderun-heap.pprof > bench-results/noderun-allocs.txt
	@echo "profiles and their top functions are in bench-results/"

# Where noderun's probe CPU goes: 100 pods probed by httpGet every second.
bench-profile-probes:
	@./.ci/install-packages $(BENCH_DEPS)
	$(GO) run ./bench -profile bench-results/probes -profile-probes -profile-seconds 30
	$(GO) tool pprof -top -nodecount=40 bench-results/probes/noderun-cpu.pprof > bench-results/probes/noderun-cpu.txt
	$(GO) tool pprof -top -nodecount=40 -sample_index=alloc_space bench-results/probes/noderun-heap.pprof > bench-results/probes/noderun-allocs.txt
	@echo "profiles and their top functions are in bench-results/probes/"

# Releases, cross-architecture tests, the Debian package and installing.
# `make release`: static, reproducible binaries for amd64, arm64, armv7 and
# riscv64 in dist/, with SHA256SUMS (.ci/release says how the build is made
# reproducible). `make release-check` builds all four twice (the second from
# a copy of the tree elsewhere, with an empty build cache) and compares the
# bytes; `make test` does so for arm64 alone, a cold build of ~2.5 CPU-minutes.
RELEASE_DIR    := dist
RELEASE_ARCHES := amd64 arm64 armv7 riscv64
# The unit tests of arm64 and armv7 builds run under qemu user-mode
# emulation (no binfmt_misc needed: go test -exec runs the emulator).
# Tests that need what qemu-user lacks skip under it, saying why
# (testenv.SkipIfEmulated). `make test` runs the packages below (about 30 s
# of tests an architecture once compiled); `make test-cross` adds cni (root
# networking, ~40 s) and runner/containerd (a containerd, 3-5 min).
CROSS_QUICK_PKGS := . ./crilog/... ./internal/... ./manifests/... ./runner ./runner/prober ./systemd/...
CROSS_ARM64 := CGO_ENABLED=0 GOARCH=arm64 $(GO) test -exec qemu-aarch64-static -count=1 -timeout 20m
CROSS_ARMV7 := CGO_ENABLED=0 GOARCH=arm GOARM=7 $(GO) test -exec qemu-arm-static -count=1 -timeout 20m
TEST_DEPS   += qemu-user-static

.PHONY: release release-check test-release test-cross test-cross-quick deb test-deb install

release:
	./.ci/release $(RELEASE_DIR) $(VERSION) $(RELEASE_ARCHES)

release-check:
	./.ci/release-check $(VERSION) $(RELEASE_ARCHES)

# Run by make test (before its own recipe).
test: test-release test-cross-quick

test-release: test-deps
	./.ci/release-check $(VERSION) arm64

test-cross-quick: test-deps
	$(CROSS_ARM64) $(CROSS_QUICK_PKGS)
	$(CROSS_ARMV7) $(CROSS_QUICK_PKGS)

test-cross: test-deps
	$(CROSS_ARM64) $(RACE_PKGS)
	$(CROSS_ARMV7) $(RACE_PKGS)

# A .deb of each release binary (.ci/deb), installing to /usr/bin.
deb: build release
	./.ci/deb $(BIN) $(RELEASE_DIR) $(VERSION)

# Installs the amd64 package with apt into a fresh Debian root made by
# debootstrap (some minutes: not part of make test), then runs a pod with
# the installed binary on the e2e harness's containerd.
test-deb: test-deps deb
	@./.ci/install-packages debootstrap
	NODERUN_DEB="$$(ls $(CURDIR)/$(RELEASE_DIR)/noderun_*_amd64.deb)" $(GO) test -count=1 -timeout 30m -run 'TestDebPackage' -v ./e2e

# The VM test bed (e2e/vm, internal/testvm): a Debian 12 machine made by
# debootstrap from this host's mirror (.ci/vm-image; systemd, cgroup v2,
# Linux from linux-image-amd64, containerd 2.4.2 and runc 1.5.3 built as
# for test-runtimes), booted by qemu (KVM if usable, else TCG: slow), with
# the .deb installed and driven over ssh on a loopback port. The image is
# cached in ~/.cache/noderun-test/vm by its recipe's hash (a cold build
# takes minutes). VM_POWERCUTS sets the power cut scenario's count.
VM_DEPS      := debootstrap qemu-system-x86 qemu-utils e2fsprogs
VM_POWERCUTS ?= 20
# Only the amd64 package is needed: packed from make build's binary (the
# release's flags), not all four release builds.
VM_DIST      := $(RELEASE_DIR)/vm

.PHONY: test-vm
test-vm: test-deps build example-image
	@./.ci/install-packages $(VM_DEPS)
	rm -rf $(VM_DIST) && mkdir -p $(VM_DIST) && cp $(BIN) $(VM_DIST)/noderun-linux-amd64
	./.ci/deb $(BIN) $(VM_DIST) $(VERSION)
	NODERUN_VM=1 NODERUN_VM_POWERCUTS=$(VM_POWERCUTS) NODERUN_VM_DEB="$$(ls $(CURDIR)/$(VM_DIST)/noderun_*_amd64.deb)" \
		NODERUN_VM_IMAGE=$(CURDIR)/$(EXAMPLE_IMG) $(GO) test -count=1 -timeout 180m -v ./e2e/vm

# Binary, unit file and /etc/noderun/pods; with systemd running also
# daemon-reload and enable. PREFIX and DESTDIR are noderun install's
# --prefix and --root.
PREFIX ?= /usr/local
install: build
	./$(BIN) install --prefix $(PREFIX) --root $(or $(DESTDIR),/)
