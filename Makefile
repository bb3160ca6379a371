# toolstackd: a XenAPI-compatible pool toolstack for KVM/QEMU hosts.
GO        ?= go
BIN       := bin
DATA_DIR  ?= $(CURDIR)/.toolstackd
LISTEN    ?= 127.0.0.1:8080
BACKEND   ?= simulator
FUZZTIME  ?= 5s
GOFLAGS_TEST ?= -race -count=1
# scripts/install-test-deps.sh installs the pinned golangci-lint here.
GOLANGCI_LINT ?= $(shell $(GO) env GOPATH)/bin/golangci-lint

# The version the binaries report (toolstackd --version, xe --version,
# host.software_version's build_number): git's description of the
# checkout, "dev" outside one.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X toolstackd/internal/version.Version=$(VERSION)
# make deb writes the Debian package here.
DEB_DIR   ?= $(BIN)

.PHONY: all build run test unit e2e fuzz bench generate check-generate lint clean deb

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
test: check-generate lint unit fuzz e2e

unit:
	$(GO) test $(GOFLAGS_TEST) ./...

e2e: build
	@if [ -x tests/e2e/run.sh ]; then tests/e2e/run.sh; else echo "no end-to-end suites yet"; fi

# Runs each fuzz target for FUZZTIME (longer: make fuzz FUZZTIME=5m).
fuzz:
	@scripts/fuzz.sh $(FUZZTIME)

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
