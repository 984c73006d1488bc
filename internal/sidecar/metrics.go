package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/polygate/polygate/internal/status"
	"github.com/polygate/polygate/metrics"
	"github.com/polygate/polygate/server"
)

// serveMetrics opens metrics_listen (or serves on lis, when set) and serves
// reg's /metrics and the status page (/status, /status.json) on it until
// stop; a failure to serve is reported on sc.served.
func (sc *sidecar) serveMetrics(addr string, lis net.Listener, reg *prometheus.Registry, page *status.Page) error {
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("metrics_listen %s: %w", addr, err)
		}
	}
	sc.metricsLis = lis
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, ErrorLog: slog.NewLogLogger(sc.log.Handler(), slog.LevelError)}))
	page.Register(mux)
	sc.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := sc.metrics.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			sc.served <- fmt.Errorf("serving metrics on %s: %w", addr, err)
		}
	}()
	return nil
}

// scopeStates reads every scope's live state for the metrics collector,
// with the calls of each that rec sees waiting.
func scopeStates(srv *server.Server, rec *status.Recorder) metrics.ReadStates {
	return func(ctx context.Context) []metrics.ScopeState {
		var out []metrics.ScopeState
		for _, name := range srv.Scopes() {
			sc, err := srv.Scope(name)
			if err != nil {
				continue // removed by a reload meanwhile
			}
			d, err := sc.Describe(ctx)
			out = append(out, metrics.ScopeState{Name: name, Description: d, LiveCalls: srv.LiveCalls(name), TenantLiveCalls: srv.TenantLiveCalls(name, d), Waiting: rec.WaitingIn(name), Err: err})
		}
		return out
	}
}

// eventMetrics export the event hub's counters, read at scrape time.
func eventMetrics(srv *server.Server) []prometheus.Collector {
	counter := func(name, help string, read func(server.EventCounts) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(read(srv.EventCounts())) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "polygate_event_watchers", Help: "WatchEvents streams connected now."},
			func() float64 { return float64(srv.EventCounts().Watchers) }),
		counter("polygate_events_published_total", "Events published while at least one watcher was connected.",
			func(n server.EventCounts) uint64 { return n.Published }),
		counter("polygate_events_dropped_total", "Events lost by watchers whose buffer was full, summed over watchers, and events the fan-out queue refused.",
			func(n server.EventCounts) uint64 { return n.Dropped }),
		counter("polygate_event_watchers_refused_total", "WatchEvents streams refused because events.max_watchers were open.",
			func(n server.EventCounts) uint64 { return n.Refused }),
		counter("polygate_undecodable_requests_total", "Admission requests that did not decode (invalid UTF-8, malformed bytes), answered INVALID_ARGUMENT.",
			func(n server.EventCounts) uint64 { return n.Undecodable }),
	}
}
