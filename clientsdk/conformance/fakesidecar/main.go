// Command fakesidecar serves the conformance kit's scripted fake sidecar
// (package kit) for SDK runners in any language: it prints
// "fakesidecar listening on URL" (its control API, kit.Control) and serves
// until it is interrupted, or, with --exit-on-stdin-eof, until its standard
// input closes (so that it ends with a parent that dies).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/polygate/polygate/clientsdk/conformance/kit"
)

func main() {
	stdinEOF := flag.Bool("exit-on-stdin-eof", false, "exit when standard input closes")
	listen := flag.String("listen", "127.0.0.1:0", "address of the control API")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakesidecar:", err)
		os.Exit(1)
	}
	fake := &kit.Fake{}
	defer fake.End()
	srv := &http.Server{Handler: kit.Control(fake)}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "fakesidecar:", err)
			stop()
		}
	}()
	fmt.Printf("fakesidecar listening on http://%s\n", lis.Addr())
	if *stdinEOF {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			stop()
		}()
	}
	<-ctx.Done()
	_ = srv.Close()
}
