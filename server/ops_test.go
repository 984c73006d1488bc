package server

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// opsEnv is a server with the event hub and the real interceptor chain
// (plus extra ones), served over bufconn, logging at debug
// level into logs. internal/sidecar has the same harness with metrics and
// telemetry wired in.
type opsEnv struct {
	sc     *opsServer
	client admissionv1.AdmissionServiceClient
	ctx    context.Context
	logs   *lockedBuffer
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

// lockedBuffer collects logs written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startOps(t *testing.T, o opsOpts) *opsEnv {
	t.Helper()
	cfg, err := config.Parse([]byte(o.yaml), nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := New(cfg, inmem.New(time.Now), log, Options{WatchBuffer: o.watchBuffer})
	gs := grpc.NewServer(append(ServerOptions(log, NewTokens(cfg.Auth), o.interceptors), append(LimitOptions(cfg.Limits), CodecOption())...)...)
	admissionv1.RegisterAdmissionServiceServer(gs, srv)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	sc := &opsServer{srv: srv, gs: gs}
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), harnessTimeout)
	t.Cleanup(func() {
		cancel()
		conn.Close()
		sc.stop()
	})
	return &opsEnv{sc: sc, client: admissionv1.NewAdmissionServiceClient(conn), ctx: ctx, logs: logs}
}

func (e *opsEnv) pick(t *testing.T, scope, call string, tokens int64) *admissionv1.PickResponse {
	t.Helper()
	resp, err := e.client.Pick(e.ctx, &admissionv1.PickRequest{Scope: scope, CallId: call, EstimatedTokens: tokens})
	if err != nil {
		t.Fatalf("Pick: %v", err)
	}
	return resp
}

func (e *opsEnv) grant(t *testing.T, scope, call string, tokens int64) *admissionv1.PickResponse {
	t.Helper()
	resp := e.pick(t, scope, call, tokens)
	if resp.GetGrant() == nil {
		t.Fatalf("Pick(%s, %q) refused: %v", scope, call, resp)
	}
	return resp
}

// outcome reports an attempt of the call picked in p.
type outcome struct {
	o      admissionv1.Outcome
	status int32
	hint   time.Duration
	actual *int64
}

func (e *opsEnv) record(t *testing.T, scope string, p *admissionv1.PickResponse, o outcome) *admissionv1.RecordOutcomeResponse {
	t.Helper()
	req := &admissionv1.RecordOutcomeRequest{
		Scope: scope, CallId: p.GetCallId(), PermitId: p.GetGrant().GetPermitId(), Outcome: o.o,
		HttpStatus: o.status, ActualTokens: o.actual,
	}
	if o.hint > 0 {
		req.RetryAfterHint = durationpb.New(o.hint)
	}
	resp, err := e.client.RecordOutcome(e.ctx, req)
	if err != nil {
		t.Fatalf("RecordOutcome: %v", err)
	}
	return resp
}

func (e *opsEnv) onNoRunnable(t *testing.T, scope, call string) *admissionv1.OnNoRunnableResponse {
	t.Helper()
	resp, err := e.client.OnNoRunnable(e.ctx, &admissionv1.OnNoRunnableRequest{Scope: scope, CallId: call})
	if err != nil {
		t.Fatalf("OnNoRunnable: %v", err)
	}
	return resp
}

func (e *opsEnv) override(t *testing.T, scope, source string, a admissionv1.OverrideAction) {
	t.Helper()
	if _, err := e.client.OverrideBreaker(e.ctx, &admissionv1.OverrideBreakerRequest{
		Scope: scope, Source: source, Action: a, Actor: "oncall", Reason: "test " + a.String(),
	}); err != nil {
		t.Fatalf("OverrideBreaker: %v", err)
	}
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
