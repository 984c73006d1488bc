package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/polygate/polygate/config"
)

// LimitOptions are the gRPC server's bounds on one client: the largest
// request it decodes, concurrent RPCs per connection, the time from a
// stream's headers to its request (logging the streams it closes to log),
// the keepalive pings it tolerates and how long an idle connection is kept.
func LimitOptions(l config.Limits, log *slog.Logger) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle((&firstMessage{bound: l.FirstMessageTimeout, log: log}).tap),
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

// TransportOptions are the gRPC server options of the transport, for the
// composition root to append to ServerOptions: the limits (LimitOptions),
// the codec that answers undecodable requests (CodecOption), and TLS
// credentials when tls.cert_file is set.
func TransportOptions(cfg *config.Config, log *slog.Logger) ([]grpc.ServerOption, error) {
	opts := append(LimitOptions(cfg.Limits, log), CodecOption())
	tc, err := TLSConfig(cfg.TLS, log)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	return opts, nil
}

// ListenUnix listens on a unix socket at path, replacing a stale socket of
// an earlier run, and sets its permission bits to mode (0: leave them to the
// umask).
func ListenUnix(path string, mode os.FileMode) (*net.UnixListener, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen unix://%s: %w", path, err)
	}
	if mode != 0 {
		if err := os.Chmod(path, mode); err != nil {
			lis.Close()
			return nil, fmt.Errorf("listen_mode %04o on %s: %w", mode, path, errors.Unwrap(err))
		}
	}
	return lis, nil
}
