package polygate_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	polygate "github.com/polygate/polygate/clientsdk/go"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// scriptedSidecar answers one call that waits once (a circuit_open, b
// rate_limited), gets source a, is told to retry, gets source b and is done.
// It keeps each RPC's method and traceparent.
type scriptedSidecar struct {
	admissionv1.UnimplementedAdmissionServiceServer
	mu    sync.Mutex
	rpcs  []string // "Method traceparent"
	picks int
}

func (s *scriptedSidecar) seen(ctx context.Context, method string) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rpcs = append(s.rpcs, method+" "+strings.Join(md.Get("traceparent"), ","))
}

func (s *scriptedSidecar) Pick(ctx context.Context, _ *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	s.seen(ctx, "Pick")
	s.mu.Lock()
	s.picks++
	n := s.picks
	s.mu.Unlock()
	switch n {
	case 1:
		return &admissionv1.PickResponse{CallId: "c1", Result: &admissionv1.PickResponse_NoRunnable{NoRunnable: &admissionv1.NoRunnable{
			PerSourceReasons: []*admissionv1.SourceReason{
				{Source: "a", Reason: admissionv1.Reason_REASON_CIRCUIT_OPEN},
				{Source: "b", Reason: admissionv1.Reason_REASON_RATE_LIMITED},
			},
		}}}, nil
	case 2:
		return &admissionv1.PickResponse{CallId: "c1", Result: &admissionv1.PickResponse_Grant{Grant: &admissionv1.Grant{Source: "a", Attempt: 1, PermitId: "p1"}}}, nil
	default:
		return &admissionv1.PickResponse{CallId: "c1", Result: &admissionv1.PickResponse_Grant{Grant: &admissionv1.Grant{Source: "b", Attempt: 2, PermitId: "p2"}}}, nil
	}
}

func (s *scriptedSidecar) OnNoRunnable(ctx context.Context, _ *admissionv1.OnNoRunnableRequest) (*admissionv1.OnNoRunnableResponse, error) {
	s.seen(ctx, "OnNoRunnable")
	return &admissionv1.OnNoRunnableResponse{Decision: &admissionv1.OnNoRunnableResponse_Wait{Wait: &admissionv1.Wait{Sleep: durationpb.New(time.Millisecond)}}}, nil
}

func (s *scriptedSidecar) RecordOutcome(ctx context.Context, req *admissionv1.RecordOutcomeRequest) (*admissionv1.RecordOutcomeResponse, error) {
	s.seen(ctx, "RecordOutcome")
	if req.GetPermitId() == "p1" {
		return &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Retry{Retry: &admissionv1.Retry{Backoff: durationpb.New(time.Millisecond)}}}, nil
	}
	return &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Done{Done: &admissionv1.Done{}}}, nil
}

