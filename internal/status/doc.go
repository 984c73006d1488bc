// Package status serves the sidecar's status page: every scope's sources,
// breakers, quotas and waiting calls, and the recent breaker transitions, as
// server-rendered HTML (/status) and JSON (/status.json).
package status
