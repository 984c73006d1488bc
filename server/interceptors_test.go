package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// records is a slog handler that keeps every record it is given.
type records struct {
	level slog.Level
	mu    sync.Mutex
	recs  []slog.Record
}

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// finished returns the "finished call" records: level and grpc.method.
func (r *records) finished() (out []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if rec.Message != "finished call" {
			continue
		}
		method := ""
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "grpc.method" {
				method = a.Value.String()
			}
			return true
		})
		out = append(out, rec.Level.String()+" "+method)
	}
	return out
}

// chainHarness serves the admission service, health and reflection over
// bufconn through ServerOptions with an extra (outermost) interceptor that
// counts the calls it sees, as the tracing interceptor would, and an RPC
// counter, as the metrics are.
type chainHarness struct {
	adm     admissionv1.AdmissionServiceClient
	health  healthpb.HealthClient
	refl    reflectionpb.ServerReflectionClient
	logs    *records
	counted *atomic.Int64
	rpcs    *rpcRecorder
	ctx     context.Context
}

// rpcRecorder is an RPCCounter that records what it is told.
type rpcRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (r *rpcRecorder) Started(method string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, "started "+path.Base(method))
}

func (r *rpcRecorder) Ended(method string, err error, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, fmt.Sprintf("ended %s %v %t", path.Base(method), status.Code(err), d >= 0))
}

func (r *rpcRecorder) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

func startChain(t *testing.T, level slog.Level, token string) *chainHarness {
	t.Helper()
	cfg, err := config.Parse([]byte(testConfig), nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &records{level: level}
	log := slog.New(logs)
	var counted atomic.Int64
	rpcs := &rpcRecorder{}
	extra := Interceptors{
		RPC: rpcs,
		Unary: []grpc.UnaryServerInterceptor{func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			counted.Add(1)
			return h(ctx, req)
		}},
		Stream: []grpc.StreamServerInterceptor{func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			counted.Add(1)
			return h(srv, ss)
		}},
	}
	srv := New(cfg, inmem.New(time.Now), log, Options{})
	gs := grpc.NewServer(ServerOptions(log, NewTokens(config.Auth{Token: token}), extra)...)
	admissionv1.RegisterAdmissionServiceServer(gs, srv)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	reflection.Register(gs)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(func() {
		cancel()
		conn.Close()
		srv.Close()
		gs.Stop()
	})
	return &chainHarness{
		adm: admissionv1.NewAdmissionServiceClient(conn), health: healthpb.NewHealthClient(conn),
		refl: reflectionpb.NewServerReflectionClient(conn), logs: logs, counted: &counted, rpcs: rpcs, ctx: ctx,
	}
}

// listServices asks reflection for the service list.
func (h *chainHarness) listServices(t *testing.T) []string {
	t.Helper()
	st, err := h.refl.ServerReflectionInfo(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	_ = st.CloseSend()
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names
}

func TestHealthAndReflectionSkipTheAdmissionChain(t *testing.T) {
	h := startChain(t, slog.LevelDebug, "secret")
	// Served without the token, neither counted nor logged.
	if hc, err := h.health.Check(h.ctx, &healthpb.HealthCheckRequest{}); err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without a token: %v, %v; want SERVING", hc, err)
	}
	if names := h.listServices(t); !slices.Contains(names, admissionv1.AdmissionService_ServiceDesc.ServiceName) {
		t.Fatalf("reflection lists %v, want the admission service among them", names)
	}
	if n := h.counted.Load(); n != 0 {
		t.Errorf("the outermost interceptor saw %d health or reflection calls, want 0", n)
	}
	if got := h.rpcs.calls(); len(got) != 0 {
		t.Errorf("the RPC counter was told %v of health and reflection, want nothing", got)
	}
	if got := h.logs.finished(); len(got) != 0 {
		t.Errorf("health and reflection logged %v, want nothing", got)
	}
	// The admission service still goes through all of it: the extra
	// interceptor, logging and auth.
	_, err := h.adm.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "chat"})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("RetryAfter without the token: %v, want UNAUTHENTICATED", err)
	}
	if n := h.counted.Load(); n != 1 {
		t.Errorf("the outermost interceptor saw %d admission calls, want 1", n)
	}
	if got, want := h.rpcs.calls(), []string{"started RetryAfter", "ended RetryAfter Unauthenticated true"}; !slices.Equal(got, want) {
		t.Errorf("the RPC counter was told %v, want %v (the status the chain answers)", got, want)
	}
	if got, want := h.logs.finished(), []string{"WARN RetryAfter"}; !slices.Equal(got, want) {
		t.Errorf("logged %v, want %v", got, want)
	}
}