func serve(t *testing.T, srv admissionv1.AdmissionServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	admissionv1.RegisterAdmissionServiceServer(gs, srv)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

func traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// One Do makes a call span under the application's span and an attempt span
// per attempt under it, with the attempt's source, number, outcome, verdict
// and wait cause; every RPC carries the span of its attempt, and fn runs
// under it with no outgoing metadata of the SDK's.
func TestTracing_SpanTreeAndPropagation(t *testing.T) {
	side := &scriptedSidecar{}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	c, err := polygate.Dial(serve(t, side), polygate.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, app := tp.Tracer("app").Start(context.Background(), "app request")
	var fnSpans []trace.SpanContext
	got, err := polygate.Do(ctx, c, "chat", func(ctx context.Context, a polygate.Attempt) (string, polygate.Result) {
		fnSpans = append(fnSpans, trace.SpanContextFromContext(ctx))
		if md, ok := metadata.FromOutgoingContext(ctx); ok {
			t.Errorf("fn's context carries outgoing metadata %v", md)
		}
		if a.Source == "a" {
			return "", polygate.Result{Outcome: polygate.Transient, HTTPStatus: 503}
		}
		return "answer", polygate.Result{Outcome: polygate.Success, HTTPStatus: 200}
	})
	app.End()
	if err != nil || got != "answer" {
		t.Fatalf("Do = %q, %v", got, err)
	}

	spans := rec.Ended()
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	if len(byName["polygate.call"]) != 1 || len(byName["polygate.attempt"]) != 2 || len(spans) != 4 {
		t.Fatalf("spans %v, want app request, polygate.call and two polygate.attempt", byName)
	}
	call, a1, a2 := byName["polygate.call"][0], byName["polygate.attempt"][0], byName["polygate.attempt"][1]
	if call.Parent().SpanID() != app.SpanContext().SpanID() || call.SpanContext().TraceID() != app.SpanContext().TraceID() {
		t.Errorf("the call span's parent is %v, want the app's span %v", call.Parent().SpanID(), app.SpanContext().SpanID())
	}
	for _, a := range []sdktrace.ReadOnlySpan{a1, a2} {
		if a.Parent().SpanID() != call.SpanContext().SpanID() {
			t.Errorf("attempt span's parent is %v, want the call span %v", a.Parent().SpanID(), call.SpanContext().SpanID())
		}
	}
	want := []map[attribute.Key]string{
		{"polygate.scope": "chat", "polygate.source": "a", "polygate.attempt": "1", "polygate.outcome": "TRANSIENT",
			"polygate.http_status": "503", "polygate.verdict": "retry", "polygate.backoff_s": "0.001",
			"polygate.waits": "1", "polygate.wait.cause": "a=circuit_open,b=rate_limited"},
		{"polygate.scope": "chat", "polygate.source": "b", "polygate.attempt": "2", "polygate.outcome": "SUCCESS",
			"polygate.http_status": "200", "polygate.verdict": "done"},
	}
	for i, a := range []sdktrace.ReadOnlySpan{a1, a2} {
		have := attrs(a)
		for k, v := range want[i] {
			if have[k] != v {
				t.Errorf("attempt %d: %s = %q, want %q (all: %v)", i+1, k, have[k], v, have)
			}
		}
	}
	if _, waited := attrs(a2)["polygate.wait.cause"]; waited {
		t.Errorf("attempt 2 did not wait but has a wait cause")
	}
	if ev := a1.Events(); len(ev) != 1 || ev[0].Name != "wait" {
		t.Errorf("attempt 1 events %v, want one wait", ev)
	}
	if have := attrs(call); have["polygate.verdict"] != "done" || have["polygate.attempts"] != "2" || have["polygate.call_id"] != "c1" {
		t.Errorf("call span attributes %v", have)
	}
	if len(fnSpans) != 2 || !fnSpans[0].Equal(a1.SpanContext()) || !fnSpans[1].Equal(a2.SpanContext()) {
		t.Errorf("fn ran under %v, want the attempt spans", fnSpans)
	}

	p1, p2 := traceparent(a1.SpanContext()), traceparent(a2.SpanContext())
	wantRPCs := []string{"Pick " + p1, "OnNoRunnable " + p1, "Pick " + p1, "RecordOutcome " + p1, "Pick " + p2, "RecordOutcome " + p2}
	side.mu.Lock()
	defer side.mu.Unlock()
	if strings.Join(side.rpcs, "\n") != strings.Join(wantRPCs, "\n") {
		t.Errorf("RPCs and their traceparent:\n%s\nwant:\n%s", strings.Join(side.rpcs, "\n"), strings.Join(wantRPCs, "\n"))
	}
}

// A call the sidecar fails ends both spans with the verdict and the reason,
// as errors.
func TestTracing_FailureEndsTheSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	c, err := polygate.Dial(serve(t, &pickRecorder{}), polygate.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = polygate.Do(context.Background(), c, "chat", never)
	if f := (*polygate.FailureError)(nil); !errors.As(err, &f) {
		t.Fatalf("Do: %v, want a FailureError", err)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want the call's and its one attempt's", len(spans))
	}
	for _, s := range spans {
		have := attrs(s)
		if have["polygate.verdict"] != "failure" || have["polygate.reason"] != "circuit_open" || s.Status().Code.String() != "Error" {
			t.Errorf("span %s: attributes %v status %v, want failure circuit_open as an error", s.Name(), have, s.Status())
		}
	}
}

// Without a tracer provider (the global one is a no-op) no trace context
// reaches the sidecar.
func TestTracing_OffByDefault(t *testing.T) {
	side := &scriptedSidecar{}
	c, err := polygate.Dial(serve(t, side))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := polygate.Do(context.Background(), c, "chat", func(context.Context, polygate.Attempt) (int, polygate.Result) {
		return 0, polygate.Result{Outcome: polygate.Success}
	}); err != nil {
		t.Fatal(err)
	}
	side.mu.Lock()
	defer side.mu.Unlock()
	for _, r := range side.rpcs {
		if !strings.HasSuffix(r, " ") {
			t.Errorf("RPC with a traceparent: %q", r)
		}
	}
}

// grantDone grants every Pick and answers Done to every outcome.
type grantDone struct {
	admissionv1.UnimplementedAdmissionServiceServer
}

func (grantDone) Pick(context.Context, *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	return &admissionv1.PickResponse{CallId: "c1", Result: &admissionv1.PickResponse_Grant{Grant: &admissionv1.Grant{Source: "a", Attempt: 1, PermitId: "p1"}}}, nil
}

func (grantDone) RecordOutcome(context.Context, *admissionv1.RecordOutcomeRequest) (*admissionv1.RecordOutcomeResponse, error) {
	return &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Done{Done: &admissionv1.Done{}}}, nil
}

// BenchmarkDoTracing is one granted, successful call (two RPCs over
// loopback) with tracing off (the global no-op provider) and with an SDK
// provider that samples every span and exports none.
func BenchmarkDoTracing(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts []polygate.Option
	}{
		{"off", nil},
		{"sdk", []polygate.Option{polygate.WithTracerProvider(sdktrace.NewTracerProvider())}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			gs := grpc.NewServer()
			admissionv1.RegisterAdmissionServiceServer(gs, grantDone{})
			go gs.Serve(lis)
			defer gs.Stop()
			c, err := polygate.Dial(lis.Addr().String(), tc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			fn := func(context.Context, polygate.Attempt) (int, polygate.Result) {
				return 1, polygate.Result{Outcome: polygate.Success}
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := polygate.Do(context.Background(), c, "chat", fn); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
