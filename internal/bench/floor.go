package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/emptypb"
)

// ServeFloor serves the floor the sidecar is measured against: a bare
// grpc-go server with the standard health service and nothing else (no
// interceptors), on addr, until ctx ends. It prints "floor listening on
// ADDR" to stdout once it accepts connections. It also serves the held
// mode's floor (floorHold).
func ServeFloor(ctx context.Context, addr string, stdout io.Writer) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("floor: listen %s: %w", addr, err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	gs.RegisterService(&floorHoldDesc, newFloorHold())
	go func() {
		<-ctx.Done()
		gs.Stop()
	}()
	fmt.Fprintf(stdout, "floor listening on %s\n", lis.Addr())
	return gs.Serve(lis)
}

// floorHold is the floor of the held mode: a unary RPC that a bare grpc-go
// server holds on its goroutine, as the sidecar holds OnNoRunnable, until
// Release (or until its caller leaves). What a held call costs the floor is
// what any unary call held by grpc-go costs: the RPC's goroutine and its
// stream.
type floorHold struct {
	mu      sync.Mutex
	release chan struct{} // closed by Release, then replaced
}

func newFloorHold() *floorHold { return &floorHold{release: make(chan struct{})} }

func (f *floorHold) hold(ctx context.Context) {
	f.mu.Lock()
	ch := f.release
	f.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

func (f *floorHold) free() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.release)
	f.release = make(chan struct{})
}

const (
	floorHoldMethod    = "/polybench.FloorHold/Hold"
	floorReleaseMethod = "/polybench.FloorHold/Release"
)

// floorHoldDesc serves floorHold without a proto of its own: both methods
// take and answer google.protobuf.Empty.
var floorHoldDesc = grpc.ServiceDesc{
	ServiceName: "polybench.FloorHold",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Hold", Handler: floorHandler(func(f *floorHold, ctx context.Context) { f.hold(ctx) })},
		{MethodName: "Release", Handler: floorHandler(func(f *floorHold, _ context.Context) { f.free() })},
	},
}

func floorHandler(do func(*floorHold, context.Context)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		if err := dec(new(emptypb.Empty)); err != nil {
			return nil, err
		}
		do(srv.(*floorHold), ctx)
		return new(emptypb.Empty), nil
	}
}
