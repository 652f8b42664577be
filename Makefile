# noderun: `make run` runs the bundled examples, `make test` runs every test.
# Both install what is missing from Debian's packages (run as root).

GO          ?= go
BIN         := bin/noderun
RUN_DEPS    := containerd runc containernetworking-plugins iptables busybox-static
# gcc and libc6-dev: the race detector needs cgo.
TEST_DEPS   := $(RUN_DEPS) docker-registry iproute2 procps gcc libc6-dev
EXAMPLE_IMG := examples/images/busybox.tar
VERSION     := $(shell git describe --always --dirty 2>/dev/null || echo dev)
# A static binary (no libc to match on an appliance) is also 8 MiB smaller;
# the tags drop grpc's x/net/trace (and html/template) and urfave/cli's man
# page generator. e2e/harness_test.go and bench/ build the same way.
BUILD_ENV   := CGO_ENABLED=0
BUILD_TAGS  := grpcnotrace,urfave_cli_no_docs

.PHONY: all build run test test-short chaos lint deps test-deps example-image clean

all: build

build:
	$(BUILD_ENV) $(GO) build -trimpath -tags $(BUILD_TAGS) -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN) .

# Installs only the packages that are missing; apt-get update runs only then.
deps:
	@./.ci/install-packages $(RUN_DEPS)

test-deps:
	@./.ci/install-packages $(TEST_DEPS)

# An offline image packed from the host's busybox-static, named as the
# examples expect, so nothing is pulled from the internet.
example-image: deps
	$(GO) run ./internal/ociimage/cmd/mkimage -o $(EXAMPLE_IMG) -name docker.io/library/busybox:1.36

run: deps build example-image
	./$(BIN) --manifests examples/pods --images-dir examples/images

# The unit packages (not e2e and bench, which drive real daemons) run
# once more under the race detector.
RACE_PKGS := . ./cni/... ./crilog/... ./internal/... ./kubeapi/... ./manifests/... ./runner/... ./systemd/...

test: test-deps lint
	$(GO) test -count=1 -timeout 15m ./...
	CGO_ENABLED=1 $(GO) test -race -short -count=1 $(RACE_PKGS)

# The fault-injection suite at the issue's full sizes (make test runs it
# small); it prints a summary: scenarios, pods, healthy restarts, leaks, time.
chaos: test-deps
	NODERUN_CHAOS=long $(GO) test -count=1 -run 'TestChaos' -timeout 60m -v ./e2e

test-short:
	$(GO) test -short ./...

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...

clean:
	rm -rf bin $(EXAMPLE_IMG)

# Benchmarks against the floor (containerd + CNI driven directly); see the
# README's Performance section. Not part of `make test`, which runs a smoke.
BENCH_DEPS := $(RUN_DEPS) iproute2

.PHONY: bench bench-profile

bench:
	@./.ci/install-packages $(BENCH_DEPS)
	$(GO) run ./bench -out bench-results/latest.json

bench-profile:
	@./.ci/install-packages $(BENCH_DEPS)
	$(GO) run ./bench -profile bench-results
	$(GO) tool pprof -top -nodecount=40 bench-results/noderun-cpu.pprof > bench-results/noderun-cpu.txt
	$(GO) tool pprof -top -nodecount=40 -sample_index=inuse_space bench-results/noderun-heap.pprof > bench-results/noderun-heap.txt
	$(GO) tool pprof -top -nodecount=40 -sample_index=alloc_space bench-results/noderun-heap.pprof > bench-results/noderun-allocs.txt
	@echo "profiles and their top functions are in bench-results/"
