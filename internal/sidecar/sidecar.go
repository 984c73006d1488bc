package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/status"
	"github.com/polygate/polygate/metrics"
	"github.com/polygate/polygate/policy"
	"github.com/polygate/polygate/server"
	"github.com/polygate/polygate/telemetry"
)

// stopGrace bounds a graceful stop; RPCs still running after it are cut.
const stopGrace = 10 * time.Second

// sidecar is a started sidecar: the gRPC server with health and reflection,
// the metrics listener, the event hub and the telemetry sink.
type sidecar struct {
	log        *slog.Logger
	srv        *server.Server
	gs         *grpc.Server
	health     *health.Server
	sink       *telemetry.Sink // nil when telemetry is off
	lis        net.Listener
	metrics    *http.Server // nil when metrics_listen is empty
	metricsLis net.Listener
	// config says how the last configuration load went (exported with
	// metrics_listen).
	config *configMetrics
	// served reports the first listener that fails.
	served   chan error
	stopOnce sync.Once
}

// sidecarDeps are what startSidecar takes besides the configuration; tests
// replace the backend and the gRPC listener and add interceptors. The clock
// is time.Now throughout (tests that step it run in testing/synctest bubbles).
type sidecarDeps struct {
	backend      gate.Backend
	backendName  func() string
	lis          net.Listener        // nil: listen on cfg.Listen
	metricsLis   net.Listener        // nil: listen on cfg.MetricsListen (when set)
	health       *health.Server      // nil: a new one
	interceptors server.Interceptors // extra, outermost
	watchBuffer  int
	// stateLoss, for a backend that can lose a scope's state (Redis), is
	// what it saw of that, for DescribeScope (nil: none).
	stateLoss func(scope string) gate.StateLoss
	// created is told the server as soon as it exists, before anything
	// listens (a scrape reads the backend, which may report its health).
	created func(*server.Server)
	// tokens are the bearer tokens of the moment (nil: cfg.Auth's, fixed).
	tokens *server.Tokens
	// collectors are the backend's own metrics.
	collectors []prometheus.Collector
	// tracer, when set, traces the admission RPCs (nil: no tracing).
	tracer trace.TracerProvider
}

// startSidecar wires the sidecar and starts serving: telemetry (when
// telemetry.path is set), the metrics registry, observer and listener (when
// metrics_listen is set), the admission service with health and reflection.
func startSidecar(cfg *config.Config, log *slog.Logger, d sidecarDeps) (_ *sidecar, err error) {
	if d.watchBuffer == 0 {
		d.watchBuffer = cfg.Events.WatchBuffer
	}
	sc := &sidecar{log: log, served: make(chan error, 2), config: newConfigMetrics(cfg, time.Now())}
	defer func() {
		if err != nil {
			sc.stop()
		}
	}()
	var observers []policy.Observer
	if cfg.Telemetry.Path != "" {
		sc.sink, err = telemetry.Open(telemetry.Options{
			Path: cfg.Telemetry.Path, Retention: cfg.Telemetry.Retention, QueueSize: cfg.Telemetry.QueueSize, Log: log, Now: time.Now,
		})
		if err != nil {
			return nil, fmt.Errorf("telemetry.path: %w", err)
		}
		observers = append(observers, sc.sink)
	}
	reg := prometheus.NewRegistry()
	extra := d.interceptors
	var recorder *status.Recorder
	var rpc *metrics.RPC // the RPC metrics, when metrics_listen is set
	if cfg.MetricsListen != "" {
		recorder = status.NewRecorder(time.Now)
		observers = append(observers, metrics.New(reg, time.Now), recorder)
		rpc = metrics.NewRPC(metrics.AttemptBuckets)
		reg.MustRegister(rpc, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		if sc.sink != nil {
			reg.MustRegister(sc.sink)
		}
		extra.RPC = rpc // counted within the chain's own interceptor
		extra.Stream = append([]grpc.StreamServerInterceptor{rpc.Stream}, extra.Stream...)
	}
	var tr *tracing
	if d.tracer != nil {
		tr = newTracing(d.tracer)
		observers = append(observers, tr)
		extra.Unary = append(extra.Unary, tr.unary)
	}
	sc.srv = server.New(cfg, d.backend, log, server.Options{BackendName: d.backendName, StateLoss: d.stateLoss, Observers: observers, WatchBuffer: d.watchBuffer})
	if d.created != nil {
		d.created(sc.srv)
	}
	if cfg.MetricsListen != "" {
		reg.MustRegister(eventMetrics(sc.srv)...)
		reg.MustRegister(metrics.NewStateCollector(scopeStates(sc.srv, recorder), 10*time.Second), buildInfoGauge(buildInfo()))
		reg.MustRegister(sc.config.collectors()...)
		reg.MustRegister(d.collectors...)
	}
	if d.tokens == nil {
		d.tokens = server.NewTokens(cfg.Auth)
	}
	transport, err := server.TransportOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	opts := append(server.ServerOptions(log, d.tokens, extra), transport...)
	if tr != nil {
		opts = append(opts, grpc.StatsHandler(tr.statsHandler()))
	}
	sc.gs = grpc.NewServer(opts...)
	admissionv1.RegisterAdmissionServiceServer(sc.gs, sc.srv)
	sc.health = d.health
	if sc.health == nil {
		sc.health = health.NewServer()
	}
	// The initial status, before anything listens: a report of the backend
	// (from the first scrape or RPC) then always comes after it.
	backendHealth(sc.health, cfg, false)
	healthpb.RegisterHealthServer(sc.gs, sc.health)
	reflection.Register(sc.gs)
	if rpc != nil {
		rpc.Initialize(sc.gs) // every service registered, none served yet
	}

	if cfg.MetricsListen != "" {
		if err := sc.serveMetrics(cfg.MetricsListen, d.metricsLis, reg, status.New(sc.srv, recorder, time.Now, log)); err != nil {
			return nil, err
		}
	}
	sc.lis = d.lis
	if sc.lis == nil {
		if sc.lis, err = listen(cfg.Listen, cfg.ListenMode); err != nil {
			return nil, err
		}
	}
	go func() {
		if err := sc.gs.Serve(sc.lis); err != nil {
			sc.served <- fmt.Errorf("serving %s: %w", cfg.Listen, err)
		}
	}()
	return sc, nil
}

// stop flips health to NOT_SERVING, answers waiting callers and ends watch
// streams, drains in-flight RPCs (cutting them after stopGrace), records the
// calls still open as interrupted, then closes telemetry (writing what is
// queued) and the metrics listener.
func (sc *sidecar) stop() {
	sc.stopOnce.Do(func() {
		if sc.health != nil {
			sc.health.Shutdown()
		}
		if sc.srv != nil {
			sc.srv.Close()
		}
		if sc.gs != nil {
			stopped := make(chan struct{})
			go func() { sc.gs.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(stopGrace):
				sc.gs.Stop()
				<-stopped
			}
		}
		if sc.srv != nil {
			sc.srv.Interrupt()
		}
		if sc.sink != nil {
			if err := sc.sink.Close(); err != nil {
				sc.log.Warn("telemetry: closing the database failed", "err", err)
			}
		}
		if sc.metrics != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = sc.metrics.Shutdown(ctx)
			cancel()
		}
	})
}
