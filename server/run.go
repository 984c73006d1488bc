package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/metrics"
	"github.com/polygate/polygate/policy"
	"github.com/polygate/polygate/telemetry"
)

// stopGrace bounds a graceful stop; RPCs still running after it are cut.
const stopGrace = 10 * time.Second

// Run starts the sidecar with the command line args and the environment
// environ, and serves until ctx ends or a listener fails. It announces
// "polygate listening on ADDRESS" on stdout once it accepts calls; logs go to
// stderr. SIGHUP reloads the configuration file.
func Run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	opts, err := config.ParseFlags(args, environ, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	cfg, err := config.Load(opts, environ)
	if err != nil {
		return err
	}
	if opts.Check {
		return printConfig(stdout, cfg)
	}
	level := new(slog.LevelVar)
	log := newLogger(cfg.Log, level, stderr)
	tokens := NewTokens(cfg.Auth)

	// The backend reports its health from the moment it opens; the server
	// that publishes and counts the reports exists only afterwards.
	hs := health.NewServer()
	var started atomic.Pointer[Server]
	b, err := openBackend(cfg, log, func(degraded bool, cause error) {
		backendHealth(hs, cfg, degraded)
		if srv := started.Load(); srv != nil {
			srv.BackendChanged(backendChange(cfg, degraded, cause))
		}
	})
	if err != nil {
		return err
	}
	defer b.close()
	sc, err := startSidecar(cfg, log, sidecarDeps{backend: b, backendName: b.describe, health: hs, created: started.Store, tokens: tokens})
	if err != nil {
		return err
	}
	if b.check != nil {
		// Health says NOT_SERVING from the start when the backend is down.
		cctx, cancel := context.WithTimeout(ctx, cfg.Backend.Redis.Timeout)
		if err := b.check(cctx); err != nil {
			log.Warn("backend not reachable at start; following on_unavailable until it answers", "on_unavailable", cfg.Backend.Redis.OnUnavailable, "err", err)
		}
		cancel()
	}
	subCtx, stopSub := context.WithCancel(context.Background())
	defer stopSub()
	go announcements(subCtx, b, sc.srv, log)
	log.Info("polygate started", "listen", cfg.Listen, "backend", b.describe(), "scopes", sc.srv.Scopes(),
		"config", configName(opts), "metrics_listen", cfg.MetricsListen, "telemetry", cfg.Telemetry.Path)
	fmt.Fprintf(stdout, "polygate listening on %s\n", address(sc.lis))
	if sc.metricsLis != nil {
		fmt.Fprintf(stdout, "polygate metrics on http://%s/metrics\n", sc.metricsLis.Addr())
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	sweep := time.NewTicker(time.Second)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("polygate stopping: health NOT_SERVING, waits answered, in-flight RPCs drained")
			sc.stop()
			return nil
		case err := <-sc.served:
			sc.stop()
			return err
		case <-hup:
			if next := reload(log, sc.srv, cfg, opts, environ); next != nil {
				tokens.Set(next.Auth)
				_ = level.UnmarshalText([]byte(next.Log.Level))
			}
		case <-sweep.C:
			sc.srv.sweep()
		}
	}
}

// sidecar is a started sidecar: the gRPC server with health and reflection,
// the metrics listener, the event hub and the telemetry sink.
type sidecar struct {
	log        *slog.Logger
	srv        *Server
	gs         *grpc.Server
	health     *health.Server
	sink       *telemetry.Sink // nil when telemetry is off
	lis        net.Listener
	metrics    *http.Server // nil when metrics_listen is empty
	metricsLis net.Listener
	// served reports the first listener that fails.
	served   chan error
	stopOnce sync.Once
}

