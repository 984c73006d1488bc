# syntax=docker/dockerfile:1
# polygate sidecar: a static binary on a distroless base, running as non-root.
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) -t polygate:dev .
#   docker run --rm -v $PWD/polygate.yaml:/etc/polygate/polygate.yaml:ro -p 50051:50051 \
#     polygate:dev --config /etc/polygate/polygate.yaml
# The telemetry driver is pure Go (modernc.org/sqlite), so CGO stays off.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
# Modules of the repository the main module requires by path (replace ./...).
COPY gen/go.mod gen/go.sum gen/
COPY clientsdk/go/go.mod clientsdk/go/go.sum clientsdk/go/
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# .git is not in the build context: give the stamps as build arguments,
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) -t polygate:dev .
# for --version and polygate_build_info. make build compiles exactly as make
# release does (-trimpath, CGO off, the stamps in -ldflags).
ARG VERSION=""
ARG REVISION=""
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    make build DIST=/out VERSION="${VERSION}" REVISION="${REVISION}" \
 && mkdir -p /out/var/lib/polygate /out/run/polygate

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/polygate /usr/local/bin/polygate
# The operator CLI, for kubectl exec POD -c polygate -- polygatectl describe SCOPE
# (it dials 127.0.0.1:50051 with the sidecar's POLYGATE_AUTH__OPERATOR_TOKEN, else
# its POLYGATE_AUTH__TOKEN).
COPY --from=build /out/polygatectl /usr/local/bin/polygatectl
# Writable places for the telemetry database and a unix socket; in Kubernetes
# mount volumes there (the root filesystem can then be read-only).
COPY --from=build --chown=65532:65532 /out/var/lib/polygate /var/lib/polygate
COPY --from=build --chown=65532:65532 /out/run/polygate /run/polygate
USER 65532:65532
# Nothing is baked in as environment or flags: both override the YAML file.
# Say listen: 0.0.0.0:50051 in the configuration (127.0.0.1 is the
# container's own loopback; in a pod it is shared with the application, but
# kubelet's probes dial the pod IP), or run
#   docker run --rm -e POLYGATE_LISTEN=0.0.0.0:50051 -p 50051:50051 polygate:dev
# and set auth.token (POLYGATE_AUTH__TOKEN) whenever the port is reachable by
# anything but your application.
# Only the gRPC port is exposed: metrics are off unless metrics_listen is set
# (nothing here sets it), and exposing a port nobody listens on would promise
# what the image does not do. To scrape it, set the port and publish it:
#   docker run --rm -e POLYGATE_LISTEN=0.0.0.0:50051 -e POLYGATE_METRICS_LISTEN=0.0.0.0:9090 \
#     -p 50051:50051 -p 9090:9090 polygate:dev
# (the Kubernetes example sets metrics_listen in its ConfigMap and declares
# the port on the container).
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/polygate"]
