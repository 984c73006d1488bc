package server

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/polygate/polygate/config"
)

// LimitOptions are the gRPC server's bounds on one client: the largest
// request it decodes, concurrent RPCs per connection, the keepalive pings it
// tolerates and how long an idle connection is kept.
func LimitOptions(l config.Limits) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(l.MaxRequestBytes),
		grpc.MaxConcurrentStreams(uint32(l.MaxStreamsPerConnection)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle(l.MaxConnectionIdle), Time: 2 * time.Hour, Timeout: 20 * time.Second}),
	}
}

// idle maps "never" (0) to gRPC's infinity.
func idle(d time.Duration) time.Duration {
	if d == 0 {
		return time.Duration(1<<63 - 1)
	}
	return d
}
