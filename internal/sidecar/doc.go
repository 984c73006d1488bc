// Package sidecar is polygate's composition root: it parses flags and
// configuration, builds the backend, telemetry and metrics, wires them into
// a server.Server, opens the listeners, and handles reloads (SIGHUP) and
// graceful stops.
package sidecar
