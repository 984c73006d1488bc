package sidecar

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/polygate/polygate/config"
)

// configMetrics say how the last configuration load went, under the names
// Prometheus and Alertmanager use for their own reloads, and the limit on
// live calls the configuration sets. The start counts as the first
// successful load.
type configMetrics struct {
	successful prometheus.Gauge // polygate_config_last_reload_successful
	at         prometheus.Gauge // polygate_config_last_reload_success_timestamp_seconds
	liveLimit  prometheus.Gauge // polygate_live_calls_limit
}

func newConfigMetrics(cfg *config.Config, now time.Time) *configMetrics {
	m := &configMetrics{
		successful: prometheus.NewGauge(prometheus.GaugeOpts{Name: "polygate_config_last_reload_successful",
			Help: "1 when the last configuration reload (SIGHUP or a change of the file) was applied, 0 when it was rejected and the running configuration stayed."}),
		at: prometheus.NewGauge(prometheus.GaugeOpts{Name: "polygate_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last configuration load that was applied (the start, or a reload)."}),
		liveLimit: prometheus.NewGauge(prometheus.GaugeOpts{Name: "polygate_live_calls_limit",
			Help: "calls.max_live: calls open at once, over every scope; a Pick that would open one more gets RESOURCE_EXHAUSTED."}),
	}
	m.applied(cfg, now)
	return m
}

func (m *configMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.successful, m.at, m.liveLimit}
}

// applied records a configuration load that took effect at now.
func (m *configMetrics) applied(cfg *config.Config, now time.Time) {
	m.successful.Set(1)
	m.at.Set(float64(now.UnixNano()) / 1e9)
	m.liveLimit.Set(float64(cfg.Calls.MaxLive))
}

// rejected records a reload that changed nothing.
func (m *configMetrics) rejected() { m.successful.Set(0) }