func TestFinishedCallsLogAtTheLevelOfTheirCode(t *testing.T) {
	for _, tc := range []struct {
		name  string
		level slog.Level
		want  []string
	}{
		{name: "info drops successes", level: slog.LevelInfo, want: []string{"WARN RetryAfter"}},
		{name: "debug logs every call", level: slog.LevelDebug, want: []string{"DEBUG RetryAfter", "WARN RetryAfter"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startChain(t, tc.level, "")
			if _, err := h.adm.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "chat"}); err != nil {
				t.Fatal(err)
			}
			_, err := h.adm.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "no-such-scope"})
			if status.Code(err) != codes.NotFound {
				t.Fatalf("RetryAfter on an unknown scope: %v, want NOT_FOUND", err)
			}
			if got := h.logs.finished(); !slices.Equal(got, tc.want) {
				t.Errorf("logged %v, want %v", got, tc.want)
			}
		})
	}
}

// A call whose level is off costs no fields: logFinished allocates nothing.
func TestUnloggedCallsBuildNoFields(t *testing.T) {
	log := slog.New(&records{level: slog.LevelInfo})
	ctx, start := context.Background(), time.Now()
	if n := testing.AllocsPerRun(100, func() {
		logFinished(ctx, log, "/polygate.admission.v1.AdmissionService/Pick", "unary", start, nil)
	}); n != 0 {
		t.Errorf("logFinished of a successful call at info allocates %v times, want 0", n)
	}
}

// panicky is an admission service whose handlers panic.
type panicky struct {
	admissionv1.UnimplementedAdmissionServiceServer
}

func (panicky) Pick(context.Context, *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	panic("pick-panic-value")
}

func (panicky) WatchEvents(*admissionv1.WatchEventsRequest, grpc.ServerStreamingServer[admissionv1.WatchEventsResponse]) error {
	panic("watch-panic-value")
}

// TestPanicIsInternalWithReason: a panic in a unary or a streaming handler
// reaches the client as INTERNAL with the ErrorInfo reason INTERNAL and a
// generic message, and is logged with its stack.
func TestPanicIsInternalWithReason(t *testing.T) {
	logs := &records{level: slog.LevelDebug}
	gs := grpc.NewServer(ServerOptions(slog.New(logs), NewTokens(config.Auth{}), Interceptors{})...)
	admissionv1.RegisterAdmissionServiceServer(gs, panicky{})
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(func() {
		cancel()
		conn.Close()
		gs.Stop()
	})
	client := admissionv1.NewAdmissionServiceClient(conn)

	tests := []struct {
		name  string
		value string
		call  func() error
	}{
		{"Unary", "pick-panic-value", func() error {
			_, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
			return err
		}},
		{"Stream", "watch-panic-value", func() error {
			st, err := client.WatchEvents(ctx, &admissionv1.WatchEventsRequest{})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			wantStatus(t, err, codes.Internal, admissionv1.ErrorReason_ERROR_REASON_INTERNAL, "")
			if msg := status.Convert(err).Message(); msg != "internal error" {
				t.Errorf("message %q, want the generic \"internal error\"", msg)
			}
			if !logs.panicLogged(tc.value) {
				t.Errorf("no \"panic in handler\" record with %q and a stack through panicky", tc.value)
			}
		})
	}
}

// panicLogged reports whether a "panic in handler" record carries value as
// its panic and a stack that goes through the panicking handler.
func (r *records) panicLogged(value string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if rec.Message != "panic in handler" {
			continue
		}
		var p, stack string
		rec.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "panic":
				p = a.Value.String()
			case "stack":
				stack = a.Value.String()
			}
			return true
		})
		if p == value && strings.Contains(stack, "server.panicky.") {
			return true
		}
	}
	return false
}
