package kit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Proto names of the format's reasons and codes.
var (
	failureReasons = map[string]admissionv1.FailureReason{
		"circuit_open": admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN, "quota_exhausted": admissionv1.FailureReason_FAILURE_REASON_QUOTA_EXHAUSTED,
		"stalled": admissionv1.FailureReason_FAILURE_REASON_STALLED, "retry_exhausted": admissionv1.FailureReason_FAILURE_REASON_RETRY_EXHAUSTED,
		"non_retryable": admissionv1.FailureReason_FAILURE_REASON_NON_RETRYABLE, "deadline_exceeded": admissionv1.FailureReason_FAILURE_REASON_DEADLINE_EXCEEDED,
		"cancelled": admissionv1.FailureReason_FAILURE_REASON_CANCELLED, "retry_after_too_long": admissionv1.FailureReason_FAILURE_REASON_RETRY_AFTER_TOO_LONG,
		"source_dead": admissionv1.FailureReason_FAILURE_REASON_SOURCE_DEAD, "scope_removed": admissionv1.FailureReason_FAILURE_REASON_SCOPE_REMOVED,
	}
	refusalReasons = map[string]admissionv1.Reason{
		"cooldown": admissionv1.Reason_REASON_COOLDOWN, "circuit_open": admissionv1.Reason_REASON_CIRCUIT_OPEN,
		"probe_in_flight": admissionv1.Reason_REASON_PROBE_IN_FLIGHT, "forced_open": admissionv1.Reason_REASON_FORCED_OPEN,
		"adaptive_paced": admissionv1.Reason_REASON_ADAPTIVE_PACED, "rate_limited": admissionv1.Reason_REASON_RATE_LIMITED,
		"queued": admissionv1.Reason_REASON_QUEUED,
	}
	outcomeNames = map[admissionv1.Outcome]string{
		admissionv1.Outcome_OUTCOME_SUCCESS: "SUCCESS", admissionv1.Outcome_OUTCOME_TRANSIENT: "TRANSIENT",
		admissionv1.Outcome_OUTCOME_RATE_LIMITED: "RATE_LIMITED", admissionv1.Outcome_OUTCOME_SOURCE_DEAD: "SOURCE_DEAD",
		admissionv1.Outcome_OUTCOME_CLIENT_ERROR: "CLIENT_ERROR", admissionv1.Outcome_OUTCOME_CANCELLED: "CANCELLED",
	}
	statusCodes = map[string]codes.Code{
		"INVALID_ARGUMENT": codes.InvalidArgument, "NOT_FOUND": codes.NotFound, "FAILED_PRECONDITION": codes.FailedPrecondition,
		"RESOURCE_EXHAUSTED": codes.ResourceExhausted, "UNAVAILABLE": codes.Unavailable, "UNAUTHENTICATED": codes.Unauthenticated,
		"INTERNAL": codes.Internal, "PERMISSION_DENIED": codes.PermissionDenied, "DEADLINE_EXCEEDED": codes.DeadlineExceeded,
	}
)

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// Event is one thing the fake saw: an RPC or an upstream request.
type Event struct {
	// Step is the script's step it was matched against (-1: none left).
	Step int `json:"step"`
	// What: the RPC's name, or "upstream SOURCE METHOD PATH".
	What string  `json:"what"`
	AtMs float64 `json:"at_ms"`
}

// Report is what the fake saw of an exchange.
type Report struct {
	// Mismatches: every difference between what the SDK did and the
	// script, and every step that never came. Empty: the SDK conformed.
	Mismatches []string `json:"mismatches"`
	Events     []Event  `json:"events"`
}

// Fake is the scripted sidecar and upstream of one exchange at a time.
type Fake struct {
	mu      sync.Mutex
	ex      *Exchange
	start   time.Time
	next    int  // the script's next step
	broken  bool // an event came that the script does not have: the rest is noise
	events  []Event
	miss    []string
	mark    time.Time // the previous step's reply (or a hang's arrival)
	calls   int
	callID  string
	permits int
	permit  string
	attempt int32
	changed chan struct{} // closed and replaced on every event
	done    chan struct{} // closed when the exchange ends: releases hangs

	grpc     *grpc.Server
	upstream *httptest.Server
}

