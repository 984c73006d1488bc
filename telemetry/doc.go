// Package telemetry records every call and every attempt in an embedded
// SQLite database (pure Go, no cgo), written in batches by one goroutine off
// the decision path, so that "how long did this call wait, and how many
// attempts did it make" has one answer.
package telemetry
