// Package server exposes the policy engine as polygate.admission.v1's gRPC
// service: handlers, call sessions, the event hub behind WatchEvents, the
// interceptor chain and the one place that turns errors into gRPC statuses.
// It depends on a gate.Backend only; internal/sidecar builds the backend,
// listeners, metrics and telemetry around it.
package server
