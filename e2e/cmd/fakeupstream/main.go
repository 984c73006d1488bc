// Command fakeupstream serves the e2e fake upstream (package upstream) for
// tests in other languages: it prints "fakeupstream listening on URL" and
// serves until it is interrupted, or, with --exit-on-stdin-eof, until its
// standard input closes (so that it ends with a parent that dies).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/polygate/polygate/e2e/upstream"
)

func main() {
	stdinEOF := flag.Bool("exit-on-stdin-eof", false, "exit when standard input closes")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := upstream.New()
	defer s.Close()
	fmt.Printf("fakeupstream listening on %s\n", s.URL)
	if *stdinEOF {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			stop()
		}()
	}
	<-ctx.Done()
}
