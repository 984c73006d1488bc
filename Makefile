# polygate: `make test` installs what it needs (pinned Go tools, redis-server, chromium,
# the Python SDK's virtual environments, the TypeScript SDK's node_modules) and runs
# every test, the SDK conformance kit's runs in each language included; .ci/run calls it.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
BIN := $(CURDIR)/bin
GO_TOOLS := $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/grpcurl
BUF_AGAINST ?= .git\#branch=main
# The Python SDK: a virtual environment under the repo with pinned tools and
# test dependencies, and the stubs generated into the package.
PYTHON ?= python3
VENV := $(CURDIR)/.venv
VENV2 := $(CURDIR)/.venv-openai2
PY := $(VENV)/bin/python
PYSDK := clientsdk/python
PYGEN := $(PYSDK)/src/polygate/_gen
# The TypeScript SDK: its pinned packages installed by npm ci from the
# committed lockfile, and the stubs buf generates into the package.
TSSDK := clientsdk/typescript
TSGEN := $(TSSDK)/src/gen

.PHONY: all run build release version test ci generate check-generated lint pytypes gotest fuzz pytest redis-server chromium tools grpcurl venv bench tsdeps ts

all: test

## run: the sidecar with its embedded demo configuration
run:
	go run ./cmd/sidecar

# Builds stamp the version and revision into internal/buildinfo with -ldflags,
# from git unless given (make release VERSION=v1.2.3 REVISION=...), so that
# --version and polygate_build_info name them whatever -buildvcs says.
# CGO stays off: the telemetry driver (modernc.org/sqlite) is pure Go, so the
# binaries are static and cross-compile to every platform.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
DIST ?= $(CURDIR)/dist
PLATFORMS ?= linux/amd64 linux/arm64
STAMP := github.com/polygate/polygate/internal/buildinfo
GOBUILD = CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags '-s -w -X $(STAMP).version=$(VERSION) -X $(STAMP).revision=$(REVISION)'
# A stamp goes into -ldflags and into file names: letters, digits, . _ + - only.
CHECK_STAMPS = @for v in '$(VERSION)' '$(REVISION)'; do \
	[[ "$$v" =~ ^[A-Za-z0-9._+-]*$$ ]] || { echo "VERSION and REVISION take letters, digits, . _ + -; got '$$v'"; exit 1; }; done

## version: the version and revision builds stamp
version:
	@echo "$(VERSION) $(REVISION)"

## build: polygate (the sidecar) and polygatectl for this machine (GOOS/GOARCH
## to choose another), stamped, into $(DIST)
build:
	$(CHECK_STAMPS)
	mkdir -p $(DIST)
	$(GOBUILD) -o $(DIST)/polygate ./cmd/sidecar
	$(GOBUILD) -o $(DIST)/polygatectl ./cmd/polygatectl

## release: both binaries for each of PLATFORMS, stamped, with LICENSE and
## README.md, as dist/polygate_VERSION_OS_ARCH/ and .tar.gz, and SHA256SUMS
release:
	$(CHECK_STAMPS)
	@test -n '$(VERSION)' || { echo "release: no VERSION (not a git work tree? give VERSION=... REVISION=...)"; exit 1; }
	mkdir -p $(DIST)
	rm -f $(DIST)/SHA256SUMS
	@for p in $(PLATFORMS); do \
		os=$${p%/*} arch=$${p#*/} name=polygate_$(VERSION)_$${p%/*}_$${p#*/}; \
		echo "release $$name"; \
		rm -rf "$(DIST)/$$name" "$(DIST)/$$name.tar.gz" && mkdir -p "$(DIST)/$$name" && \
		GOOS=$$os GOARCH=$$arch $(GOBUILD) -o "$(DIST)/$$name/polygate" ./cmd/sidecar && \
		GOOS=$$os GOARCH=$$arch $(GOBUILD) -o "$(DIST)/$$name/polygatectl" ./cmd/polygatectl && \
		cp LICENSE README.md "$(DIST)/$$name/" && \
		tar --sort=name --mtime=@$(SOURCE_DATE_EPOCH) --owner=0 --group=0 --numeric-owner -C $(DIST) -cf - "$$name" \
			| gzip -n > "$(DIST)/$$name.tar.gz" || exit 1; \
	done
	cd $(DIST) && sha256sum polygate_$(VERSION)_*.tar.gz > SHA256SUMS
	@cat $(DIST)/SHA256SUMS

