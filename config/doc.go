// Package config loads the sidecar's configuration (YAML file, POLYGATE_
// environment variables, flags; koanf is used only here), turns it into
// typed, validated values with every default and derived value filled in,
// and prints those back as the file that gives them (--check).
package config
