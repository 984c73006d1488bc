package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
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
	log := newLogger(cfg.Log, stderr)

	hs := health.NewServer()
	b, err := openBackend(cfg, log, func(degraded bool, _ error) { backendHealth(hs, cfg, degraded) })
	if err != nil {
		return err
	}
	defer b.close()
	srv := New(cfg, b, log, Options{BackendName: b.describe})
	gs := grpc.NewServer(ServerOptions(log, cfg.Auth.Token, Interceptors{})...)
	admissionv1.RegisterAdmissionServiceServer(gs, srv)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	subCtx, stopSub := context.WithCancel(context.Background())
	defer stopSub()
	go announcements(subCtx, b, srv, log)

	lis, err := listen(cfg.Listen)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	backendHealth(hs, cfg, false)
	log.Info("polygate started", "listen", cfg.Listen, "backend", b.describe(), "scopes", srv.Scopes(), "config", configName(opts))
	fmt.Fprintf(stdout, "polygate listening on %s\n", address(lis))

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	sweep := time.NewTicker(time.Second)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("polygate stopping: health NOT_SERVING, waits answered, in-flight RPCs drained")
			hs.Shutdown()
			srv.Close()
			stopped := make(chan struct{})
			go func() { gs.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(stopGrace):
				gs.Stop()
			}
			return nil
		case err := <-served:
			return fmt.Errorf("serving %s: %w", cfg.Listen, err)
		case <-hup:
			reload(log, srv, cfg, opts, environ)
		case <-sweep.C:
			srv.sweep()
		}
	}
}

// reload applies the configuration file again. A bad file changes nothing.
// Scope changes apply at once with breaker and quota state kept; changes of
// the listeners or the backend need a restart.
func reload(log *slog.Logger, srv *Server, running *config.Config, opts config.Options, environ []string) {
	next, err := config.Load(opts, environ)
	if err != nil {
		log.Error("configuration reload rejected; the running configuration stays", "config", configName(opts), "err", err)
		return
	}
	if next.Listen != running.Listen || next.MetricsListen != running.MetricsListen || fmt.Sprint(next.Backend) != fmt.Sprint(running.Backend) {
		log.Warn("configuration reload: listen, metrics_listen and backend changes need a restart and were not applied")
	}
	srv.Apply(next)
	log.Info("configuration reloaded", "config", configName(opts), "scopes", srv.Scopes())
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

func listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(path) // a stale socket of an earlier run
		}
		lis, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		return lis, nil
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

func newLogger(c config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
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
