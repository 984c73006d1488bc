package sidecar

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/polygate/polygate/gate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/buildinfo"
	"github.com/polygate/polygate/policy"
)

// OTLP protocols, as OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL names them.
const (
	otlpGRPC = "grpc"
	otlpHTTP = "http/protobuf"
)

// tracingEnabled applies the OpenTelemetry environment: tracing is on when
// OTEL_TRACES_EXPORTER is "otlp", or when it is unset and
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set;
// OTEL_SDK_DISABLED=true turns it off whatever else says. protocol is the
// OTLP protocol: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
// OTEL_EXPORTER_OTLP_PROTOCOL, else the specification's default
// http/protobuf; grpc and http/protobuf are built in, anything else is an
// error.
func tracingEnabled(environ []string) (on bool, protocol string, err error) {
	get := func(k string) string { return strings.TrimSpace(lookupEnv(environ, k)) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return false, "", nil
	}
	switch exp := get("OTEL_TRACES_EXPORTER"); exp {
	case "otlp":
		on = true
	case "":
		on = get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	case "none":
	default:
		return false, "", fmt.Errorf("OTEL_TRACES_EXPORTER=%.40q is not supported; use otlp or none", exp)
	}
	if !on {
		return false, "", nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch p := get(k); p {
		case "":
			continue
		case otlpGRPC, otlpHTTP:
			return true, p, nil
		default:
			return false, "", fmt.Errorf("%s=%.40q is not supported; use %s or %s", k, p, otlpHTTP, otlpGRPC)
		}
	}
	return true, otlpHTTP, nil
}

func lookupEnv(environ []string, name string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// newOTLPProvider builds a tracer provider exporting OTLP over protocol
// (otlpGRPC or otlpHTTP); the exporter reads its endpoint, headers, TLS,
// compression and timeout from the standard OTEL_EXPORTER_OTLP_* variables,
// the SDK its sampler (OTEL_TRACES_SAMPLER) and batching (OTEL_BSP_*), the
// resource OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
func newOTLPProvider(ctx context.Context, b buildinfo.Build, protocol string) (*sdktrace.TracerProvider, error) {
	var exp sdktrace.SpanExporter
	var err error
	if protocol == otlpGRPC {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", "polygate"), attribute.String("service.version", b.Version)), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("OTel resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// tracing adds OpenTelemetry to the gRPC server: a server span per RPC of
// the admission service (the caller's W3C trace context is its parent),
// attributes naming the scope, the source and the verdict, and an event per
// wait with its cause.
type tracing struct {
	policy.NopObserver
	tp trace.TracerProvider
	// spans are the admission RPCs running now, by call id, so that the
	// Waiting observation (which has no context) reaches its RPC's span.
	spans sync.Map // call id → trace.Span
}

func newTracing(tp trace.TracerProvider) *tracing { return &tracing{tp: tp} }

// statsHandler makes the spans; health and reflection get none.
func (t *tracing) statsHandler() stats.Handler {
	return otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.tp),
		otelgrpc.WithPropagators(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
			return strings.HasPrefix(info.FullMethodName, "/"+admissionv1.AdmissionService_ServiceDesc.ServiceName+"/")
		}),
	)
}

// unary sets the span's attributes from the request and the answer.
func (t *tracing) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return handler(ctx, req)
	}
	if r, ok := req.(interface{ GetScope() string }); ok {
		span.SetAttributes(attribute.String("polygate.scope", r.GetScope()))
	}
	var callID string
	if r, ok := req.(interface{ GetCallId() string }); ok && r.GetCallId() != "" {
		callID = r.GetCallId()
		t.spans.Store(callID, span)
		defer t.spans.Delete(callID)
	}
	resp, err := handler(ctx, req)
	if err != nil {
		span.SetAttributes(attribute.String("polygate.verdict", "error"))
		span.SetStatus(codes.Error, "")
		return resp, err
	}
	setVerdict(span, resp)
	return resp, err
}

func setVerdict(span trace.Span, resp any) {
	verdict := func(v, reason string) {
		span.SetAttributes(attribute.String("polygate.verdict", v))
		if reason != "" {
			span.SetAttributes(attribute.String("polygate.reason", reason))
		}
	}
	failure := func(f *admissionv1.Failure) {
		verdict("failure", enumName(f.GetReason().String(), "FAILURE_REASON_"))
	}
	switch r := resp.(type) {
	case *admissionv1.PickResponse:
		span.SetAttributes(attribute.String("polygate.call_id", r.GetCallId()))
		switch {
		case r.GetGrant() != nil:
			g := r.GetGrant()
			span.SetAttributes(attribute.String("polygate.source", g.GetSource()), attribute.Int("polygate.attempt", int(g.GetAttempt())),
				attribute.Bool("polygate.probe", g.GetProbe()))
			verdict("grant", "")
		case r.GetNoRunnable() != nil:
			verdict("no_runnable", reasons(r.GetNoRunnable().GetPerSourceReasons()))
		case r.GetFailure() != nil:
			failure(r.GetFailure())
		}
	case *admissionv1.OnNoRunnableResponse:
		switch {
		case r.GetWait() != nil:
			verdict("wait", "")
			span.SetAttributes(attribute.String("polygate.sleep", r.GetWait().GetSleep().AsDuration().String()),
				attribute.String("polygate.slept", r.GetWait().GetSlept().AsDuration().String()))
		case r.GetFailure() != nil:
			failure(r.GetFailure())
		}
	case *admissionv1.RecordOutcomeResponse:
		span.SetAttributes(attribute.String("polygate.breaker_state", enumName(r.GetBreakerState().String(), "BREAKER_STATE_")),
			attribute.String("polygate.effect", enumName(r.GetEffect().String(), "OUTCOME_EFFECT_")))
		switch {
		case r.GetDone() != nil:
			verdict("done", "")
		case r.GetRetry() != nil:
			verdict("retry", "")
		case r.GetFailure() != nil:
			failure(r.GetFailure())
		}
	}
}

// reasons shows per-source refusals as "a=circuit_open,b=rpm".
func reasons(rs []*admissionv1.SourceReason) string {
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		parts = append(parts, r.GetSource()+"="+enumName(r.GetReason().String(), "REASON_"))
	}
	return strings.Join(parts, ",")
}

func enumName(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }

// Waiting implements policy.Observer: a span event on the RPC that made the
// call wait, with how long and why (each source's refusal).
func (t *tracing) Waiting(c *policy.Call, sleep time.Duration, rs []gate.Rejection) {
	v, ok := t.spans.Load(c.ID)
	if !ok {
		return
	}
	cause := make([]string, 0, len(rs))
	for _, r := range rs {
		cause = append(cause, r.Source+"="+r.Reason.String())
	}
	v.(trace.Span).AddEvent("wait", trace.WithAttributes(
		attribute.String("polygate.wait.sleep", sleep.String()),
		attribute.String("polygate.wait.cause", strings.Join(cause, ",")),
	))
}