// sidecarDeps are what startSidecar takes besides the configuration; tests
// replace the clock, the backend, the gRPC listener and add interceptors.
type sidecarDeps struct {
	now          func() time.Time
	backend      gate.Backend
	backendName  func() string
	lis          net.Listener   // nil: listen on cfg.Listen
	health       *health.Server // nil: a new one
	interceptors Interceptors   // extra, outermost
	watchBuffer  int
	// created is told the server as soon as it exists, before anything
	// listens (a scrape reads the backend, which may report its health).
	created func(*Server)
	// tokens are the bearer tokens of the moment (nil: cfg.Auth's, fixed).
	tokens *Tokens
}

// startSidecar wires the sidecar and starts serving: telemetry (when
// telemetry.path is set), the metrics registry, observer and listener (when
// metrics_listen is set), the admission service with health and reflection.
func startSidecar(cfg *config.Config, log *slog.Logger, d sidecarDeps) (_ *sidecar, err error) {
	if d.now == nil {
		d.now = time.Now
	}
	if d.watchBuffer == 0 {
		d.watchBuffer = cfg.Events.WatchBuffer
	}
	sc := &sidecar{log: log, served: make(chan error, 2)}
	defer func() {
		if err != nil {
			sc.stop()
		}
	}()
	var observers []policy.Observer
	if cfg.Telemetry.Path != "" {
		sc.sink, err = telemetry.Open(telemetry.Options{
			Path: cfg.Telemetry.Path, Retention: cfg.Telemetry.Retention, QueueSize: cfg.Telemetry.QueueSize, Log: log, Now: d.now,
		})
		if err != nil {
			return nil, fmt.Errorf("telemetry.path: %w", err)
		}
		observers = append(observers, sc.sink)
	}
	reg := prometheus.NewRegistry()
	extra := d.interceptors
	if cfg.MetricsListen != "" {
		observers = append(observers, metrics.New(reg, d.now))
		rpc := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(metrics.AttemptBuckets)))
		reg.MustRegister(rpc, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		if sc.sink != nil {
			reg.MustRegister(sc.sink)
		}
		extra.Unary = append([]grpc.UnaryServerInterceptor{rpc.UnaryServerInterceptor()}, extra.Unary...)
		extra.Stream = append([]grpc.StreamServerInterceptor{rpc.StreamServerInterceptor()}, extra.Stream...)
		defer func() {
			if err == nil {
				rpc.InitializeMetrics(sc.gs)
			}
		}()
	}
	sc.srv = New(cfg, d.backend, log, Options{Now: d.now, BackendName: d.backendName, Observers: observers, WatchBuffer: d.watchBuffer})
	if d.created != nil {
		d.created(sc.srv)
	}
	if cfg.MetricsListen != "" {
		reg.MustRegister(sc.srv.Collector(), metrics.NewStateCollector(sc.srv.scopeStates, 10*time.Second))
	}
	if d.tokens == nil {
		d.tokens = NewTokens(cfg.Auth)
	}
	transport, err := TransportOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	sc.gs = grpc.NewServer(append(ServerOptions(log, d.tokens, extra), transport...)...)
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

	if cfg.MetricsListen != "" {
		if sc.metricsLis, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return nil, fmt.Errorf("metrics_listen %s: %w", cfg.MetricsListen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
		sc.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := sc.metrics.Serve(sc.metricsLis); !errors.Is(err, http.ErrServerClosed) {
				sc.served <- fmt.Errorf("serving metrics on %s: %w", cfg.MetricsListen, err)
			}
		}()
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

// backendChange is what a backend's report of its health means to the
// event stream and the metrics.
func backendChange(cfg *config.Config, degraded bool, cause error) BackendChange {
	c := BackendChange{Backend: cfg.Backend.Kind, Degraded: degraded}
	switch {
	case degraded && cause != nil:
		c.Detail = fmt.Sprintf("%v; on_unavailable: %s", cause, cfg.Backend.Redis.OnUnavailable)
	case degraded:
		c.Detail = "on_unavailable: " + cfg.Backend.Redis.OnUnavailable
	}
	return c
}

// scopeStates reads every scope's live state for the metrics collector.
func (s *Server) scopeStates(ctx context.Context) []metrics.ScopeState {
	var out []metrics.ScopeState
	for _, name := range s.Scopes() {
		sc, err := s.Scope(name)
		if err != nil {
			continue // removed by a reload meanwhile
		}
		d, err := sc.Describe(ctx)
		out = append(out, metrics.ScopeState{Name: name, Description: d, LiveCalls: s.calls.liveIn(name), Err: err})
	}
	return out
}

// reload applies the configuration file again. A bad file changes nothing.
// Scope changes apply at once with breaker and quota state kept; changes of
// the listeners or the backend need a restart.
func reload(log *slog.Logger, srv *Server, running *config.Config, opts config.Options, environ []string) *config.Config {
	next, err := config.Load(opts, environ)
	if err != nil {
		log.Error("configuration reload rejected; the running configuration stays", "config", configName(opts), "err", err)
		return nil
	}
	if next.Listen != running.Listen || next.MetricsListen != running.MetricsListen || fmt.Sprint(next.Backend) != fmt.Sprint(running.Backend) ||
		next.Telemetry != running.Telemetry || next.Events != running.Events || next.Log.Format != running.Log.Format ||
		next.ListenMode != running.ListenMode || next.TLS != running.TLS || next.Limits != running.Limits {
		log.Warn("configuration reload: listen, listen_mode, tls, limits, metrics_listen, backend, telemetry, events and log.format changes need a restart and were not applied")
	}
	srv.Apply(next)
	log.Info("configuration reloaded", "config", configName(opts), "scopes", srv.Scopes(), "log_level", next.Log.Level, "auth", next.Auth.Token != "", "operator_auth", next.Auth.OperatorToken != "")
	return next
}

func configName(o config.Options) string {
	if o.File == "" {
		return "embedded demo"
	}
	return o.File
}

// BackendHealthService is the health service name that reports the backend:
// NOT_SERVING while a shared backend is unavailable (whatever on_unavailable
// says). The admission service itself turns NOT_SERVING only when it cannot
// decide: an unavailable backend under on_unavailable: fail_closed.
const BackendHealthService = "polygate.backend"

func backendHealth(hs *health.Server, cfg *config.Config, degraded bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if degraded {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	hs.SetServingStatus(BackendHealthService, st)
	admission := healthpb.HealthCheckResponse_SERVING
	if degraded && cfg.Backend.Redis.OnUnavailable == "fail_closed" {
		admission = healthpb.HealthCheckResponse_NOT_SERVING
	}
	hs.SetServingStatus(admissionv1.AdmissionService_ServiceDesc.ServiceName, admission)
}

func listen(addr string, mode os.FileMode) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		return ListenUnix(path, mode)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return lis, nil
}

func address(lis net.Listener) string {
	if lis.Addr().Network() == "unix" {
		return "unix://" + lis.Addr().String()
	}
	return lis.Addr().String()
}

// newLogger writes c.Format to w at level, which it sets to c.Level (a
// reload may set it again).
func newLogger(c config.Log, level *slog.LevelVar, w io.Writer) *slog.Logger {
	_ = level.UnmarshalText([]byte(c.Level))
	o := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}

// printConfig shows the effective configuration, defaults and derived values
// included, for --check.
func printConfig(w io.Writer, cfg *config.Config) error {
	fmt.Fprintf(w, "configuration OK: listen %s, metrics_listen %q, backend %s, %d scope(s)\n",
		cfg.Listen, cfg.MetricsListen, cfg.Backend.Kind, len(cfg.Scopes))
	list := &admissionv1.ListScopesResponse{}
	for _, name := range sortedKeys(cfg.Scopes) {
		sc := cfg.Scopes[name]
		d := &admissionv1.ScopeDescription{Config: scopeConfig(sc)}
		for i := range sc.Sources {
			d.Sources = append(d.Sources, &admissionv1.SourceState{Name: sc.Sources[i].Name, Config: sourceConfig(&sc.Sources[i], sc.LeaseGrace)})
		}
		list.Scopes = append(list.Scopes, d)
	}
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(list)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
