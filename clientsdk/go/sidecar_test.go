package polygate_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/polygate/polygate/internal/sidecar"
)

// startSidecar runs a real sidecar in-process (sidecar.Run) with the YAML
// configuration on a free port, and returns its address and a stop function
// that waits for it to end.
func startSidecar(config string, extraArgs ...string) (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "polygate-sdk-")
	if err != nil {
		return "", nil, err
	}
	file := filepath.Join(dir, "polygate.yaml")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	done := make(chan error, 1)
	args := append([]string{"--config", file, "--listen", "127.0.0.1:0"}, extraArgs...)
	go func() {
		err := sidecar.Run(ctx, args, nil, w, io.Discard)
		w.CloseWithError(fmt.Errorf("sidecar ended: %v", err))
		done <- err
	}()
	stop = func() {
		cancel()
		<-done
		os.RemoveAll(dir)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		stop()
		return "", nil, fmt.Errorf("sidecar did not announce its address: %v", lines.Err())
	}
	addr, ok := strings.CutPrefix(lines.Text(), "polygate listening on ")
	if !ok {
		stop()
		return "", nil, fmt.Errorf("sidecar said %q, not its address", lines.Text())
	}
	go io.Copy(io.Discard, out) // keep the pipe drained
	return addr, stop, nil
}

// timeout bounds every test context.
const timeout = 30 * time.Second
