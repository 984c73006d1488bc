package sidecar

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"google.golang.org/grpc"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/metrics"
)

// A call held in OnNoRunnable keeps its RPC in the interceptors for as long
// as it is held. The sidecar counts unary RPCs from within the chain
// (server.Interceptors.RPC), which never sees the request; metrics.RPC's
// interceptor form does not keep it either, as go-grpc-middleware's did in
// its frame until the call returned (docs/performance.md), while the
// handler still gets it.
func TestMetricsInterceptorDoesNotKeepAHeldRequest(t *testing.T) {
	for _, c := range []struct {
		name string
		in   grpc.UnaryServerInterceptor
		kept bool
	}{
		{"metrics.RPC", metrics.NewRPC(metrics.AttemptBuckets).Unary, false},
		// The check can fail: go-grpc-middleware's interceptor given the
		// request keeps it.
		{"given the request", grpcprom.NewServerMetrics().UnaryServerInterceptor(), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			held, release, done := make(chan bool, 1), make(chan struct{}), make(chan struct{})
			req := holdRequest(ctx, c.in, held, release, done)
			select {
			case gotIt := <-held:
				if !gotIt {
					t.Fatal("the handler did not get the request")
				}
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
			runtime.GC()
			runtime.GC()
			if kept := req.Value() != nil; kept != c.kept {
				t.Errorf("request kept while the call is held: %v, want %v", kept, c.kept)
			}
			close(release)
			<-done
		})
	}
}

// holdRequest runs a unary call of a request through in, its handler held
// until release; it reports on held whether the handler got the request,
// closes done when the call returns, and returns only a weak pointer to the
// request.
func holdRequest(ctx context.Context, in grpc.UnaryServerInterceptor, held chan<- bool, release, done chan struct{}) weak.Pointer[admissionv1.OnNoRunnableRequest] {
	req := &admissionv1.OnNoRunnableRequest{Scope: "held", CallId: "c-held"}
	wp := weak.Make(req)
	info := &grpc.UnaryServerInfo{FullMethod: admissionv1.AdmissionService_OnNoRunnable_FullMethodName}
	go func() {
		defer close(done)
		_, _ = in(ctx, req, info, func(context.Context, any) (any, error) {
			held <- wp.Value() != nil
			<-release
			return nil, nil
		})
	}()
	return wp
}