// Endpoints are where an exchange's SDK client and fallback point.
type Endpoints struct {
	// Sidecar is the gRPC address (host:port).
	Sidecar string `json:"sidecar"`
	// Upstream is the fake upstream's URL; a source's route is Upstream + "/" + name.
	Upstream string `json:"upstream"`
	// TLS, for an exchange whose client uses TLS: the PEMs to trust and present.
	TLS *TLSFiles `json:"tls,omitempty"`
}

// Begin ends the current exchange (if any) and serves ex on fresh ports.
func (f *Fake) Begin(ex *Exchange) (Endpoints, error) {
	f.End()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Endpoints{}, err
	}
	var opts []grpc.ServerOption
	var files *TLSFiles
	if ex.Client.TLS != "" {
		creds, tf, err := serverTLS(ex.Client.TLS == "mtls")
		if err != nil {
			lis.Close()
			return Endpoints{}, err
		}
		opts, files = append(opts, grpc.Creds(creds)), tf
	}
	opts = append(opts, grpc.UnaryInterceptor(f.checkToken))
	srv := grpc.NewServer(opts...)
	admissionv1.RegisterAdmissionServiceServer(srv, &admission{f: f})
	up := httptest.NewServer(http.HandlerFunc(f.serveUpstream))
	f.mu.Lock()
	f.ex, f.start, f.next, f.broken = ex, time.Now(), 0, false
	f.events, f.miss, f.mark = nil, nil, time.Now()
	f.calls, f.callID, f.permits, f.permit, f.attempt = 0, "", 0, "", 0
	f.changed, f.done = make(chan struct{}), make(chan struct{})
	f.grpc, f.upstream = srv, up
	f.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
	return Endpoints{Sidecar: lis.Addr().String(), Upstream: up.URL, TLS: files}, nil
}

// checkToken records, as a mismatch, an RPC whose authorization is not the
// exchange's token; the RPC is then served as usual.
func (f *Fake) checkToken(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var got string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			got = v[0]
		}
	}
	f.mu.Lock()
	want := ""
	if f.ex != nil && f.ex.Client.Token != "" {
		want = "Bearer " + f.ex.Client.Token
	}
	if got != want {
		name := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
		f.miss = append(f.miss, fmt.Sprintf("%s: authorization %q, want %q", name, got, want))
	}
	f.mu.Unlock()
	return handler(ctx, req)
}

// StopSidecar stops the exchange's gRPC server: from its return on, the
// address refuses connections.
func (f *Fake) StopSidecar() {
	f.mu.Lock()
	srv := f.grpc
	f.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// End stops the current exchange's servers and releases its hangs.
func (f *Fake) End() {
	f.mu.Lock()
	srv, up, done := f.grpc, f.upstream, f.done
	f.grpc, f.upstream, f.done = nil, nil, nil
	f.mu.Unlock()
	if done != nil {
		close(done)
	}
	if srv != nil {
		srv.Stop()
	}
	if up != nil {
		up.CloseClientConnections()
		up.Close()
	}
}

// WaitEvents waits until the exchange has seen at least n events.
func (f *Fake) WaitEvents(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		got, changed := len(f.events), f.changed
		f.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%d events, waiting for %d: %w", got, n, ctx.Err())
		}
	}
}

// Result waits until every step came (or a mismatch broke the script, or
// ctx ends) and reports what the fake saw.
func (f *Fake) Result(ctx context.Context) Report {
	for {
		f.mu.Lock()
		finished := f.ex == nil || f.broken || f.next >= len(f.ex.Script)
		changed := f.changed
		if finished || ctx.Err() != nil {
			r := Report{Mismatches: slices.Clone(f.miss), Events: slices.Clone(f.events)}
			if f.ex != nil && !f.broken {
				for i := f.next; i < len(f.ex.Script); i++ {
					r.Mismatches = append(r.Mismatches, fmt.Sprintf("step %d (%s): never came", i, f.ex.Script[i].what()))
				}
			}
			if r.Mismatches == nil {
				r.Mismatches = []string{}
			}
			f.mu.Unlock()
			return r
		}
		f.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
		}
	}
}

func (s *Step) what() string {
	if s.RPC != "" {
		return s.RPC
	}
	return "upstream " + s.Upstream
}

