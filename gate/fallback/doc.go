// Package fallback carries out on_unavailable for a shared gate.Backend:
// while it cannot be reached, calls either fail closed or are served by a
// local memory backend with each replica's share of the limits.
package fallback
