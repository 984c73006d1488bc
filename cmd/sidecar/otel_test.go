package main

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
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
// variables pointing at a collector the test serves, makes one call that
// fails over from primary to fallback under the caller's trace, and checks
// that the spans arrive with the caller's trace id and the scope attribute.
// It logs the trace as a tree.
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
	client, _ := dial(t, s.Addr)
	ctx := testContext(t)
	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-"+parentID+"-01")

	// The demo scope's sources, in the order a call tries them.
	p, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "demo"})
	if err != nil || p.GetGrant() == nil {
		t.Fatalf("Pick: %v %v", p, err)
	}
	first := p.GetGrant().GetSource()
	if _, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "demo", CallId: p.CallId, PermitId: p.GetGrant().GetPermitId(),
		Outcome: admissionv1.Outcome_OUTCOME_SOURCE_DEAD, HttpStatus: 503}); err != nil {
		t.Fatal(err)
	}
	p2, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "demo", CallId: p.CallId})
	if err != nil || p2.GetGrant() == nil || p2.GetGrant().GetSource() == first {
		t.Fatalf("failover Pick: %v %v (first source %s)", p2, err, first)
	}
	if _, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "demo", CallId: p.CallId, PermitId: p2.GetGrant().GetPermitId(),
		Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, HttpStatus: 200}); err != nil {
		t.Fatal(err)
	}

	// The batcher exports within OTEL_BSP_SCHEDULE_DELAY; wait for all four.
	var spans []*tracepb.Span
	for {
		spans = nil
		for _, sp := range col.all() {
			if hex.EncodeToString(sp.GetTraceId()) == traceID {
				spans = append(spans, sp)
			}
		}
		if len(spans) >= 4 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d spans of the trace arrived, want 4:\n%s", len(spans), s.Logs())
		case <-time.After(20 * time.Millisecond):
		}
	}
	slices.SortFunc(spans, func(a, b *tracepb.Span) int { return cmp.Compare(a.GetStartTimeUnixNano(), b.GetStartTimeUnixNano()) })
	var tree strings.Builder
	fmt.Fprintf(&tree, "trace %s\n└─ caller span %s (the application)\n", traceID, parentID)
	for i, sp := range spans {
		if hex.EncodeToString(sp.GetParentSpanId()) != parentID || sp.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("span %s: parent %x kind %v, want a server span under %s", sp.GetName(), sp.GetParentSpanId(), sp.GetKind(), parentID)
		}
		if attr(sp, "polygate.scope") != "demo" {
			t.Errorf("span %s lacks polygate.scope=demo", sp.GetName())
		}
		branch := "├─"
		if i == len(spans)-1 {
			branch = "└─"
		}
		var kv []string
		for _, k := range []string{"polygate.scope", "polygate.source", "polygate.attempt", "polygate.verdict", "polygate.reason", "polygate.breaker_state"} {
			if v := attr(sp, k); v != "" {
				kv = append(kv, strings.TrimPrefix(k, "polygate.")+"="+v)
			}
		}
		d := time.Duration(sp.GetEndTimeUnixNano() - sp.GetStartTimeUnixNano())
		fmt.Fprintf(&tree, "   %s %s [%s] %s\n", branch, strings.TrimPrefix(sp.GetName(), "polygate.admission.v1.AdmissionService/"), d.Round(time.Microsecond), strings.Join(kv, " "))
	}
	t.Logf("the trace of one failed-over call, as the collector received it:\n%s", tree.String())
	if got := attr(spans[0], "polygate.source"); got != first {
		t.Errorf("the first Pick's span names source %q, want %q", got, first)
	}
	if got := attr(spans[2], "polygate.source"); got != p2.GetGrant().GetSource() {
		t.Errorf("the failover Pick's span names source %q, want %q", got, p2.GetGrant().GetSource())
	}
}
