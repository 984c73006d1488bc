package sidecar

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// TestTracingEnabledFollowsTheOTelEnvironment checks the documented rule.
func TestTracingEnabledFollowsTheOTelEnvironment(t *testing.T) {
	for _, c := range []struct {
		name     string
		environ  []string
		on       bool
		protocol string
		err      string // a part of the error; "" for none
	}{
		{"nothing set", nil, false, "", ""},
		{"exporter otlp", []string{"OTEL_TRACES_EXPORTER=otlp"}, true, "http/protobuf", ""},
		{"endpoint only", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318"}, true, "http/protobuf", ""},
		{"traces endpoint only", []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces"}, true, "http/protobuf", ""},
		{"exporter none wins", []string{"OTEL_TRACES_EXPORTER=none", "OTEL_EXPORTER_OTLP_ENDPOINT=http://x:4317"}, false, "", ""},
		{"sdk disabled wins", []string{"OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=otlp"}, false, "", ""},
		{"unsupported exporter", []string{"OTEL_TRACES_EXPORTER=zipkin"}, false, "", `OTEL_TRACES_EXPORTER="zipkin" is not supported; use otlp or none`},
		{"grpc protocol", []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"}, true, "grpc", ""},
		{"http protocol", []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"}, true, "http/protobuf", ""},
		{"traces protocol wins", []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc"}, true, "grpc", ""},
		{"http/json refused", []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"},
			false, "", `OTEL_EXPORTER_OTLP_PROTOCOL="http/json" is not supported; use http/protobuf or grpc`},
		{"bad traces protocol refused", []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=udp"},
			false, "", `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="udp" is not supported; use http/protobuf or grpc`},
	} {
		t.Run(c.name, func(t *testing.T) {
			on, protocol, err := tracingEnabled(c.environ)
			if on != c.on || protocol != c.protocol || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
				t.Errorf("tracingEnabled(%q) = %v, %q, %v; want %v, %q, error %q", c.environ, on, protocol, err, c.on, c.protocol, c.err)
			}
		})
	}
}

// TestSpansCarryTheDecision records spans in memory: each admission RPC is
// one server span, child of the caller's W3C trace context, with scope,
// source, verdict and reason; a wait is an event with its cause; health
// checks make no span.
func TestSpansCarryTheDecision(t *testing.T) {
	cfg, err := config.Parse([]byte(`
scopes:
  chat:
    circuit_open: wait
    backpressure: {stall_window: 60s, poll_interval: 10ms}
    breaker: {fail_threshold: 1, cooldown: 1s, max_cooldown: 1s}
    sources:
      - {name: primary, priority: 0}
      - {name: fallback, priority: 1}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	lis := bufconn.Listen(1 << 20)
	sc, err := startSidecar(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), sidecarDeps{backend: inmem.New(time.Now), lis: lis, tracer: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.stop()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-"+parentID+"-01")
	client := admissionv1.NewAdmissionServiceClient(conn)

	// primary fails (503), the retry goes to fallback, which also fails:
	// both breakers are OPEN (for a cooldown of 1s, far longer than these
	// calls take) and the third Pick waits it out.
	p, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
	if err != nil || p.GetGrant().GetSource() != "primary" {
		t.Fatalf("Pick: %v %v", p, err)
	}
	call := p.CallId
	for _, src := range []string{"primary", "fallback"} {
		if src == "fallback" {
			if p, err = client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", CallId: call}); err != nil || p.GetGrant().GetSource() != "fallback" {
				t.Fatalf("failover Pick: %v %v", p, err)
			}
		}
		if _, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: call, PermitId: p.GetGrant().GetPermitId(),
			Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT, HttpStatus: 503}); err != nil {
			t.Fatal(err)
		}
	}
	if p, err = client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", CallId: call}); err != nil || p.GetNoRunnable() == nil {
		t.Fatalf("Pick with both OPEN: %v %v", p, err)
	}
	if d, err := client.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: call}); err != nil || d.GetWait() == nil {
		t.Fatalf("OnNoRunnable: %v %v", d, err)
	}
	sc.stop()

	type want struct {
		name  string
		attrs map[string]string
	}
	wants := []want{
		{"polygate.admission.v1.AdmissionService/Pick", map[string]string{"polygate.scope": "chat", "polygate.verdict": "grant", "polygate.source": "primary"}},
		{"polygate.admission.v1.AdmissionService/RecordOutcome", map[string]string{"polygate.scope": "chat", "polygate.verdict": "retry", "polygate.breaker_state": "open"}},
		{"polygate.admission.v1.AdmissionService/Pick", map[string]string{"polygate.verdict": "grant", "polygate.source": "fallback"}},
		{"polygate.admission.v1.AdmissionService/RecordOutcome", map[string]string{"polygate.verdict": "retry", "polygate.breaker_state": "open"}},
		{"polygate.admission.v1.AdmissionService/Pick", map[string]string{"polygate.verdict": "no_runnable", "polygate.reason": "primary=cooldown,fallback=cooldown"}},
		{"polygate.admission.v1.AdmissionService/OnNoRunnable", map[string]string{"polygate.scope": "chat", "polygate.verdict": "wait"}},
	}
	// A span ends after its answer is sent, so the next RPC may start first:
	// order by start.
	spans := rec.Ended()
	slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	if len(spans) != len(wants) {
		for _, s := range spans {
			t.Logf("span %s %v", s.Name(), s.Attributes())
		}
		t.Fatalf("%d spans, want %d", len(spans), len(wants))
	}
	for i, s := range spans {
		if s.Name() != wants[i].name || s.Parent().TraceID().String() != traceID || s.Parent().SpanID().String() != parentID || !s.Parent().IsRemote() {
			t.Errorf("span %d: %s parent %v, want %s under the caller's %s/%s", i, s.Name(), s.Parent(), wants[i].name, traceID, parentID)
		}
		got := map[string]string{}
		for _, a := range s.Attributes() {
			got[string(a.Key)] = a.Value.String()
		}
		for k, v := range wants[i].attrs {
			if got[k] != v {
				t.Errorf("span %d %s: %s = %q, want %q (all: %v)", i, s.Name(), k, got[k], v, got)
			}
		}
	}
	var waits []attribute.KeyValue
	for _, e := range spans[len(spans)-1].Events() {
		if e.Name == "wait" {
			waits = append(waits, e.Attributes...)
		}
	}
	if len(waits) == 0 {
		t.Fatalf("the OnNoRunnable span has no wait event: %v", spans[len(spans)-1].Events())
	}
	for _, a := range waits {
		// What the wait's own read found (the Pick's refusals were the cooldown memo's).
		if a.Key == "polygate.wait.cause" && a.Value.AsString() != "primary=circuit_open,fallback=circuit_open" {
			t.Errorf("wait cause %q", a.Value.AsString())
		}
	}
}
