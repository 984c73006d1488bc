package server

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/admissiontest"
)

// opsEnv is a server with the event hub and the real interceptor chain
// (plus extra ones), served over bufconn, logging at debug
// level into logs. internal/sidecar has the same harness with metrics and
// telemetry wired in.
type opsEnv struct {
	admissiontest.Caller
	sc   *opsServer
	logs *admissiontest.LockedBuffer
}

// opsServer is the served Server and its gRPC server.
type opsServer struct {
	srv      *Server
	gs       *grpc.Server
	stopOnce sync.Once
}

// stop stops as the sidecar does: waits and watch streams are answered,
// then in-flight RPCs drain.
func (s *opsServer) stop() {
	s.stopOnce.Do(func() {
		s.srv.Close()
		s.gs.GracefulStop()
		s.srv.Interrupt()
	})
}

type opsOpts struct {
	yaml         string
	interceptors Interceptors
	watchBuffer  int
}

func startOps(t *testing.T, o opsOpts) *opsEnv {
	t.Helper()
	cfg, err := config.Parse([]byte(o.yaml), nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &admissiontest.LockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := New(cfg, inmem.New(time.Now), log, Options{WatchBuffer: o.watchBuffer})
	gs := grpc.NewServer(append(ServerOptions(log, NewTokens(cfg.Auth), o.interceptors), append(LimitOptions(cfg.Limits, log), CodecOption())...)...)
	admissionv1.RegisterAdmissionServiceServer(gs, srv)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	sc := &opsServer{srv: srv, gs: gs}
	ctx, cancel := context.WithTimeout(context.Background(), harnessTimeout)
	t.Cleanup(func() {
		cancel()
		sc.stop()
	})
	return &opsEnv{Caller: admissiontest.Caller{Client: admissiontest.Dial(t, lis), Ctx: ctx}, sc: sc, logs: logs}
}

// answerWaitsAtOnce makes every OnNoRunnable of the scope answer as soon as
// it has decided (and published) its Wait, as a shutdown does: a caller with
// no certain retry time is otherwise held until something changes or its
// RPC's deadline nears, which these tests do not exercise.
func (e *opsEnv) answerWaitsAtOnce(t *testing.T, scope string) {
	t.Helper()
	sc, err := e.sc.srv.Scope(scope)
	if err != nil {
		t.Fatal(err)
	}
	sc.Close()
}
