// Package gate holds the per-source breaker and quota state machines and the
// Backend seam through which the memory and Redis backends store them.
//
// Times inside the state machines are whole milliseconds (Unix epoch), the
// resolution the Redis backend also works in, so that both backends take
// bit-identical decisions from the same inputs.
package gate
