package bench

import (
	"context"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ServeFloor serves the floor the sidecar is measured against: a bare
// grpc-go server with the standard health service and nothing else (no
// interceptors), on addr, until ctx ends. It prints "floor listening on
// ADDR" to stdout once it accepts connections.
func ServeFloor(ctx context.Context, addr string, stdout io.Writer) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("floor: listen %s: %w", addr, err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() {
		<-ctx.Done()
		gs.Stop()
	}()
	fmt.Fprintf(stdout, "floor listening on %s\n", lis.Addr())
	return gs.Serve(lis)
}
