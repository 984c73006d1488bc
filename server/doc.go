// Package server exposes the policy engine as polygate.admission.v1's gRPC
// service: handlers, call sessions, the event hub behind WatchEvents, the
// interceptor chain, the one place that turns errors into gRPC statuses, and
// Run, which wires and starts the whole sidecar (metrics and telemetry included).
package server
