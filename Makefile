# toolstackd: a XenAPI-compatible pool toolstack for KVM/QEMU hosts.
GO        ?= go
BIN       := bin
DATA_DIR  ?= $(CURDIR)/.toolstackd
LISTEN    ?= 127.0.0.1:8080
BACKEND   ?= simulator
FUZZTIME  ?= 5s
GOFLAGS_TEST ?= -race -count=1
# go test's -timeout, per package: a package that hangs is killed with
# every goroutine's stack (and counted as failed) instead of hanging the run.
TEST_TIMEOUT ?= 25m
# The packages make unit tests (narrower: make unit TEST_PKGS=./internal/db/...).
TEST_PKGS ?= ./...
# The directory make unit, fuzz and e2e write what make test's summary is
# made from: unit.json (tests/report's summary), fuzz.log, e2e.log. make
# test uses a temporary directory of its own unless this is set.
TEST_OUT  ?=
# scripts/install-test-deps.sh installs the pinned golangci-lint here.
GOLANGCI_LINT ?= $(shell $(GO) env GOPATH)/bin/golangci-lint
# tests/report: go test -json to go test's text, and the summaries.
REPORT    := $(BIN)/test-report

# Recipes run in bash with pipefail: `go test -json | report` fails when go
# test does, not only when the last command of the pipeline does.
SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c

# The version the binaries report (toolstackd --version, xe --version,
# host.software_version's build_number): git's description of the
# checkout, "dev" outside one.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X toolstackd/internal/version.Version=$(VERSION)
# make deb writes the Debian package here.
DEB_DIR   ?= $(BIN)

.PHONY: all build run test unit e2e fuzz bench generate check-generate lint clean deb test-report

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# The Debian package, toolstackd_<version>_<arch>.deb in DEB_DIR, built
# with dpkg-deb from a staged tree (packaging/build-deb.sh).
deb:
	GO=$(GO) packaging/build-deb.sh $(DEB_DIR) $(VERSION)

# Runs the daemon on an embedded default: plain HTTP on loopback, state
# under .toolstackd/ in this checkout, no root needed.
run: build
	$(BIN)/toolstackd --data-dir $(DATA_DIR) --listen $(LISTEN) --backend $(BACKEND)

# Every test: generated code is current, lint, unit tests with the race
# detector, a short pass of every fuzz target, and the end-to-end suites.
# Every stage runs even when one before it failed, so that the summary at
# the end covers the whole run: a line per stage with its counts, what
# failed, one line per group of skipped tests and why (what the run did not
# cover), and last, alone on its line, "N passed, N failed, N skipped" (CI
# reads it). check-generate and lint count as one check each; a stage that
# fails without counting a failure counts as one. make test fails if any
# stage failed.
TEST_STAGES := check-generate lint unit fuzz e2e
test:
	@$(MAKE) --no-print-directory test-report || { echo "make test: tests/report does not build: no summary"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
	@out="$(TEST_OUT)"; \
	if [ -z "$$out" ]; then out=$$(mktemp -d -t toolstackd-test.XXXXXX); trap 'rm -rf "$$out"' EXIT; else mkdir -p "$$out"; fi; \
	rm -f "$$out/unit.json" "$$out/fuzz.log" "$$out/e2e.log"; \
	stages=(); times=""; \
	for s in $(TEST_STAGES); do \
	  echo "=== make $$s"; rc=0; t0=$$SECONDS; \
	  $(MAKE) --no-print-directory $$s TEST_OUT="$$out" UNIT_SUMMARY=0 || rc=$$?; \
	  stages+=(-stage "$$s=$$rc"); times="$$times $$s $$((SECONDS-t0))s,"; \
	done; \
	echo "=== stage times:$${times%,}"; \
	$(REPORT) -print "$${stages[@]}" -fuzz "$$out/fuzz.log" -e2e "$$out/e2e.log" "$$out/unit.json"

# The unit tests, through tests/report: go test's usual text (every line,
# as with -v, when GOFLAGS_TEST has -v), then on its own the skipped tests
# and why (make test prints them in its summary instead).
# The suites that run the daemon or xe (internal/testkit/testdaemon) use make
# build's binaries instead of linking their own, one per test package.
UNIT_SUMMARY ?= 1
unit: build test-report
	@export TOOLSTACKD_BIN="$${TOOLSTACKD_BIN:-$(CURDIR)/$(BIN)/toolstackd}" XE_BIN="$${XE_BIN:-$(CURDIR)/$(BIN)/xe}"; \
	out="$(TEST_OUT)"; \
	if [ -z "$$out" ]; then out=$$(mktemp -d -t toolstackd-unit.XXXXXX); trap 'rm -rf "$$out"' EXIT; else mkdir -p "$$out"; rm -f "$$out/unit.json"; fi; \
	rc=0; \
	echo "$(GO) test -json $(GOFLAGS_TEST) -timeout $(TEST_TIMEOUT) $(TEST_PKGS) | $(REPORT)"; \
	$(GO) test -json $(GOFLAGS_TEST) -timeout $(TEST_TIMEOUT) $(TEST_PKGS) | \
	  $(REPORT) $(if $(filter -v,$(GOFLAGS_TEST)),-v) -name unit -summary "$$out/unit.json" || rc=$$?; \
	if [ "$(UNIT_SUMMARY)" = 1 ]; then $(REPORT) -print -stage unit=$$rc "$$out/unit.json" || true; fi; \
	exit $$rc

test-report:
	@$(GO) build -o $(REPORT) ./tests/report

# tests/e2e/run.sh ends with "N passed, N failed"; with TEST_OUT set its
# output is also kept in TEST_OUT/e2e.log for make test's summary.
e2e: build
	@if [ -x tests/e2e/run.sh ]; then tests/e2e/run.sh; else echo "no end-to-end suites yet"; echo "0 passed, 0 failed"; fi$(if $(TEST_OUT), | tee "$(TEST_OUT)/e2e.log")

# Runs each fuzz target for FUZZTIME (longer: make fuzz FUZZTIME=5m); with
# TEST_OUT set its output is also kept in TEST_OUT/fuzz.log.
fuzz:
	@scripts/fuzz.sh $(FUZZTIME)$(if $(TEST_OUT), | tee "$(TEST_OUT)/fuzz.log")

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

generate:
	$(GO) generate ./...

# make generate must leave no diff.
check-generate:
	@scripts/check-generate.sh

# gofmt, then golangci-lint with .golangci.yml (go vet, errcheck,
# staticcheck, unused, ineffassign, gosec).
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@[ -x "$(GOLANGCI_LINT)" ] || { echo "$(GOLANGCI_LINT) missing: run scripts/install-test-deps.sh"; exit 1; }
	$(GOLANGCI_LINT) run ./...

clean:
	rm -rf $(BIN)
