// Package status serves the sidecar's status page for the person on call:
// per scope a headline (up, degraded or down, why, the calls waiting, the
// next probe), the last 15 minutes drawn on the server as SVG, every
// source's breaker with why it opened and its last upstream status, and the
// recent breaker transitions and overrides, as HTML that updates in place
// (/status) and as JSON (/status.json). Its Recorder observes decisions to
// keep what a scope's description lacks, in bounded memory.
package status
