package sidecar

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// TestRunChecksAndHelps: --check prints the effective configuration and
// serves nothing; --help is not an error; a bad flag is.
func TestRunChecksAndHelps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	if err := Run(ctx, []string{"--check"}, nil, &out, io.Discard); err != nil {
		t.Fatalf("--check: %v", err)
	}
	if !strings.HasPrefix(out.String(), "configuration OK: listen 127.0.0.1:50051") || !strings.Contains(out.String(), `"demo"`) {
		t.Errorf("--check printed:\n%s", out.String())
	}
	if err := Run(ctx, []string{"--help"}, nil, io.Discard, io.Discard); err != nil {
		t.Errorf("--help: %v", err)
	}
	if err := Run(ctx, []string{"--no-such-flag"}, nil, io.Discard, io.Discard); err == nil {
		t.Error("an unknown flag was accepted")
	}
}

// TestRunServesAndStops runs the sidecar in-process: it announces both
// listeners, serves health and the admission service, refuses a second start
// on the same address, and returns nil once its context ends.
func TestRunServesAndStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	out, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := Run(runCtx, []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, nil, w, io.Discard)
		w.CloseWithError(fmt.Errorf("Run returned %v", err))
		done <- err
	}()
	defer func() { stop(); <-done }()
	lines := bufio.NewScanner(out)
	var addr, metricsURL string
	for _, want := range []string{"polygate listening on ", "polygate metrics on "} {
		if !lines.Scan() {
			t.Fatalf("want %q: %v", want, lines.Err())
		}
		v, ok := strings.CutPrefix(lines.Text(), want)
		if !ok {
			t.Fatalf("stdout %q, want %q", lines.Text(), want)
		}
		if addr == "" {
			addr = v
		} else {
			metricsURL = v
		}
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	if !strings.HasPrefix(metricsURL, "http://127.0.0.1:") || !strings.HasSuffix(metricsURL, "/metrics") {
		t.Errorf("metrics announced at %q", metricsURL)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: BackendHealthService})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("backend health: %v %v", hc, err)
	}
	p, err := admissionv1.NewAdmissionServiceClient(conn).Pick(ctx, &admissionv1.PickRequest{Scope: "demo"})
	if err != nil || p.GetGrant() == nil {
		t.Fatalf("Pick: %v %v", p, err)
	}

	if err := Run(ctx, []string{"--listen", addr}, nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "listen "+addr) {
		t.Errorf("a second start on %s: %v, want an error naming the address", addr, err)
	}

	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	done <- nil // for the deferred wait
}
