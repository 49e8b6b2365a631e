# flock build, test and demo. Everything a fresh machine needs is installed
# by the targets themselves (as root).
GO      ?= go
BIN     := bin
CMDS    := flock flock-agent flockctl flock-installer
LDFLAGS := -s -w

.PHONY: build test unit demo vet fmt clean

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }
	$(GO) vet ./...

# Unit tests only: no root needed.
unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /e2e)

# The whole suite: unit tests, then the root-only integration tests in real
# network namespaces (they build the binaries themselves).
test: vet build
	$(GO) test -race -count=1 ./...

# Local demo lab on the embedded default config.
demo: build
	$(GO) run ./e2e/cmd/demo

clean:
	rm -rf $(BIN)
