package main

import (
	"cmp"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/internal/sidecartest"
)

// collector is an OTLP/gRPC trace receiver that keeps every span.
type collector struct {
	collectorpb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
	by    map[string]int // spans received per protocol
}

func (c *collector) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	c.add(req, "grpc")
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (c *collector) add(req *collectorpb.ExportTraceServiceRequest, protocol string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]int{}
	}
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			c.spans = append(c.spans, ss.GetSpans()...)
			c.by[protocol] += len(ss.GetSpans())
		}
	}
}

func (c *collector) received() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.by)
}

// ServeHTTP is the OTLP/HTTP receiver: POST /v1/traces with a protobuf
// body, gzipped or not.
func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want POST /v1/traces of application/x-protobuf", http.StatusBadRequest)
		return
	}
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(io.LimitReader(body, 16<<20))
	var req collectorpb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.add(&req, "http/protobuf")
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// startCollector serves c over OTLP/gRPC and OTLP/HTTP; it returns both
// addresses (host:port).
func startCollector(t *testing.T, c *collector) (grpcAddr, httpAddr string) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(gs, c)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	hs := httptest.NewServer(c)
	t.Cleanup(hs.Close)
	return lis.Addr().String(), hs.Listener.Addr().String()
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
// logs the trace as a tree. It runs once per OTLP protocol the sidecar
// speaks: grpc, and http/protobuf (the specification's default, so that
// case leaves OTEL_EXPORTER_OTLP_PROTOCOL unset).
func TestOTLPExportEndToEnd(t *testing.T) {
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(protocol, "/", "_"), func(t *testing.T) { testOTLPExport(t, protocol) })
	}
}

func testOTLPExport(t *testing.T, protocol string) {
	col := &collector{}
	grpcAddr, httpAddr := startCollector(t, col)
	env := []string{
		"POLYGATE_SCOPES__DEMO__MAX_ATTEMPTS=3",
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
	if protocol == "grpc" {
		env = append(env, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+grpcAddr)
	} else {
		env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+httpAddr)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0"}, env...)
	ctx := testContext(t)
	s.WaitLog(t, ctx, "tracing on: OTLP\" protocol="+protocol+" ")

	// The application: its tracer provider exports to the same collector,
	// over the same protocol.
	var exp sdktrace.SpanExporter
	var err error
	if protocol == "grpc" {
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(grpcAddr), otlptracegrpc.WithInsecure())
	} else {
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(httpAddr), otlptracehttp.WithInsecure())
	}
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
	if by := col.received(); by[protocol] != len(col.all()) {
		t.Errorf("spans received per protocol: %v; want all over %s", by, protocol)
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

// An OTLP protocol the sidecar does not speak stops the start with an error
// naming the variable, its value and the allowed values.
func TestOTLPUnsupportedProtocolStopsTheStart(t *testing.T) {
	cmd := exec.Command(sidecartest.Binary(t), "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json")
	out, err := cmd.CombinedOutput()
	if want := `OTEL_EXPORTER_OTLP_PROTOCOL="http/json" is not supported; use http/protobuf or grpc`; err == nil || !strings.Contains(string(out), want) {
		t.Fatalf("exit %v, output %s; want an error saying %s", err, out, want)
	}
}
