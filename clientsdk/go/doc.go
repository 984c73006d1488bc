// Package polygate is the thin Go client of the polygate sidecar: it runs
// DESIGN's admission loop (Pick, the application's own attempt, RecordOutcome,
// OnNoRunnable) around a function that makes the upstream call, and
// classifies HTTP results into the sidecar's outcomes. Every retry, backoff,
// source-switching and waiting decision stays in the sidecar.
package polygate
