# edgehop — two commands matter on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
GO ?= go
BIN := bin
GOFLAGS_BUILD := -trimpath
export CGO_ENABLED := 0

.PHONY: all build setup images demo test test-unit test-integration vet clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/edgehop ./cmd/edgehop
	$(GO) build $(GOFLAGS_BUILD) -ldflags '-s -w' -o $(BIN)/probe ./cmd/probe
	$(GO) build $(GOFLAGS_BUILD) -ldflags '-s -w' -o $(BIN)/dprgen ./cmd/dprgen

# Installs what is missing (Debian packages, CRIU >= 4.2 built from source,
# sysctls); a no-op when everything is there.
setup:
	@bash scripts/setup.sh

images: build setup
	$(BIN)/edgehop image build all

# The main job: set up, bring up a testbed, run services on different
# nodes, reach them from a client through the emulated links, tear down.
demo: build setup images
	@bash scripts/demo.sh

vet:
	$(GO) vet ./...

# Unit tests and privileged integration tests (real namespaces, runc, CRIU).
test: build setup images vet
	EDGEHOP_BIN=$(CURDIR)/$(BIN)/edgehop $(GO) test -count=1 -p 2 -timeout 40m ./...

clean:
	rm -rf $(BIN)
