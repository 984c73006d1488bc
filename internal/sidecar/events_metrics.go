package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/polygate/polygate/server"
)

var (
	watchersDesc  = prometheus.NewDesc("polygate_event_watchers", "WatchEvents streams connected now.", nil, nil)
	publishedDesc = prometheus.NewDesc("polygate_events_published_total", "Events published while at least one watcher was connected.", nil, nil)
	droppedDesc   = prometheus.NewDesc("polygate_events_dropped_total", "Events lost by watchers whose buffer was full, summed over watchers.", nil, nil)
)

// eventsCollector exports the event hub's watchers and dropped events.
type eventsCollector struct{ srv *server.Server }

// Describe implements prometheus.Collector.
func (eventsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- watchersDesc
	ch <- publishedDesc
	ch <- droppedDesc
}

// Collect implements prometheus.Collector.
func (c eventsCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.srv.EventCounts()
	ch <- prometheus.MustNewConstMetric(watchersDesc, prometheus.GaugeValue, float64(n.Watchers))
	ch <- prometheus.MustNewConstMetric(publishedDesc, prometheus.CounterValue, float64(n.Published))
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(n.Dropped))
}
