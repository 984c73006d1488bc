package sidecar

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/polygate/polygate/server"
)

// listen opens the gRPC listener: "host:port", or "unix:///path" (a stale
// socket file of an earlier run is replaced).
func listen(addr string, mode os.FileMode) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		return server.ListenUnix(path, mode)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return lis, nil
}

func address(lis net.Listener) string {
	if lis.Addr().Network() == "unix" {
		return "unix://" + lis.Addr().String()
	}
	return lis.Addr().String()
}
