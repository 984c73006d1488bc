// Package server exposes the policy engine as polygate.admission.v1's gRPC
// service: handlers, call sessions, the interceptor chain, the one place that
// turns errors into gRPC statuses, and Run, which starts the whole sidecar.
package server
