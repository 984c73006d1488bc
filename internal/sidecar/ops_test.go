package sidecar

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/test/bufconn"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/internal/admissiontest"
)

// opsEnv is a sidecar wired as Run wires it (telemetry, metrics listener,
// event hub, interceptors), served over bufconn. Tests that step time run in
// testing/synctest bubbles.
type opsEnv struct {
	admissiontest.Caller
	sc   *sidecar
	logs *admissiontest.LockedBuffer
	http *http.Client
}

// startOps starts a sidecar of the given configuration, on a memory backend
// with startSidecar as Run calls it, serving over bufconn.
func startOps(t *testing.T, yaml string) *opsEnv {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &admissiontest.LockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// Both listeners are in memory, so that a test may run in a synctest
	// bubble (a goroutine blocked on a real socket would stop its clock).
	lis, metricsLis := bufconn.Listen(1<<20), bufconn.Listen(1<<20)
	sc, err := startSidecar(cfg, log, sidecarDeps{backend: inmem.New(time.Now), lis: lis, metricsLis: metricsLis})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // longer than any step a bubbled test takes
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return metricsLis.DialContext(ctx) }}}
	t.Cleanup(func() {
		cancel()
		sc.stop()
		client.CloseIdleConnections()
	})
	return &opsEnv{Caller: admissiontest.Caller{Client: admissiontest.Dial(t, lis), Ctx: ctx}, sc: sc, logs: logs, http: client}
}

// scrape reads /metrics over the real HTTP server (on an in-memory listener).
func (e *opsEnv) scrape(t *testing.T) families {
	t.Helper()
	if e.sc.metricsLis == nil {
		t.Fatal("metrics_listen is not set")
	}
	req, err := http.NewRequestWithContext(e.Ctx, http.MethodGet, "http://"+e.sc.metricsLis.Addr().String()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v\n%s", resp.StatusCode, err, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, body)
	}
	return families(fams)
}

// families are a scrape's metric families by name.
type families map[string]*dto.MetricFamily

// find returns the sample of name whose labels include labels ("k=v"...).
func (f families) find(name string, labels ...string) *dto.Metric {
	fam, ok := f[name]
	if !ok {
		return nil
	}
next:
	for _, m := range fam.Metric {
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is a counter's or a gauge's value; -1 when the sample is absent.
func (f families) value(name string, labels ...string) float64 {
	m := f.find(name, labels...)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return -1
}

// histogram is a histogram's sample count and sum; count -1 when absent.
func (f families) histogram(name string, labels ...string) (count int64, sum float64) {
	m := f.find(name, labels...)
	if m == nil || m.Histogram == nil {
		return -1, 0
	}
	return int64(m.Histogram.GetSampleCount()), m.Histogram.GetSampleSum()
}

// answerWaitsAtOnce makes every OnNoRunnable of the scope answer as soon as
// it has decided (and published) its Wait, as a shutdown does: a caller with
// no certain retry time is otherwise held until something changes or its
// RPC's deadline nears, which these tests do not exercise.
func (e *opsEnv) answerWaitsAtOnce(t *testing.T, scope string) {
	t.Helper()
	sc, err := e.sc.srv.Scope(scope)
	if err != nil {
		t.Fatal(err)
	}
	sc.Close()
}