// arrive matches an event against the next step. It returns the step (nil
// when the event is not the script's) and the exchange's done channel; the
// caller checks the request with check, which reports mismatches.
func (f *Fake) arrive(what, rpc, source string, check func(s *Step) []string) (*Step, chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	ev := Event{Step: -1, What: what, AtMs: float64(now.Sub(f.start).Microseconds()) / 1000}
	defer func() {
		f.events = append(f.events, ev)
		close(f.changed)
		f.changed = make(chan struct{})
	}()
	if f.ex == nil || f.broken {
		return nil, f.done
	}
	if f.next >= len(f.ex.Script) {
		f.miss = append(f.miss, fmt.Sprintf("%s after the script's end", what))
		f.broken = true
		return nil, f.done
	}
	i, s := f.next, &f.ex.Script[f.next]
	ev.Step = i
	if s.RPC != rpc || s.Upstream != source {
		f.miss = append(f.miss, fmt.Sprintf("step %d: got %s, want %s", i, what, s.what()))
		f.broken = true
		return nil, f.done
	}
	f.next++
	if gap := now.Sub(f.mark); s.AfterMs > 0 && gap < time.Duration(s.AfterMs-1)*time.Millisecond {
		f.miss = append(f.miss, fmt.Sprintf("step %d (%s): came %v after the previous step, want at least %d ms", i, s.what(), gap.Round(time.Microsecond), s.AfterMs))
	}
	for _, m := range check(s) {
		f.miss = append(f.miss, fmt.Sprintf("step %d (%s): %s", i, s.what(), m))
	}
	f.mark = now
	return s, f.done
}

// replied marks the moment a step's reply leaves: the start of the next
// step's after_ms.
func (f *Fake) replied() {
	f.mu.Lock()
	f.mark = time.Now()
	f.mu.Unlock()
}

func differ[T comparable](field string, got, want T) []string {
	if got == want {
		return nil
	}
	return []string{fmt.Sprintf("%s = %v, want %v", field, got, want)}
}

// hang holds an RPC until the client gives up or the exchange ends.
func hang(ctx context.Context, done chan struct{}) error {
	select {
	case <-ctx.Done():
	case <-done:
	}
	return status.Error(codes.Canceled, "conformance: the script hangs here")
}

func rpcErr(e *ErrorReply) error {
	st := status.New(statusCodes[e.Code], e.Message)
	if e.Reason != "" {
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: e.Reason, Domain: "polygate.dev"}); err == nil {
			st = d
		}
	}
	return st.Err()
}

func ms(n int64) *durationpb.Duration { return durationpb.New(time.Duration(n) * time.Millisecond) }

func failure(r *FailureReply) *admissionv1.Failure {
	return &admissionv1.Failure{Reason: failureReasons[r.Reason], RetryAfter: ms(r.RetryAfterMs), PerSourceReasons: reasons(r.Reasons)}
}

func reasons(rs []Reason) []*admissionv1.SourceReason {
	out := make([]*admissionv1.SourceReason, 0, len(rs))
	for _, r := range rs {
		out = append(out, &admissionv1.SourceReason{Source: r.Source, Reason: refusalReasons[r.Reason], RetryAfter: ms(r.RetryAfterMs)})
	}
	return out
}

// unexpected answers an RPC the script does not have at this point.
var unexpected = status.Error(codes.FailedPrecondition, "conformance: this RPC is not the script's next step")

// admission is the scripted AdmissionService.
type admission struct {
	admissionv1.UnimplementedAdmissionServiceServer
	f *Fake
}

