package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/polygate/polygate/metrics"
)

// services are a server's services as Initialize reads them.
type services map[string]grpc.ServiceInfo

func (s services) GetServiceInfo() map[string]grpc.ServiceInfo { return s }

var served = services{
	"svc.A": {Methods: []grpc.MethodInfo{
		{Name: "Get"}, {Name: "Watch", IsServerStream: true}, {Name: "Send", IsClientStream: true},
		{Name: "Chat", IsClientStream: true, IsServerStream: true},
	}},
	"grpc.health.v1.Health": {Methods: []grpc.MethodInfo{{Name: "Check"}, {Name: "Watch", IsServerStream: true}}},
}

// stream is a server stream whose sends of "fail" and receives after the
// first fail.
type stream struct {
	grpc.ServerStream
	ctx  context.Context
	recv int
}

func (s *stream) Context() context.Context { return s.ctx }
func (s *stream) SendMsg(m any) error {
	if m == "fail" {
		return errors.New("send failed")
	}
	return nil
}
func (s *stream) RecvMsg(any) error {
	if s.recv++; s.recv > 1 {
		return errors.New("EOF")
	}
	return nil
}

// interceptors are one metrics implementation's collector and interceptors.
type interceptors struct {
	c      prometheus.Collector
	unary  grpc.UnaryServerInterceptor
	stream grpc.StreamServerInterceptor
}

// theirsAndOurs are go-grpc-middleware's interceptors (as the sidecar wired
// them before) and RPC's, each initialized with served's methods.
func theirsAndOurs() [2]interceptors {
	theirs := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(metrics.AttemptBuckets)))
	theirs.InitializeMetrics(served)
	ours := metrics.NewRPC(metrics.AttemptBuckets)
	ours.Initialize(served)
	return [2]interceptors{
		{theirs, theirs.UnaryServerInterceptor(), theirs.StreamServerInterceptor()},
		{ours, ours.Unary, ours.Stream},
	}
}

// TestRPCExportsWhatGoGRPCMiddlewareDoes runs the same RPCs through
// go-grpc-middleware's interceptors (as the sidecar wired them before) and
// through RPC's, and compares the two registries' exposition: the same
// families, help, labels, buckets and values, series initialized at zero
// included. In a synctest bubble every RPC takes no time, so the
// histograms match to the bucket.
func TestRPCExportsWhatGoGRPCMiddlewareDoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out [2]string
		for i, m := range theirsAndOurs() {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			for _, c := range []struct {
				method string
				err    error
			}{
				{"/svc.A/Get", nil},
				{"/svc.A/Get", nil},
				{"/svc.A/Get", status.Error(codes.NotFound, "no")},
				{"/svc.A/Get", context.Canceled},
				{"/svc.A/Get", errors.New("plain")},
				{"/svc.A/Get", status.Error(codes.Code(20), "out of range")},
				{"/grpc.health.v1.Health/Check", nil},
				{"/other.B/Do", nil}, // not initialized
				{"bad", status.Error(codes.Internal, "x")},
			} {
				_, _ = m.unary(ctx, "req", &grpc.UnaryServerInfo{FullMethod: c.method}, func(context.Context, any) (any, error) {
					return "resp", c.err
				})
			}
			for _, c := range []struct {
				info grpc.StreamServerInfo
				err  error
			}{
				{grpc.StreamServerInfo{FullMethod: "/svc.A/Watch", IsServerStream: true}, nil},
				{grpc.StreamServerInfo{FullMethod: "/svc.A/Chat", IsClientStream: true, IsServerStream: true}, status.Error(codes.Aborted, "x")},
				{grpc.StreamServerInfo{FullMethod: "/other.B/Send", IsClientStream: true}, nil},
			} {
				_ = m.stream(nil, &stream{ctx: ctx}, &c.info, func(_ any, ss grpc.ServerStream) error {
					_ = ss.RecvMsg(nil)
					_ = ss.RecvMsg(nil)
					_ = ss.SendMsg("ok")
					_ = ss.SendMsg("fail")
					_ = ss.SendMsg("ok")
					return c.err
				})
			}
			out[i] = exposition(t, m.c)
		}
		if out[0] != out[1] {
			t.Fatalf("go-grpc-middleware's exposition:\n%s\nRPC's:\n%s", out[0], out[1])
		}
		for _, want := range []string{
			`grpc_server_handled_total{grpc_code="NotFound",grpc_method="Get",grpc_service="svc.A",grpc_type="unary"} 1`,
			`grpc_server_handled_total{grpc_code="Code(20)",grpc_method="Get",grpc_service="svc.A",grpc_type="unary"} 1`,
			`grpc_server_handled_total{grpc_code="Canceled",grpc_method="Get",grpc_service="svc.A",grpc_type="unary"} 1`,
			`grpc_server_handled_total{grpc_code="OK",grpc_method="Check",grpc_service="grpc.health.v1.Health",grpc_type="unary"} 1`,
			`grpc_server_handled_total{grpc_code="OK",grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"} 0`,
			`grpc_server_handled_total{grpc_code="Internal",grpc_method="unknown",grpc_service="unknown",grpc_type="unary"} 1`,
			`grpc_server_msg_sent_total{grpc_method="Get",grpc_service="svc.A",grpc_type="unary"} 2`,
			`grpc_server_msg_sent_total{grpc_method="Watch",grpc_service="svc.A",grpc_type="server_stream"} 2`,
			`grpc_server_msg_received_total{grpc_method="Send",grpc_service="other.B",grpc_type="client_stream"} 1`,
			`grpc_server_handling_seconds_bucket{grpc_method="Get",grpc_service="svc.A",grpc_type="unary",le="0.05"} 6`,
		} {
			if !strings.Contains(out[1], want) {
				t.Errorf("exposition lacks %s:\n%s", want, out[1])
			}
		}
	})
}

