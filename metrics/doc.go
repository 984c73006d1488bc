// Package metrics exports what polygate decides to Prometheus: an observer of
// the policy engine that counts decisions, refusals, attempts, waits, probes
// and breaker transitions, and a collector that reads each scope's live
// breaker, quota and pacer state at scrape time; and the gRPC server's RPC
// metrics, under go-grpc-middleware's names.
package metrics
