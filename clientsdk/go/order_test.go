package polygate_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"

	polygate "github.com/polygate/polygate/clientsdk/go"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// pickRecorder keeps the Picks it receives and refuses them with a failure.
type pickRecorder struct {
	admissionv1.UnimplementedAdmissionServiceServer
	mu    sync.Mutex
	picks []*admissionv1.PickRequest
}

func (r *pickRecorder) Pick(_ context.Context, req *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	r.mu.Lock()
	r.picks = append(r.picks, req)
	r.mu.Unlock()
	return &admissionv1.PickResponse{CallId: "c1", Result: &admissionv1.PickResponse_Failure{
		Failure: &admissionv1.Failure{Reason: admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN},
	}}, nil
}

func TestPriorityAndTenant_ClientDefaultsAndPerCall(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &pickRecorder{}
	srv := grpc.NewServer()
	admissionv1.RegisterAdmissionServiceServer(srv, rec)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	c, err := polygate.Dial(lis.Addr().String(), polygate.WithDefaultPriority(3), polygate.WithDefaultTenant("batch"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	_, _ = polygate.Do(ctx, c, "chat", never)
	_, _ = polygate.Do(ctx, c, "chat", never, polygate.WithPriority(9), polygate.WithTenant("search"))
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.picks) != 2 {
		t.Fatalf("%d picks", len(rec.picks))
	}
	if p := rec.picks[0]; p.GetPriority() != 3 || p.GetTenant() != "batch" {
		t.Fatalf("client defaults: priority %d tenant %q", p.GetPriority(), p.GetTenant())
	}
	if p := rec.picks[1]; p.GetPriority() != 9 || p.GetTenant() != "search" {
		t.Fatalf("per call: priority %d tenant %q", p.GetPriority(), p.GetTenant())
	}
}
