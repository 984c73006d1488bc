// Package bench is polygate's load generator: it drives the real sidecar
// binary (memory and Redis backends) and a bare grpc-go health server (the
// floor) with the same connections and concurrency, and reports throughput,
// CPU per operation of each process (from /proc and Redis INFO) and the
// ratios to the floor. cmd/polybench is its command; make bench runs it.
package bench
