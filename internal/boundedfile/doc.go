// Package boundedfile reads the small files the sidecar and polygatectl are
// pointed at (a configuration, a token, a CA bundle) without reading a file
// that is too large whole.
package boundedfile
