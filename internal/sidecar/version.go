package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/polygate/polygate/internal/buildinfo"
)

// buildInfo names the running binary (stamped by make build and make
// release; see internal/buildinfo).
func buildInfo() buildinfo.Build { return buildinfo.Read() }

// buildInfoGauge is polygate_build_info, 1 with the build as labels.
func buildInfoGauge(b buildinfo.Build) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "polygate_build_info",
		Help:        "Always 1; the labels name the running binary's version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}
