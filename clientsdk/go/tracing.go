package polygate

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// tracerName is the instrumentation scope of the SDK's spans.
const tracerName = "github.com/polygate/polygate/clientsdk/go"

// WithTracerProvider makes the client's spans with tp: a span per Do
// ("polygate.call") and, under it, a span per attempt ("polygate.attempt",
// the parent of the context fn gets), and every RPC to the sidecar carries
// the current span's W3C trace context so that the sidecar's own spans join
// the same trace. Without this option the spans go to the global provider
// (otel.GetTracerProvider), which makes none unless the application sets one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *clientConfig) { c.tracerProvider = tp }
}

func (cfg clientConfig) tracer() trace.Tracer {
	tp := cfg.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider() // delegates to whatever the app sets later
	}
	return tp.Tracer(tracerName)
}

// sidecarPropagator is what the sidecar reads: W3C trace context and baggage.
var sidecarPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// tracedConn adds the context's trace context to the metadata of every RPC.
// It wraps the connection rather than the RPC contexts so that fn's context
// carries no outgoing metadata of the SDK's.
type tracedConn struct{ grpc.ClientConnInterface }

func (c tracedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return c.ClientConnInterface.Invoke(withTraceContext(ctx), method, args, reply, opts...)
}

func (c tracedConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.ClientConnInterface.NewStream(withTraceContext(ctx), desc, method, opts...)
}

func withTraceContext(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	sidecarPropagator.Inject(ctx, metadataCarrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

// metadataCarrier is gRPC metadata as a propagation.TextMapCarrier.
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// callSpans are one Do's spans: the call's, and the attempt's being sought
// or run (nil between attempts).
type callSpans struct {
	tracer  trace.Tracer
	scope   string
	call    trace.Span
	attempt trace.Span
	waits   []string // the attempt's wait causes, in order
}

// The methods build attributes only for a recording span: with the default
// no-op provider they cost next to nothing.

func startCall(ctx context.Context, tr trace.Tracer, scope string) (context.Context, *callSpans) {
	ctx, span := tr.Start(ctx, "polygate.call")
	if span.IsRecording() {
		span.SetAttributes(attribute.String("polygate.scope", scope))
	}
	return ctx, &callSpans{tracer: tr, scope: scope, call: span}
}

// startAttempt opens the span of attempt number n, which begins with the
// Pick that seeks its permit; ctx is the call's.
func (s *callSpans) startAttempt(ctx context.Context, n int) context.Context {
	s.endAttempt()
	ctx, s.attempt = s.tracer.Start(ctx, "polygate.attempt")
	if s.attempt.IsRecording() {
		s.attempt.SetAttributes(attribute.String("polygate.scope", s.scope), attribute.Int("polygate.attempt", n))
	}
	return ctx
}

// callID names the call.
func (s *callSpans) callID(id string) {
	if s.call.IsRecording() {
		s.call.SetAttributes(attribute.String("polygate.call_id", id))
	}
}

// granted names the attempt's source.
func (s *callSpans) granted(g *admissionv1.Grant) {
	if !s.attempt.IsRecording() {
		return
	}
	s.attempt.SetAttributes(attribute.String("polygate.source", g.GetSource()),
		attribute.Int("polygate.attempt", int(g.GetAttempt())), attribute.Bool("polygate.probe", g.GetProbe()))
}

// waited records one wait for capacity: how long, and each source's refusal.
func (s *callSpans) waited(sleep time.Duration, refused []*admissionv1.SourceReason) {
	if !s.attempt.IsRecording() {
		return
	}
	parts := make([]string, 0, len(refused))
	for _, r := range refused {
		parts = append(parts, r.GetSource()+"="+refusalName(r.GetReason()))
	}
	cause := strings.Join(parts, ",")
	s.waits = append(s.waits, cause)
	s.attempt.AddEvent("wait", trace.WithAttributes(
		attribute.String("polygate.wait.cause", cause), attribute.Float64("polygate.wait.sleep_s", sleep.Seconds())))
	s.attempt.SetAttributes(attribute.Int("polygate.waits", len(s.waits)), attribute.String("polygate.wait.cause", cause))
}

// reported records the attempt's outcome and the sidecar's answer to it.
func (s *callSpans) reported(res Result, next *admissionv1.RecordOutcomeResponse) {
	if !s.attempt.IsRecording() {
		return
	}
	s.attempt.SetAttributes(attribute.String("polygate.outcome", res.Outcome.String()))
	if res.HTTPStatus != 0 {
		s.attempt.SetAttributes(attribute.Int("polygate.http_status", res.HTTPStatus))
	}
	switch n := next.GetNext().(type) {
	case *admissionv1.RecordOutcomeResponse_Done:
		s.attempt.SetAttributes(attribute.String("polygate.verdict", "done"))
	case *admissionv1.RecordOutcomeResponse_Retry:
		s.attempt.SetAttributes(attribute.String("polygate.verdict", "retry"),
			attribute.Float64("polygate.backoff_s", n.Retry.GetBackoff().AsDuration().Seconds()))
	case *admissionv1.RecordOutcomeResponse_Failure:
		s.attempt.SetAttributes(attribute.String("polygate.verdict", "failure"),
			attribute.String("polygate.reason", failureFromProto[n.Failure.GetReason()].String()))
	}
	if res.Outcome != Success {
		s.attempt.SetStatus(codes.Error, res.Outcome.String())
	}
}

func (s *callSpans) endAttempt() {
	if s.attempt != nil {
		s.attempt.End()
		s.attempt, s.waits = nil, nil
	}
}

// end closes the spans with the call's result.
func (s *callSpans) end(attempts int, err error) {
	if !s.call.IsRecording() {
		s.endAttempt()
		s.call.End()
		return
	}
	verdict := []attribute.KeyValue{attribute.String("polygate.verdict", verdictOf(err))}
	var f *FailureError
	if errors.As(err, &f) {
		verdict = append(verdict, attribute.String("polygate.reason", f.Reason.String()))
	}
	if s.attempt != nil { // the call ended while seeking or running an attempt
		s.attempt.SetAttributes(verdict...)
		if err != nil {
			s.attempt.SetStatus(codes.Error, "")
		}
		s.endAttempt()
	}
	s.call.SetAttributes(append(verdict, attribute.Int("polygate.attempts", attempts))...)
	if err != nil {
		s.call.SetStatus(codes.Error, truncate(err.Error(), maxDetail))
	}
	s.call.End()
}

func verdictOf(err error) string {
	var f *FailureError
	switch {
	case err == nil:
		return "done"
	case errors.As(err, &f):
		return "failure"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	}
	return "error"
}
