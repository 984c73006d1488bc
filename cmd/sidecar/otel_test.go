package main

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/internal/sidecartest"
)

// collector is an OTLP/gRPC trace receiver that keeps every span.
type collector struct {
	collectorpb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (c *collector) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			c.spans = append(c.spans, ss.GetSpans()...)
		}
	}
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (c *collector) all() []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans)
}

func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return anyValue(kv.GetValue())
		}
	}
	return ""
}

func anyValue(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	}
	return v.String()
}

// TestOTLPExportEndToEnd runs the real binary with the standard OTEL_*
// variables pointing at a collector the test serves, and an application
// whose Go SDK exports its own spans there too. One call fails over: the
// first source answers 503, the other 200. The collector receives one trace:
// the application's span, the SDK's call span, an attempt span per source,
// and under each attempt the sidecar's server spans for its RPCs. The test
// logs the trace as a tree.
func TestOTLPExportEndToEnd(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	gs := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(gs, col)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0"},
		"POLYGATE_SCOPES__DEMO__MAX_ATTEMPTS=3",
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+lis.Addr().String(),
		"OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	)
	ctx := testContext(t)

	// The application: its tracer provider exports to the same collector.
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(lis.Addr().String()), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	client, err := polygate.Dial(s.Addr, polygate.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	// The upstream: the first source asked answers 503, any other 200.
	var mu sync.Mutex
	var asked []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, r.URL.Path)
		if len(asked) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer up.Close()

	actx, app := tp.Tracer("app").Start(ctx, "app request")
	got, err := polygate.Do(actx, client, "demo", func(ctx context.Context, a polygate.Attempt) (int, polygate.Result) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, up.URL+"/"+a.Source, nil)
		if err != nil {
			return 0, polygate.Result{Outcome: polygate.ClientError}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, polygate.Result{Outcome: polygate.Transient, Detail: err.Error()}
		}
		resp.Body.Close()
		outcome, retryAfter := polygate.Classify(resp.StatusCode, resp.Header, nil)
		return resp.StatusCode, polygate.Result{Outcome: outcome, RetryAfter: retryAfter, HTTPStatus: resp.StatusCode}
	})
	app.End()
	if err != nil || got != http.StatusOK {
		t.Fatalf("Do = %d, %v; want the second source's 200", got, err)
	}
	mu.Lock()
	if len(asked) != 2 || asked[0] == asked[1] {
		t.Fatalf("the upstream was asked %v; want one request per source", asked)
	}
	mu.Unlock()

	// The SDK exported its 4 spans as they ended; the sidecar's batcher
	// exports its 4 (Pick, RecordOutcome per attempt) within
	// OTEL_BSP_SCHEDULE_DELAY.
	traceID := app.SpanContext().TraceID().String()
	var spans []*tracepb.Span
	for {
		spans = nil
		for _, sp := range col.all() {
			if hex.EncodeToString(sp.GetTraceId()) == traceID {
				spans = append(spans, sp)
			}
		}
		if len(spans) >= 8 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d spans of the trace arrived, want 8:\n%s", len(spans), s.Logs())
		case <-time.After(20 * time.Millisecond):
		}
	}
	tree := spanTree(spans)
	t.Logf("the trace of one failed-over call, as the collector received it:\n%s", tree)

	want := `app request
  polygate.call scope=demo verdict=done attempts=2
    polygate.attempt scope=demo source=SOURCE1 attempt=1 outcome=TRANSIENT http_status=503 verdict=retry
      Pick scope=demo source=SOURCE1 attempt=1 verdict=grant
      RecordOutcome scope=demo verdict=retry breaker_state=closed
    polygate.attempt scope=demo source=SOURCE2 attempt=2 outcome=SUCCESS http_status=200 verdict=done
      Pick scope=demo source=SOURCE2 attempt=2 verdict=grant
      RecordOutcome scope=demo verdict=done breaker_state=closed
`
	want = strings.NewReplacer("SOURCE1", strings.TrimPrefix(asked[0], "/"), "SOURCE2", strings.TrimPrefix(asked[1], "/")).Replace(want)
	if shape := spanShape(spans); shape != want {
		t.Errorf("the trace's shape:\n%s\nwant:\n%s", shape, want)
	}
	for _, sp := range spans {
		if strings.HasPrefix(sp.GetName(), "polygate.admission.v1.") && sp.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("span %s has kind %v, want a server span", sp.GetName(), sp.GetKind())
		}
	}
}

// treeKeys are the attributes the tree shows, in order.
var treeKeys = []string{"polygate.scope", "polygate.source", "polygate.attempt", "polygate.outcome", "polygate.http_status",
	"polygate.verdict", "polygate.reason", "polygate.attempts", "polygate.wait.cause", "polygate.breaker_state"}

// walkTree visits spans depth first from the roots (spans whose parent is
// not in the set), children in start order.
func walkTree(spans []*tracepb.Span, visit func(sp *tracepb.Span, depth int, last bool)) {
	slices.SortFunc(spans, func(a, b *tracepb.Span) int { return cmp.Compare(a.GetStartTimeUnixNano(), b.GetStartTimeUnixNano()) })
	ids := map[string]bool{}
	children := map[string][]*tracepb.Span{}
	for _, sp := range spans {
		ids[hex.EncodeToString(sp.GetSpanId())] = true
	}
	var roots []*tracepb.Span
	for _, sp := range spans {
		if p := hex.EncodeToString(sp.GetParentSpanId()); ids[p] {
			children[p] = append(children[p], sp)
		} else {
			roots = append(roots, sp)
		}
	}
	var walk func(sps []*tracepb.Span, depth int)
	walk = func(sps []*tracepb.Span, depth int) {
		for i, sp := range sps {
			visit(sp, depth, i == len(sps)-1)
			walk(children[hex.EncodeToString(sp.GetSpanId())], depth+1)
		}
	}
	walk(roots, 0)
}

func spanLabel(sp *tracepb.Span) string {
	kv := []string{strings.TrimPrefix(sp.GetName(), "polygate.admission.v1.AdmissionService/")}
	for _, k := range treeKeys {
		if v := attr(sp, k); v != "" {
			kv = append(kv, strings.TrimPrefix(k, "polygate.")+"="+v)
		}
	}
	return strings.Join(kv, " ")
}

// spanTree draws the spans as a tree with their durations.
func spanTree(spans []*tracepb.Span) string {
	var b strings.Builder
	if len(spans) > 0 {
		fmt.Fprintf(&b, "trace %x\n", spans[0].GetTraceId())
	}
	var open []bool // per depth: whether the ancestor at that depth has siblings below
	walkTree(spans, func(sp *tracepb.Span, depth int, last bool) {
		open = append(open[:depth], !last)
		for _, more := range open[:depth] {
			b.WriteString(map[bool]string{true: "│  ", false: "   "}[more])
		}
		branch := "├─ "
		if last {
			branch = "└─ "
		}
		d := time.Duration(sp.GetEndTimeUnixNano() - sp.GetStartTimeUnixNano())
		fmt.Fprintf(&b, "%s%s [%s]\n", branch, spanLabel(sp), d.Round(time.Microsecond))
	})
	return b.String()
}

// spanShape is the tree without timings: what the test asserts.
func spanShape(spans []*tracepb.Span) string {
	var b strings.Builder
	walkTree(spans, func(sp *tracepb.Span, depth int, _ bool) {
		fmt.Fprintf(&b, "%s%s\n", strings.Repeat("  ", depth), spanLabel(sp))
	})
	return b.String()
}
