// Package e2e holds the end-to-end tests: they build the real sidecar binary,
// start it with configurations written by each test, and run the Go SDK (and,
// from e2e/python, the Python SDK) against the fake provider of e2e/upstream.
package e2e