func (a *admission) Pick(ctx context.Context, req *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	f := a.f
	var callID string
	s, done := f.arrive("Pick", "Pick", "", func(s *Step) []string {
		w := s.want.(*PickWant)
		var m []string
		if w.Opens {
			m = append(m, differ("call_id", req.GetCallId(), "")...)
		} else {
			m = append(m, differ("call_id", req.GetCallId(), f.callID)...)
		}
		m = append(m, differ("scope", req.GetScope(), f.ex.Scope)...)
		m = append(m, differ("estimated_tokens", req.GetEstimatedTokens(), w.EstimatedTokens)...)
		m = append(m, differ("priority", req.GetPriority(), w.Priority)...)
		m = append(m, differ("tenant", req.GetTenant(), w.Tenant)...)
		// In milliseconds (rounded up), which do not overflow for any Duration.
		d := req.GetDeadline()
		deadline := d.GetSeconds()*1000 + (int64(d.GetNanos())+999_999)/1_000_000
		switch {
		case w.DeadlineMsAtMost == 0 && deadline != 0:
			m = append(m, fmt.Sprintf("deadline = %d ms, want none", deadline))
		case w.DeadlineMsAtMost > 0 && (deadline <= 0 || deadline > w.DeadlineMsAtMost):
			m = append(m, fmt.Sprintf("deadline = %d ms, want in (0, %d ms]", deadline, w.DeadlineMsAtMost))
		}
		r := s.reply.(*PickReply)
		if w.Opens && r.Error == nil && !r.Hang {
			f.calls++
			f.callID, f.attempt = fmt.Sprintf("call-%d", f.calls), 0
		}
		if r.Grant != nil {
			f.permits++
			f.attempt++
			f.permit = fmt.Sprintf("permit-%d", f.permits)
		}
		callID = f.callID
		return m
	})
	if s == nil {
		return nil, unexpected
	}
	r := s.reply.(*PickReply)
	if r.Hang {
		return nil, hang(ctx, done)
	}
	defer f.replied()
	switch {
	case r.Error != nil:
		return nil, rpcErr(r.Error)
	case r.Grant != nil:
		f.mu.Lock()
		permit, attempt, up := f.permit, f.attempt, f.upstream.URL
		f.mu.Unlock()
		attrs := map[string]string{"base_url": up + "/" + r.Grant.Source}
		maps.Copy(attrs, r.Grant.Attributes)
		g := &admissionv1.Grant{Source: r.Grant.Source, Attributes: attrs, PermitId: permit, Attempt: attempt, Probe: r.Grant.Probe,
			Lease: ms(r.Grant.TimeoutMs + 5000), Epoch: 1}
		if r.Grant.TimeoutMs > 0 {
			g.Timeout = ms(r.Grant.TimeoutMs)
		}
		return &admissionv1.PickResponse{CallId: callID, Result: &admissionv1.PickResponse_Grant{Grant: g}}, nil
	case r.NoRunnable != nil:
		return &admissionv1.PickResponse{CallId: callID, Result: &admissionv1.PickResponse_NoRunnable{NoRunnable: &admissionv1.NoRunnable{
			GateRejections: r.NoRunnable.GateRejections, PerSourceReasons: reasons(r.NoRunnable.Reasons)}}}, nil
	default:
		return &admissionv1.PickResponse{CallId: callID, Result: &admissionv1.PickResponse_Failure{Failure: failure(r.Failure)}}, nil
	}
}

func (a *admission) OnNoRunnable(ctx context.Context, req *admissionv1.OnNoRunnableRequest) (*admissionv1.OnNoRunnableResponse, error) {
	f := a.f
	s, done := f.arrive("OnNoRunnable", "OnNoRunnable", "", func(*Step) []string {
		return append(differ("scope", req.GetScope(), f.ex.Scope), differ("call_id", req.GetCallId(), f.callID)...)
	})
	if s == nil {
		return nil, unexpected
	}
	r := s.reply.(*OnNoRunnableReply)
	if r.Hang {
		return nil, hang(ctx, done)
	}
	defer f.replied()
	switch {
	case r.Error != nil:
		return nil, rpcErr(r.Error)
	case r.Wait != nil:
		return &admissionv1.OnNoRunnableResponse{Decision: &admissionv1.OnNoRunnableResponse_Wait{Wait: &admissionv1.Wait{Sleep: ms(r.Wait.SleepMs)}}}, nil
	default:
		return &admissionv1.OnNoRunnableResponse{Decision: &admissionv1.OnNoRunnableResponse_Failure{Failure: failure(r.Failure)}}, nil
	}
}

