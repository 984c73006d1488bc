// Command polygatectl is the operator's view of a running polygate sidecar:
// its scopes, one scope's live state as a table, breaker overrides and the
// event stream, over the sidecar's own gRPC API.
//
//	polygatectl [--addr ADDR] [--token T | --token-file F] [--tls ...] COMMAND [ARGS] [--json]
//	  scopes                                  every scope, one line each
//	  describe SCOPE                          the scope's sources: breaker, probe, quota, pacer
//	  override SCOPE SOURCE ACTION --reason R [--actor A]
//	  watch [SCOPE]                           one line per event until interrupted
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "polygatectl:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