## bench: what a decision costs (docs/performance.md): the real sidecar on the
## memory and Redis backends against a bare grpc-go health server, ratios to it,
## and envoy's ratelimit service (the peer) against the same redis-server.
## Not part of test. BENCH_FLAGS passes flags to polybench (e.g. -cell 5s).
BENCH_FLAGS ?=
bench: redis-server $(BIN)/ratelimit
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	go build -o "$$d/sidecar" ./cmd/sidecar && go build -o "$$d/polybench" ./cmd/polybench && \
	"$$d/polybench" -sidecar "$$d/sidecar" -ratelimit $(BIN)/ratelimit $(BENCH_FLAGS)

## test: everything CI runs
test: tools redis-server chromium check-generated lint pytypes gotest fuzz pytest ts

ci: test

tools: $(BIN)/buf $(GO_TOOLS) $(BIN)/ratelimit $(BIN)/staticcheck

## grpcurl: only grpcurl, at the version pinned in tools/go.mod, into bin/
## (make tools also builds buf, staticcheck and the benchmark's peer)
grpcurl: $(BIN)/grpcurl

# Go tools at the versions pinned in tools/go.mod, tools/buf/go.mod,
# tools/staticcheck/go.mod and tools/ratelimit/go.mod (envoy's ratelimit
# service: the peer make bench measures, and internal/bench's tests start).
# One go build per tool, so that make grpcurl builds grpcurl alone.
$(BIN)/ratelimit: tools/ratelimit/go.mod
	cd tools/ratelimit && go build -o $(BIN)/ratelimit github.com/envoyproxy/ratelimit/src/service_cmd
$(BIN)/staticcheck: tools/staticcheck/go.mod
	cd tools/staticcheck && go build -o $(BIN)/ honnef.co/go/tools/cmd/staticcheck
$(BIN)/buf: tools/buf/go.mod
	cd tools/buf && go build -o $(BIN)/ github.com/bufbuild/buf/cmd/buf
$(BIN)/protoc-gen-go: tools/go.mod
	cd tools && go build -o $(BIN)/ google.golang.org/protobuf/cmd/protoc-gen-go
$(BIN)/protoc-gen-go-grpc: tools/go.mod
	cd tools && go build -o $(BIN)/ google.golang.org/grpc/cmd/protoc-gen-go-grpc
$(BIN)/grpcurl: tools/go.mod
	cd tools && go build -o $(BIN)/ github.com/fullstorydev/grpcurl/cmd/grpcurl

## redis-server: the Debian package the Redis tests start on free ports
redis-server:
	@command -v redis-server >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@redis-server --version

## chromium: the Debian package the status page's end-to-end test opens the page in
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@chromium --version

## venv: the Python test environments, from pinned requirements: .venv (the
## SDK's tools and tests, openai 3 on httpx2, httpx beside it) and
## .venv-openai2 (openai 2 on httpx: one distribution cannot be at two
## versions in one environment)
venv: $(VENV)/.installed $(VENV2)/.installed
$(VENV)/.installed: $(PYSDK)/requirements-dev.txt e2e/python/requirements-openai3.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r e2e/python/requirements-openai3.txt
	touch $@
$(VENV2)/.installed: $(PYSDK)/requirements-dev.txt e2e/python/requirements-openai2.txt
	$(PYTHON) -m venv $(VENV2)
	$(VENV2)/bin/python -m pip install -q --disable-pip-version-check -r e2e/python/requirements-openai2.txt
	touch $@

## tsdeps: the TypeScript SDK's node_modules, exactly as package-lock.json pins them
tsdeps: $(TSSDK)/node_modules/.installed
$(TSSDK)/node_modules/.installed: $(TSSDK)/package.json $(TSSDK)/package-lock.json
	cd $(TSSDK) && npm ci --no-audit --no-fund
	touch $@

## generate: regenerate gen/ (Go, buf), the Python SDK's stubs (grpcio-tools)
## and the TypeScript SDK's (buf with protoc-gen-es from its node_modules) from proto/
# Mapping proto/ to polygate/_gen (-Ipolygate/_gen=proto) makes the Python
# stubs import each other as polygate._gen.polygate.admission.v1, with no
# hand-edited imports.
generate: tools venv tsdeps
	rm -rf gen/polygate # not buf's clean, which would delete gen/go.mod
	$(BIN)/buf generate
	$(BIN)/buf generate --template $(TSSDK)/buf.gen.yaml
	touch gen # the directory's time says when it was last generated
	rm -rf $(PYGEN)
	mkdir -p $(PYGEN)
	cd $(PYSDK)/src && $(PY) -m grpc_tools.protoc -Ipolygate/_gen=$(CURDIR)/proto \
		--python_out=. --pyi_out=. --grpc_python_out=. polygate/_gen/polygate/admission/v1/admission.proto
	for d in $(PYGEN) $(PYGEN)/polygate $(PYGEN)/polygate/admission $(PYGEN)/polygate/admission/v1; do \
		echo '# Code generated by make generate. DO NOT EDIT.' > $$d/__init__.py; done

