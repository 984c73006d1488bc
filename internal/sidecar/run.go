package sidecar

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/health"

	"go.opentelemetry.io/otel/trace"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/server"
)

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
	if opts.Version {
		_, err := fmt.Fprintln(stdout, buildInfo().Line("polygate"))
		return err
	}
	cfg, err := config.Load(opts, environ)
	if err != nil {
		return err
	}
	if opts.Check {
		// stdout carries the document alone, for scripts.
		fmt.Fprintf(stderr, "configuration OK: %s\n", configName(opts))
		return config.Print(stdout, cfg, opts.Output)
	}
	level := new(slog.LevelVar)
	log := newLogger(cfg.Log, level, stderr)
	traced, protocol, err := tracingEnabled(environ)
	if err != nil {
		return err
	}
	var tracer trace.TracerProvider
	if traced {
		tp, err := newOTLPProvider(ctx, buildInfo(), protocol)
		if err != nil {
			return err
		}
		defer func() {
			// Spans still batched are sent before the process exits.
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(sctx); err != nil {
				log.Warn("tracing: flushing spans at stop failed", "err", err)
			}
		}()
		tracer = tp
		log.Info("tracing on: OTLP", "protocol", protocol, "endpoint", firstSet(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"))
	}
	tokens := server.NewTokens(cfg.Auth)

	// The backend reports its health from the moment it opens; the server
	// that publishes and counts the reports exists only afterwards.
	hs := health.NewServer()
	var started atomic.Pointer[server.Server]
	b, err := openBackend(cfg, log, func(degraded bool, cause error) {
		backendHealth(hs, cfg, degraded)
		if srv := started.Load(); srv != nil {
			srv.BackendChanged(backendChange(cfg, degraded, cause))
		}
	}, func(scope string, restored int) {
		if srv := started.Load(); srv != nil {
			srv.BackendChanged(server.BackendChange{Scope: scope, Backend: cfg.Backend.Kind,
				Detail: fmt.Sprintf("redis lost the scope's state; re-asserted %d OPEN breakers and overrides this replica knew", restored)})
		}
	})
	if err != nil {
		return err
	}
	defer b.close()
	sc, err := startSidecar(cfg, log, sidecarDeps{backend: b, backendName: b.describe, stateLoss: b.stateLoss, health: hs, created: started.Store, tokens: tokens, collectors: b.collectors, tracer: tracer})
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
	go announcements(subCtx, b, sc.srv.Announce, log)
	// Reloads are taken from before the announcement: a SIGHUP sent as soon
	// as the address is out must not end the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// A change of the file reloads as SIGHUP does.
	fileChanged := make(chan struct{}, 1)
	if opts.File != "" {
		watchCtx, stopWatch := context.WithCancel(context.Background())
		watched := make(chan struct{})
		defer func() { stopWatch(); <-watched }()
		go func() { defer close(watched); watchConfig(watchCtx, log, opts.File, fileChanged) }()
	}
	log.Info("polygate started", "listen", cfg.Listen, "backend", b.describe(), "scopes", sc.srv.Scopes(),
		"config", configName(opts), "metrics_listen", cfg.MetricsListen, "telemetry", cfg.Telemetry.Path, "shadow_scopes", config.ShadowScopes(cfg))
	fmt.Fprintf(stdout, "polygate listening on %s\n", address(sc.lis))
	if sc.metricsLis != nil {
		fmt.Fprintf(stdout, "polygate metrics on http://%s/metrics\n", sc.metricsLis.Addr())
	}

	reloadNow := func() {
		next := reload(log, sc.srv, cfg, opts, environ)
		if next == nil {
			sc.config.rejected()
			return
		}
		sc.config.applied(next, time.Now())
		tokens.Set(next.Auth)
		_ = level.UnmarshalText([]byte(next.Log.Level))
	}
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
			reloadNow()
		case <-fileChanged:
			log.Info("configuration file changed; reloading", "config", opts.File)
			reloadNow()
		case <-sweep.C:
			sc.srv.Sweep()
		}
	}
}

// reload applies the configuration file again. A bad file changes nothing.
// Scope, calls, auth.token and log.level changes apply at once, with breaker
// and quota state kept; a change of a key that needs a restart (listeners,
// backend, telemetry, events, log.format) is logged, key by key, and the
// running value stays.
func reload(log *slog.Logger, srv *server.Server, running *config.Config, opts config.Options, environ []string) *config.Config {
	next, err := config.Load(opts, environ)
	if err != nil {
		log.Error("configuration reload rejected; the running configuration stays", "config", configName(opts), "err", err)
		return nil
	}
	for _, c := range next.KeepRestartKeys(running) {
		log.Warn("configuration reload: "+c.Key+" needs a restart; the running value stays", "key", c.Key, "change", c.Old+" → "+c.New)
	}
	srv.Apply(next)
	log.Info("configuration reloaded", "config", configName(opts), "scopes", srv.Scopes(), "log_level", next.Log.Level, "auth", next.Auth.Token != "",
		"shadow_scopes", config.ShadowScopes(next))
	return next
}

func configName(o config.Options) string {
	if o.File == "" {
		return "embedded demo"
	}
	return o.File
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

// firstSet is the first of names set in environ, for a log line.
func firstSet(environ []string, names ...string) string {
	for _, n := range names {
		if v := lookupEnv(environ, n); v != "" {
			return v
		}
	}
	return "localhost:4317 (default)"
}
