// Package polygate is the thin Go client of the polygate sidecar: Do runs the
// admission loop (Pick, the application's own attempt, RecordOutcome,
// OnNoRunnable) around a function that makes the upstream call, Transport
// runs it around every request of an http.Client, and Classify maps HTTP
// results to the sidecar's outcomes. Every retry, backoff, source-switching
// and waiting decision stays in the sidecar.
//
// Each call is an OpenTelemetry span with a child span per attempt (see
// WithTracerProvider), and every RPC carries the trace context to the
// sidecar.
package polygate
