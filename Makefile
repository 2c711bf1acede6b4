# OpenClaw cloud-worker gateway. `make help` lists the targets.
GO        ?= go
BIN       ?= bin/openclaw
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -s -w -X github.com/openclaw/cloudworkers/internal/version.Version=$(VERSION) -X github.com/openclaw/cloudworkers/internal/version.Commit=$(COMMIT)
# Packages with concurrency run under the race detector in `make test`.
RACE_PKGS := ./gateway/... ./providers/... ./internal/... ./protocol/... ./worker/... ./sync/...
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: help build test race lint bench demo run bundles examples clean occ-driver-test openclaw-clients

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build bin/openclaw
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/openclaw

examples: ## build the example lease CLIs (examples/lease-dir, examples/lease-netns, examples/lease-crabbox)
	$(GO) build -o examples/lease-dir/lease-dir ./examples/lease-dir
	$(GO) build -o examples/lease-netns/lease-netns ./examples/lease-netns
	$(GO) build -o examples/lease-crabbox/lease-crabbox ./examples/lease-crabbox

bundles: ## cross-build worker bundles for linux/amd64 and linux/arm64 into dist/
	for arch in amd64 arm64; do CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o dist/openclaw-linux-$$arch ./cmd/openclaw || exit 1; done

test: ## run every test (race detector on concurrent packages); integration tests need root, sshd, ip
	@./scripts/openclaw-clients.sh >/dev/null || echo "openclaw-clients: not installed: TestOpenClawClients skips (fails under OPENCLAW_REQUIRE_INTEGRATION=1)"
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 15m ./...
	$(GO) test -count=1 -race -timeout 15m $(RACE_PKGS)

occ-driver-test: ## run examples/occ-compute-driver's node --test against a freshly built gateway (skipped without node >= 20)
	@if command -v node >/dev/null 2>&1 && node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'; then \
	  tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  CGO_ENABLED=0 $(GO) build -o "$$tmp/openclaw" ./cmd/openclaw && \
	  cd examples/occ-compute-driver && OPENCLAW_BIN="$$tmp/openclaw" node --test; \
	else echo "occ-driver-test: skipped: node >= 20 is not installed (Debian: apt-get install nodejs)"; fi

openclaw-clients: ## install OpenClaw's own clients at pinned versions (test-only; npm registry) for TestOpenClawClients
	./scripts/openclaw-clients.sh

race: ## run the concurrent packages under the race detector
	$(GO) test -count=1 -race -timeout 15m $(RACE_PKGS)

lint: ## gofmt, go vet, staticcheck, go mod tidy check
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cp go.mod /tmp/.openclaw-go.mod; cp go.sum /tmp/.openclaw-go.sum; $(GO) mod tidy; \
	  if ! cmp -s go.mod /tmp/.openclaw-go.mod || ! cmp -s go.sum /tmp/.openclaw-go.sum; then echo "go mod tidy changed go.mod/go.sum"; exit 1; fi

BENCH_PROFILE ?= $(CURDIR)/bench-gateway.pprof
# Only the packages with Go benchmarks: compiling every package's tests took most of `make bench`.
BENCH_PKGS = $(shell git ls-files '*_test.go' | xargs grep -l '^func Benchmark' | xargs -n1 dirname | sort -u | sed 's|^|./|')

bench: ## sync vs rsync to a netns sshd box; gateway capacity sections 1-6 (gateway/capacitybench, root, sshd, ssh); prompt-cache share across moves; Go benchmarks of the packages that have some
	OPENCLAW_BENCH=1 OPENCLAW_REQUIRE_INTEGRATION=1 $(GO) test -count=1 -timeout 30m -run '^TestSyncVsRsync$$' -v ./sync/bench
	OPENCLAW_BENCH=1 OPENCLAW_REQUIRE_INTEGRATION=1 OPENCLAW_BENCH_GATEWAY_CPUPROFILE=$(BENCH_PROFILE) $(GO) test -count=1 -timeout 20m -run '^(TestWorkersHeld|TestTokenRelayLatency|TestTunnelThroughput|TestProvisionLatency|TestDurableWrites|TestOpenClawDoor)$$' -v ./gateway/capacitybench
	$(GO) tool pprof -top -nodecount=30 $(BENCH_PROFILE) 2>/dev/null | head -40
	OPENCLAW_BENCH=1 OPENCLAW_REQUIRE_INTEGRATION=1 $(GO) test -count=1 -timeout 10m -run '^TestCacheShareAcrossMoves$$' -v ./cmd/openclaw
	$(GO) test -run '^$$' -bench . -benchtime 1x $(BENCH_PKGS)

demo: build examples ## run the product end to end on a temp data dir
	./scripts/demo.sh

run: build ## run a gateway on the default data dir
	$(BIN) gateway

clean: ## remove build output
	rm -rf bin dist examples/lease-dir/lease-dir examples/lease-netns/lease-netns bench-gateway.pprof
