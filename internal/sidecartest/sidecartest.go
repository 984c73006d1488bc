// Package sidecartest builds the real sidecar binary once per test process
// and starts it as a child process on a free port, for tests that drive it
// over the wire.
package sidecartest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/polygate/polygate/internal/admissiontest"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// Main runs a package's tests and then removes the binary Binary built; call
// it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if binary != "" {
		_ = os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}

// Binary builds ./cmd/sidecar (once per test process) and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "polygate-sidecar-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "sidecar")
		out, err := exec.Command("go", "build", "-race", "-o", binary, "github.com/polygate/polygate/cmd/sidecar").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/sidecar: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// Sidecar is a running sidecar process.
type Sidecar struct {
	// Addr is what it listens on: host:port, or unix:///path.
	Addr string
	cmd  *exec.Cmd
	logs *admissiontest.LockedBuffer
	done chan error
}

// Start runs the binary with args (add "--listen", "127.0.0.1:0" for a free
// port) and extra environment, and waits until it announces its address.
// The process is stopped (SIGTERM, then killed) at the end of the test.
func Start(t testing.TB, args []string, env ...string) *Sidecar {
	t.Helper()
	cmd := exec.Command(Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &Sidecar{cmd: cmd, logs: &admissiontest.LockedBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = s.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "polygate listening on "); ok {
				addr <- a
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() { s.Stop(t) })
	select {
	case s.Addr = <-addr:
	case err := <-s.done:
		s.done <- err
		t.Fatalf("sidecar exited before listening: %v\n%s", err, s.logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("sidecar did not announce its address within 60s\n%s", s.logs)
	}
	return s
}

// Logs returns what the sidecar logged so far.
func (s *Sidecar) Logs() string { return s.logs.String() }

// Signal sends sig to the sidecar.
func (s *Sidecar) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// Stop sends SIGTERM and waits for the process to exit (killing it after
// 30s); it returns the exit error. Calling it again returns the same error.
func (s *Sidecar) Stop(t testing.TB) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err
		return err
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		s.done <- err
		return err
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		err := <-s.done
		s.done <- err
		t.Errorf("sidecar did not stop within 30s of SIGTERM\n%s", s.logs)
		return err
	}
}

// WaitLog waits until the sidecar's log contains substr.
func (s *Sidecar) WaitLog(t testing.TB, ctx context.Context, substr string) {
	t.Helper()
	for !strings.Contains(s.logs.String(), substr) {
		select {
		case <-ctx.Done():
			t.Fatalf("log never said %q:\n%s", substr, s.logs)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