func (a *admission) RecordOutcome(ctx context.Context, req *admissionv1.RecordOutcomeRequest) (*admissionv1.RecordOutcomeResponse, error) {
	f := a.f
	s, done := f.arrive("RecordOutcome", "RecordOutcome", "", func(s *Step) []string {
		w := s.want.(*RecordWant)
		m := append(differ("scope", req.GetScope(), f.ex.Scope), differ("call_id", req.GetCallId(), f.callID)...)
		m = append(m, differ("permit_id", req.GetPermitId(), f.permit)...)
		m = append(m, differ("outcome", outcomeNames[req.GetOutcome()], w.Outcome)...)
		m = append(m, differ("http_status", req.GetHttpStatus(), w.HTTPStatus)...)
		hint := req.GetRetryAfterHint().AsDuration().Round(time.Millisecond).Milliseconds()
		m = append(m, differ("retry_after_hint_ms", hint, w.RetryAfterHintMs)...)
		switch {
		case w.ActualTokens == nil && req.ActualTokens != nil:
			m = append(m, fmt.Sprintf("actual_tokens = %d, want unset", req.GetActualTokens()))
		case w.ActualTokens != nil && req.ActualTokens == nil:
			m = append(m, fmt.Sprintf("actual_tokens unset, want %d", *w.ActualTokens))
		case w.ActualTokens != nil:
			m = append(m, differ("actual_tokens", req.GetActualTokens(), *w.ActualTokens)...)
		}
		f.permit = ""
		return m
	})
	if s == nil {
		return nil, unexpected
	}
	r := s.reply.(*RecordReply)
	if r.Hang {
		return nil, hang(ctx, done)
	}
	defer f.replied()
	switch {
	case r.Error != nil:
		return nil, rpcErr(r.Error)
	case r.Done != nil:
		return &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Done{Done: &admissionv1.Done{}}}, nil
	case r.Retry != nil:
		return &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Retry{Retry: &admissionv1.Retry{Backoff: ms(r.Retry.BackoffMs)}}}, nil
	default:
		return &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Failure{Failure: failure(r.Failure)}}, nil
	}
}

func (a *admission) CancelCall(ctx context.Context, req *admissionv1.CancelCallRequest) (*admissionv1.CancelCallResponse, error) {
	f := a.f
	s, done := f.arrive("CancelCall", "CancelCall", "", func(*Step) []string {
		m := append(differ("scope", req.GetScope(), f.ex.Scope), differ("call_id", req.GetCallId(), f.callID)...)
		f.permit = ""
		return m
	})
	if s == nil {
		return nil, unexpected
	}
	r := s.reply.(*CancelReply)
	if r.Hang {
		return nil, hang(ctx, done)
	}
	defer f.replied()
	switch {
	case r.Error != nil:
		return nil, rpcErr(r.Error)
	default:
		return &admissionv1.CancelCallResponse{EndedNow: !r.NotEnded}, nil
	}
}

// maxUpstreamBody bounds the request body the fake upstream reads.
const maxUpstreamBody = 1 << 20

// serveUpstream answers /SOURCE/... from the script.
func (f *Fake) serveUpstream(w http.ResponseWriter, r *http.Request) {
	source, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	rest = "/" + rest
	if r.URL.RawQuery != "" {
		rest += "?" + r.URL.RawQuery
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxUpstreamBody))
	if err != nil {
		return // the client went away while sending
	}
	s, done := f.arrive(fmt.Sprintf("upstream %s %s %s", source, r.Method, rest), "", source, func(s *Step) []string {
		want := s.want.(*UpstreamWant)
		var m []string
		if want.Method != "" {
			m = append(m, differ("method", r.Method, want.Method)...)
		}
		if want.Path != "" {
			m = append(m, differ("path", rest, want.Path)...)
		}
		for _, k := range sortedKeys(want.Headers) {
			m = append(m, differ("header "+strings.ToLower(k), r.Header.Get(k), want.Headers[k])...)
		}
		if want.Body != nil {
			m = append(m, differ("body", string(body), *want.Body)...)
		}
		return m
	})
	if s == nil {
		http.Error(w, "conformance: this request is not the script's next step", http.StatusTeapot)
		return
	}
	reply := s.reply.(*UpstreamReply)
	if reply.Hang {
		select {
		case <-r.Context().Done():
		case <-done:
		}
		return
	}
	defer f.replied()
	status := reply.Status
	if status == 0 {
		status = http.StatusOK
	}
	for k, v := range reply.Headers {
		w.Header().Set(k, v)
	}
	if reply.Stream != nil {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(status)
		flusher, _ := w.(http.Flusher)
		for _, chunk := range reply.Stream {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		return
	}
	text := defaultBody(source, status)
	if reply.Body != nil {
		text = *reply.Body
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, text)
}

// defaultBody is an OpenAI-style completion for a 2xx, an OpenAI-style error otherwise.
func defaultBody(source string, status int) string {
	var doc any
	if status >= 200 && status <= 299 {
		doc = map[string]any{
			"object": "chat.completion", "model": "fake-" + source,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]string{"role": "assistant", "content": "ok from " + source}}},
			"usage": map[string]int{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
		}
	} else {
		doc = map[string]any{"error": map[string]any{"message": http.StatusText(status), "type": "upstream", "code": nil}}
	}
	b, _ := json.Marshal(doc)
	return string(b)
}
