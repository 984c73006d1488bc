package sidecar

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version and revision override what the build recorded; a release build
// sets them with
//
//	go build -ldflags "-X github.com/polygate/polygate/internal/sidecar.version=v1.2.3 -X github.com/polygate/polygate/internal/sidecar.revision=$(git rev-parse HEAD)"
//
// Left empty, they come from runtime/debug.ReadBuildInfo: the main module's
// version ("(devel)" for a build from a checkout) and the vcs.revision the go
// command stamps when it builds inside a git work tree (with "-dirty" when
// vcs.modified says the tree had changes).
var version, revision string

// Build names the binary: its version, VCS revision and Go version.
type Build struct {
	Version, Revision, GoVersion string
}

// buildInfo reads what the build recorded, with the -ldflags overrides.
func buildInfo() Build {
	b := Build{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if v := info.Main.Version; v != "" {
			b.Version = v
		}
		var dirty bool
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && b.Revision != "unknown" {
			b.Revision += "-dirty"
		}
	}
	if version != "" {
		b.Version = version
	}
	if revision != "" {
		b.Revision = revision
	}
	return b
}

// String is the line --version prints.
func (b Build) String() string {
	return "polygate " + b.Version + " revision " + b.Revision + " " + b.GoVersion
}

// buildInfoGauge is polygate_build_info, 1 with the build as labels.
func buildInfoGauge(b Build) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "polygate_build_info",
		Help:        "Always 1; the labels name the running binary's version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}
