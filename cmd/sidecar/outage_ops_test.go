package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/redistest"
	"github.com/polygate/polygate/internal/sidecartest"
)

// freeTCPAddr returns a loopback address nobody listens on now.
func freeTCPAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrapeLine returns the line of /metrics that starts with sample.
func scrapeLine(t *testing.T, ctx context.Context, addr, sample string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, sample+" ") {
			return line
		}
	}
	return ""
}

// TestBackendOutageIsWatchedAndCounted: when the real binary loses its Redis
// and gets it back, WatchEvents streams both changes and the metrics count
// them (the backend's health callback reaches the event hub and the
// metrics through Run).
func TestBackendOutageIsWatchedAndCounted(t *testing.T) {
	r := redistest.Start(t)
	metricsAddr := freeTCPAddr(t)
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf("metrics_listen: %s\n"+sharedConfig, metricsAddr, r.Addr, "fail_closed")), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	client, _ := dial(t, s.Addr)
	ctx := testContext(t)

	stream, err := client.WatchEvents(ctx, &admissionv1.WatchEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatal(err)
	}
	health := make(chan *admissionv1.BackendHealth, 16)
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				close(health)
				return
			}
			if h := ev.GetBackendHealth(); h != nil {
				health <- h
			}
		}
	}()
	wait := func(degraded bool) *admissionv1.BackendHealth {
		t.Helper()
		select {
		case h, ok := <-health:
			if !ok || h.GetDegraded() != degraded || h.GetBackend() != "redis" {
				t.Fatalf("backend health event %v (stream open %v), want degraded %v", h, ok, degraded)
			}
			return h
		case <-ctx.Done():
			t.Fatalf("no backend health event (degraded %v)\n%s", degraded, s.Logs())
		}
		return nil
	}

	r.Stop()
	if _, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "pool"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Pick without Redis: %v, want UNAVAILABLE", err)
	}
	if h := wait(true); !strings.Contains(h.GetDetail(), "on_unavailable: fail_closed") {
		t.Fatalf("detail %q", h.GetDetail())
	}
	if got := scrapeLine(t, ctx, metricsAddr, "polygate_backend_degraded"); got != "polygate_backend_degraded 1" {
		t.Fatalf("during the outage: %q", got)
	}

	r.Start()
	eventually(t, ctx, "the sidecar serves again after Redis returns", func() bool {
		_, err := client.ListScopes(ctx, &admissionv1.ListScopesRequest{})
		return err == nil
	})
	wait(false)
	for sample, want := range map[string]string{
		"polygate_backend_degraded":                                "0",
		`polygate_backend_health_changes_total{state="degraded"}`:  "1",
		`polygate_backend_health_changes_total{state="recovered"}`: "1",
	} {
		if got := scrapeLine(t, ctx, metricsAddr, sample); got != sample+" "+want {
			t.Errorf("after the outage: %q, want %s %s", got, sample, want)
		}
	}
	// The connection pool is shown against its limit (backend.redis.pool_size
	// 0: go-redis's 10 per CPU), and none of its waits timed out; the
	// requests sent to Redis and their calls are counted.
	for sample, positive := range map[string]bool{
		"polygate_redis_pool_size": true, "polygate_redis_pool_connections": true, "polygate_redis_pool_timeouts_total": false,
		"polygate_redis_op_calls_total": true, "polygate_redis_ops_total": true,
	} {
		line := scrapeLine(t, ctx, metricsAddr, sample)
		v, err := strconv.ParseFloat(strings.TrimPrefix(line, sample+" "), 64)
		if err != nil || positive != (v > 0) || v < 0 {
			t.Errorf("%q: want %s %s", line, sample, map[bool]string{true: "> 0", false: "0"}[positive])
		}
	}
}