## check-generated: fail when regenerating changes the committed code
check-generated: generate
	@git diff --exit-code --stat -- gen/ $(PYGEN) $(TSGEN) || { echo "generated code is stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- gen/ $(PYGEN) $(TSGEN))" || { git status --porcelain -- gen/ $(PYGEN) $(TSGEN); echo "untracked generated files: run make generate and commit"; exit 1; }

## lint: gofmt, go vet, staticcheck (every package but gen/, a module of its
## own), buf lint and buf breaking against main
lint: tools
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'); echo "gofmt needed"; exit 1; }
	go vet ./...
	$(BIN)/staticcheck ./...
	$(BIN)/buf lint
	@if git rev-parse --verify -q main >/dev/null; then $(BIN)/buf breaking --against '$(BUF_AGAINST)'; else echo "no main branch: buf breaking skipped"; fi

## pytypes: mypy --strict on the Python SDK's hand-written code (the generated stubs are excluded)
pytypes: venv
	cd $(PYSDK) && $(PY) -m mypy --config-file pyproject.toml src/polygate

# The Go SDK (clientsdk/go) is a module of its own, which ./... leaves out.
gotest:
	POLYBENCH_RATELIMIT=$(BIN)/ratelimit go test -race -count=1 ./...
	cd clientsdk/go && go vet ./... && go test -race -count=1 ./...

## fuzz: each fuzz target for FUZZTIME (seed corpora under testdata/fuzz run in gotest too)
# FUZZTIME is a count of runs, not a duration: Go 1.26's fuzz coordinator can fail a target with a bare
# "context deadline exceeded" when a duration ends while a worker is busy on a loaded machine
# (golang/go#75804, fixed in Go 1.27), which failed CI once with nothing found; a count has no deadline.
# One directory:Target per line (the directory's own module runs it); add yours on a line of its own.
FUZZ_TARGETS += config:FuzzParse
FUZZ_TARGETS += server:FuzzValidate
FUZZ_TARGETS += gate/redisgate:FuzzReplyParser
FUZZ_TARGETS += clientsdk/go:FuzzClassify
FUZZ_TARGETS += clientsdk/go:FuzzRetryAfter
FUZZTIME ?= 20000x
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $$t for $(FUZZTIME)"; \
		go -C "$${t%%:*}" test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) . || exit 1; \
	done

## ts: the TypeScript SDK: npm ci, tsc --strict on the package and its
## examples, then its unit tests, the conformance kit (clientsdk/conformance)
## and the end-to-end tests with openai-node against the real sidecar, with
## the Go programs they start built once here.
ts: tsdeps
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	go build -o "$$d/" ./cmd/sidecar ./e2e/cmd/fakeupstream ./clientsdk/conformance/fakesidecar && \
	cd $(TSSDK) && npm run typecheck && \
	POLYGATE_SIDECAR_BIN="$$d/sidecar" POLYGATE_FAKEUPSTREAM_BIN="$$d/fakeupstream" POLYGATE_FAKESIDECAR_BIN="$$d/fakesidecar" npm test

## pytest: install the Python SDK into both environments; run its tests (the
## conformance kit's among them) and the Python e2e tests with openai 3
## (.venv), then the e2e tests with openai 2 (.venv-openai2)
PYTEST_ARGS := -c $(PYSDK)/pyproject.toml --rootdir $(CURDIR) -p no:cacheprovider
# (An environment made before the distribution was named polygate-sdk holds
# it as polygate too: that one is removed first.)
pytest: venv
	$(PY) -m pip uninstall -q -y --disable-pip-version-check polygate
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation ./$(PYSDK)
	$(VENV2)/bin/python -m pip uninstall -q -y --disable-pip-version-check polygate
	$(VENV2)/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation ./$(PYSDK)
	$(PY) -m pytest $(PYTEST_ARGS) $(PYSDK)/tests e2e/python
	$(VENV2)/bin/python -m pytest $(PYTEST_ARGS) e2e/python