// exposition is c's metrics in Prometheus's text format.
func exposition(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.String()
}

// BenchmarkRPCUnary is the metrics interceptor's cost per unary RPC, ours
// against go-grpc-middleware's:
//
//	go test -run '^$' -bench RPCUnary -benchmem ./metrics/
func BenchmarkRPCUnary(b *testing.B) {
	theirs := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(metrics.AttemptBuckets)))
	theirs.InitializeMetrics(served)
	ours := metrics.NewRPC(metrics.AttemptBuckets)
	ours.Initialize(served)
	info := &grpc.UnaryServerInfo{FullMethod: "/svc.A/Get"}
	handler := func(context.Context, any) (any, error) { return "resp", nil }
	for _, c := range []struct {
		name string
		in   grpc.UnaryServerInterceptor
	}{{"go-grpc-middleware", theirs.UnaryServerInterceptor()}, {"ours", ours.Unary}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.in(b.Context(), "req", info, handler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// While an RPC of a method Initialize did not see is in flight (a stream
// open), and after one whose handler panicked through the interceptor (as a
// panic in auth or validation does), go-grpc-middleware's exposition has
// that method's started counter only: the handling-time histogram's series
// appears once the RPC is handled. RPC's must export the same.
func TestRPCExportsNoHistogramBeforeTheRPCIsHandled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out [2]string
		for i, m := range theirsAndOurs() {
			func() {
				defer func() { _ = recover() }()
				_, _ = m.unary(t.Context(), "req", &grpc.UnaryServerInfo{FullMethod: "/other.B/Panics"}, func(context.Context, any) (any, error) {
					panic("handler")
				})
			}()
			inside, end := make(chan struct{}), make(chan struct{})
			go func() {
				_ = m.stream(nil, &stream{ctx: t.Context()}, &grpc.StreamServerInfo{FullMethod: "/other.B/Watch", IsServerStream: true}, func(any, grpc.ServerStream) error {
					close(inside)
					<-end
					return nil
				})
			}()
			<-inside
			out[i] = exposition(t, m.c)
			close(end)
			synctest.Wait()
		}
		if only := linesNotIn(out[1], out[0]); len(only) > 0 {
			t.Errorf("RPC exports what go-grpc-middleware's does not:\n%s", strings.Join(only, "\n"))
		}
		if only := linesNotIn(out[0], out[1]); len(only) > 0 {
			t.Errorf("go-grpc-middleware's exports what RPC does not:\n%s", strings.Join(only, "\n"))
		}
	})
}

// linesNotIn are the lines of a that b lacks.
func linesNotIn(a, b string) []string {
	bl := strings.Split(b, "\n")
	var only []string
	for _, l := range strings.Split(a, "\n") {
		if !slices.Contains(bl, l) {
			only = append(only, l)
		}
	}
	return only
}
