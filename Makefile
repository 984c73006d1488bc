# polygate: `make test` installs what it needs (pinned Go tools, redis-server,
# the Python SDK's virtual environment) and runs every test; .ci/run calls it.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
BIN := $(CURDIR)/bin
GO_TOOLS := $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/grpcurl
BUF_AGAINST ?= .git\#branch=main

.PHONY: all run test ci generate check-generated lint gotest redis-server tools

all: test

## run: the sidecar with its embedded demo configuration
run:
	go run ./cmd/sidecar

## test: everything CI runs
test: tools redis-server check-generated lint gotest

ci: test

tools: $(BIN)/buf $(GO_TOOLS)

# Go tools at the versions pinned in tools/go.mod and tools/buf/go.mod.
$(BIN)/buf: tools/buf/go.mod
	cd tools/buf && go build -o $(BIN)/ github.com/bufbuild/buf/cmd/buf
$(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/grpcurl: tools/go.mod
	cd tools && go build -o $(BIN)/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc github.com/fullstorydev/grpcurl/cmd/grpcurl

## redis-server: the Debian package the Redis tests start on free ports
redis-server:
	@command -v redis-server >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@redis-server --version

## generate: regenerate gen/ from proto/
generate: tools
	$(BIN)/buf generate

## check-generated: fail when regenerating changes the committed code
check-generated: generate
	@git diff --exit-code --stat -- gen/ || { echo "generated code is stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- gen/)" || { git status --porcelain -- gen/; echo "untracked generated files: run make generate and commit"; exit 1; }

## lint: gofmt, go vet, buf lint and buf breaking against main
lint: tools
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'); echo "gofmt needed"; exit 1; }
	go vet ./...
	$(BIN)/buf lint
	@if git rev-parse --verify -q main >/dev/null; then $(BIN)/buf breaking --against '$(BUF_AGAINST)'; else echo "no main branch: buf breaking skipped"; fi

gotest:
	go test -race -count=1 ./...
