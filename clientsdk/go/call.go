package polygate

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// cancelReport bounds a CancelCall, and a report sent after the caller's
// context ended (both run on a context detached from the caller's); it is
// also the least time a RecordOutcome gets.
const cancelReport = 2 * time.Second

// rpcGrace is how much longer than the call's deadline a Pick or an
// OnNoRunnable may take: the sidecar knows the deadline and answers by it,
// with a verdict, so the RPC's own deadline must not race it.
const rpcGrace = time.Second

// maxDetail is the sidecar's limit on RecordOutcomeRequest.detail.
const maxDetail = 1024

// CallOption configures one Do.
type CallOption func(*callConfig)

type callConfig struct {
	tokens   int64
	timeout  *time.Duration
	deadline *time.Time
	priority *int32
	tenant   *string
}

// WithPriority ranks the call among callers waiting for a source's capacity:
// higher is served first (default 0, or the client's WithDefaultPriority).
func WithPriority(p int32) CallOption { return func(c *callConfig) { c.priority = &p } }

// WithTenant names who the call is for (a team, job or customer): callers
// share a source's capacity by the scope's tenant weights. A name is 1 to 63
// bytes of a-z, 0-9, '_' or '-'.
func WithTenant(t string) CallOption { return func(c *callConfig) { c.tenant = &t } }

// WithEstimatedTokens charges n tokens to the TPM limit of each attempt's
// source, settled by Result.ActualTokens.
func WithEstimatedTokens(n int64) CallOption { return func(c *callConfig) { c.tokens = n } }

// WithTimeout gives the call a budget of d from the moment Do starts: the
// sidecar never waits or backs off past it, and fails the call with
// DeadlineExceeded when the earliest certain retry is after it. A d of zero
// or less has no time left. With the context's deadline, or WithDeadline,
// the earliest wins.
func WithTimeout(d time.Duration) CallOption { return func(c *callConfig) { c.timeout = &d } }

// WithDeadline is WithTimeout with a moment instead of a duration.
func WithDeadline(t time.Time) CallOption { return func(c *callConfig) { c.deadline = &t } }

// Do runs one call of scope: it asks the sidecar for a source, runs fn for
// the attempt, reports fn's Result, and does what the sidecar answers (done,
// retry after a backoff, wait, or fail) until the call ends. It returns the
// value of the attempt that succeeded and a nil error; a *FailureError for
// the sidecar's verdict; a *StatusError for a gRPC error of the sidecar; or
// the context's error. Whatever the error, the value is the last attempt's
// (the zero T when none ran), so that, for instance, the body of a
// non_retryable call's 400 is at hand.
//
// fn gets a context that ends with ctx or after the source's timeout. When
// ctx ends, Do ends the call in the sidecar with CancelCall (which settles a
// permit still held as CANCELLED, so that its slot is free at once) and
// returns ctx's error without waiting for anything else; a Result of SUCCESS
// is still reported as such. A panic in fn, or an RPC that fails after the
// call opened, ends the call the same way. When the call's deadline passes
// while the sidecar leaves a Pick or an OnNoRunnable unanswered (for longer
// than a grace of a second), Do ends the call itself: a *FailureError with
// DeadlineExceeded, and CancelCall.
func Do[T any](ctx context.Context, c *Client, scope string, fn func(context.Context, Attempt) (T, Result), opts ...CallOption) (T, error) {
	ctx, spans := startCall(ctx, c.tr, scope)
	call := &callState{c: c, scope: scope, spans: spans}
	value, err := do(ctx, call, fn, opts)
	if err != nil && c.watch.mode == SidecarAllow && unreachable(err) {
		value, err = ungoverned(ctx, call, fn, value, err)
	}
	spans.end(call.attempts, err)
	return value, err
}

// do is Do's loop; ctx carries the call's span.
func do[T any](ctx context.Context, call *callState, fn func(context.Context, Attempt) (T, Result), opts []CallOption) (T, error) {
	var last T
	var cfg callConfig
	for _, o := range opts {
		o(&cfg)
	}
	if err := ctx.Err(); err != nil {
		return last, err
	}
	c, scope := call.c, call.scope
	req := &admissionv1.PickRequest{Scope: scope, EstimatedTokens: cfg.tokens, Priority: c.priority, Tenant: c.tenant}
	if cfg.priority != nil {
		req.Priority = *cfg.priority
	}
	if cfg.tenant != nil {
		req.Tenant = *cfg.tenant
	}
	if deadline, ok := cfg.deadlineFrom(ctx, time.Now()); ok {
		call.end, call.hasEnd = deadline, true
		budget := time.Until(deadline)
		if budget <= 0 {
			return last, call.deadlineExceeded() // no time left at all
		}
		req.Deadline = durationpb.New(budget)
	}
	// actx carries the span of the attempt being sought or run: its Picks,
	// waits, fn and report are under it.
	actx := call.spans.startAttempt(ctx, 1)
	pick, err := call.pick(ctx, actx, req)
	if err != nil {
		return last, err // no call was opened: nothing to end
	}
	call.id = pick.GetCallId()
	call.spans.callID(call.id)
	for {
		switch r := pick.GetResult().(type) {
		case *admissionv1.PickResponse_Grant:
			call.spans.granted(r.Grant)
			value, next, err := attempt(actx, call, r.Grant, fn)
			call.c.watch.began(scope, call.lastAttempt)
			last = value
			if err != nil {
				return last, call.abandon(ctx, err)
			}
			call.spans.reported(*call.last, next)
			call.spans.endAttempt()
			switch n := next.GetNext().(type) {
			case *admissionv1.RecordOutcomeResponse_Done:
				return last, nil
			case *admissionv1.RecordOutcomeResponse_Failure:
				return last, call.failure(n.Failure, nil)
			case *admissionv1.RecordOutcomeResponse_Retry:
				if err := sleep(ctx, n.Retry.GetBackoff().AsDuration()); err != nil {
					return last, call.abandon(ctx, err)
				}
			default:
				return last, call.abandon(ctx, fmt.Errorf("polygate: RecordOutcome of call %s answered no next action", call.id))
			}
			actx = call.spans.startAttempt(ctx, call.attempts+1)
		case *admissionv1.PickResponse_NoRunnable:
			d, err := call.onNoRunnable(ctx, actx)
			if err != nil {
				return last, call.abandon(ctx, err)
			}
			switch n := d.GetDecision().(type) {
			case *admissionv1.OnNoRunnableResponse_Failure:
				return last, call.failure(n.Failure, r.NoRunnable.GetPerSourceReasons())
			case *admissionv1.OnNoRunnableResponse_Wait:
				call.spans.waited(n.Wait.GetSleep().AsDuration(), r.NoRunnable.GetPerSourceReasons())
				if err := sleep(ctx, n.Wait.GetSleep().AsDuration()); err != nil {
					return last, call.abandon(ctx, err)
				}
			default:
				return last, call.abandon(ctx, fmt.Errorf("polygate: OnNoRunnable of call %s answered no decision", call.id))
			}
		case *admissionv1.PickResponse_Failure:
			return last, call.failure(r.Failure, nil)
		default:
			return last, call.abandon(ctx, fmt.Errorf("polygate: Pick of call %s answered no result", call.id))
		}
		pick, err = call.pick(ctx, actx, &admissionv1.PickRequest{Scope: scope, CallId: call.id})
		if err != nil {
			return last, call.abandon(ctx, err)
		}
	}
}

// deadlineFrom is the call's deadline: the earliest of the context's and the
// options'; ok is false when there is none.
func (cfg callConfig) deadlineFrom(ctx context.Context, now time.Time) (deadline time.Time, ok bool) {
	earliest := func(t time.Time) {
		if !ok || t.Before(deadline) {
			deadline, ok = t, true
		}
	}
	if t, has := ctx.Deadline(); has {
		earliest(t)
	}
	if cfg.timeout != nil {
		earliest(now.Add(*cfg.timeout))
	}
	if cfg.deadline != nil {
		earliest(*cfg.deadline)
	}
	return deadline, ok
}

// callState is one Do's call.
type callState struct {
	c        *Client
	scope    string
	id       string
	attempts int
	last     *Result
	spans    *callSpans

	end    time.Time // the call's deadline, when hasEnd
	hasEnd bool

	lastAttempt Attempt // the grant of the last attempt
}

// attempt runs fn under the grant and reports its result. It is a function,
// not a method, because methods cannot have type parameters.
func attempt[T any](ctx context.Context, s *callState, pg *admissionv1.Grant, fn func(context.Context, Attempt) (T, Result)) (T, *admissionv1.RecordOutcomeResponse, error) {
	a := Attempt{
		CallID: s.id, Source: pg.GetSource(), Attributes: pg.GetAttributes(), Number: int(pg.GetAttempt()),
		Probe: pg.GetProbe(), Timeout: pg.GetTimeout().AsDuration(), PermitID: pg.GetPermitId(),
	}
	s.attempts++
	s.lastAttempt = a
	value, res := run(ctx, s, a, fn)
	s.last = &res
	// On an error, do ends the call with CancelCall, which settles the
	// permit as CANCELLED.
	if res.Outcome != Success && ctx.Err() != nil {
		return value, nil, ctx.Err()
	}
	if _, ok := outcomeProto[res.Outcome]; !ok {
		return value, nil, fmt.Errorf("polygate: the attempt on source %s of call %s returned no outcome (%v)", a.Source, s.id, res.Outcome)
	}
	req := &admissionv1.RecordOutcomeRequest{
		Scope: s.scope, CallId: s.id, PermitId: a.PermitID, Outcome: outcomeProto[res.Outcome],
		ActualTokens: res.ActualTokens, Detail: truncate(res.Detail, maxDetail),
	}
	if res.RetryAfter > 0 {
		req.RetryAfterHint = durationpb.New(min(res.RetryAfter, MaxRetryHint))
	}
	if res.HTTPStatus >= 100 && res.HTTPStatus <= 599 {
		req.HttpStatus = int32(res.HTTPStatus)
	}
	if req.ActualTokens != nil && *req.ActualTokens < 0 {
		req.ActualTokens = nil
	}
	var rctx context.Context
	var stop context.CancelFunc
	if ctx.Err() != nil { // a SUCCESS reported after the caller gave up
		rctx, stop = context.WithTimeout(context.WithoutCancel(ctx), cancelReport)
	} else if s.hasEnd { // a report must settle the permit, deadline or not
		rctx, stop = context.WithDeadline(ctx, later(s.end, time.Now().Add(cancelReport)))
	} else {
		rctx, stop = ctx, func() {}
	}
	defer stop()
	next, err := s.c.rpc.RecordOutcome(rctx, req, s.c.call...)
	if err != nil {
		return value, nil, s.rpcFailed(ctx, "RecordOutcome", err)
	}
	return value, next, nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// pick sends a Pick of the call on actx (the attempt's span), bounded by the
// call's deadline plus rpcGrace; ctx is the caller's.
func (s *callState) pick(ctx, actx context.Context, req *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	rctx, stop, err := s.rpcContext(actx)
	if err != nil {
		return nil, err
	}
	defer stop()
	pick, err := s.c.rpc.Pick(rctx, req, s.c.call...)
	if err != nil {
		return nil, s.rpcFailed(ctx, "Pick", err)
	}
	return pick, nil
}

// onNoRunnable is pick for an OnNoRunnable.
func (s *callState) onNoRunnable(ctx, actx context.Context) (*admissionv1.OnNoRunnableResponse, error) {
	rctx, stop, err := s.rpcContext(actx)
	if err != nil {
		return nil, err
	}
	defer stop()
	d, err := s.c.rpc.OnNoRunnable(rctx, &admissionv1.OnNoRunnableRequest{Scope: s.scope, CallId: s.id}, s.c.call...)
	if err != nil {
		return nil, s.rpcFailed(ctx, "OnNoRunnable", err)
	}
	return d, nil
}

// rpcContext bounds a Pick or an OnNoRunnable by the call's deadline plus
// rpcGrace; past the deadline there is no RPC to send, and the error is the
// deadline's verdict.
func (s *callState) rpcContext(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if !s.hasEnd {
		return ctx, func() {}, nil
	}
	if !time.Now().Before(s.end) {
		return nil, nil, s.deadlineExceeded()
	}
	rctx, stop := context.WithDeadline(ctx, s.end.Add(rpcGrace))
	return rctx, stop, nil
}

// rpcFailed is the error of an RPC of the call: ctx's (the caller's) when it
// ended; the deadline's verdict when the call's deadline passed (the RPC's
// own bound, or the sidecar's DEADLINE_EXCEEDED); else the sidecar's.
func (s *callState) rpcFailed(ctx context.Context, op string, err error) error {
	if ctx.Err() == nil && s.hasEnd && (status.Code(err) == codes.DeadlineExceeded || !time.Now().Before(s.end)) {
		return s.deadlineExceeded()
	}
	return rpcError(ctx, op, err)
}

// deadlineExceeded is the verdict the SDK gives itself when the call's
// deadline passed without the sidecar's: do ends the call with CancelCall,
// since the sidecar did not end it.
func (s *callState) deadlineExceeded() error {
	return &FailureError{Scope: s.scope, CallID: s.id, Reason: DeadlineExceeded, Attempts: s.attempts, Last: s.last}
}

// run calls fn with the attempt's context; a panic in fn ends the call in
// the sidecar (which releases the permit) before it goes on.
func run[T any](ctx context.Context, s *callState, a Attempt, fn func(context.Context, Attempt) (T, Result)) (T, Result) {
	actx, stop := ctx, context.CancelFunc(func() {})
	if a.Timeout > 0 {
		actx, stop = context.WithTimeout(ctx, a.Timeout)
	}
	defer stop()
	settled := false
	defer func() {
		if !settled {
			s.abandon(ctx, nil)
		}
	}()
	value, res := fn(actx, a)
	settled = true
	return value, res
}

// abandon ends the call in the sidecar when Do gives up on it without the
// sidecar's verdict (its context ended, an RPC failed, the deadline passed
// unanswered, fn panicked), so that it stops counting as live there, and
// returns err. CancelCall settles a permit still held as
// CANCELLED and is a no-op for an ended call; it runs on a short context
// detached from ctx.
func (s *callState) abandon(ctx context.Context, err error) error {
	rctx, stop := context.WithTimeout(context.WithoutCancel(ctx), cancelReport)
	defer stop()
	_, _ = s.c.rpc.CancelCall(rctx, &admissionv1.CancelCallRequest{Scope: s.scope, CallId: s.id}, s.c.call...)
	return err
}

// failure builds the verdict; refused are the per-source reasons of the last
// NoRunnable, used when the failure carries none.
func (s *callState) failure(f *admissionv1.Failure, refused []*admissionv1.SourceReason) error {
	e := &FailureError{
		Scope: s.scope, CallID: s.id, Reason: failureFromProto[f.GetReason()],
		RetryAfter: f.GetRetryAfter().AsDuration(), Attempts: s.attempts, Last: s.last,
	}
	reasons := f.GetPerSourceReasons()
	if len(reasons) == 0 {
		reasons = refused
	}
	for _, r := range reasons {
		e.PerSource = append(e.PerSource, SourceReason{
			Source: r.GetSource(), Reason: refusalName(r.GetReason()), RetryAfter: r.GetRetryAfter().AsDuration(),
		})
	}
	return e
}

var refusalNames = map[admissionv1.Reason]string{
	admissionv1.Reason_REASON_COOLDOWN:        "cooldown",
	admissionv1.Reason_REASON_CIRCUIT_OPEN:    "circuit_open",
	admissionv1.Reason_REASON_PROBE_IN_FLIGHT: "probe_in_flight",
	admissionv1.Reason_REASON_FORCED_OPEN:     "forced_open",
	admissionv1.Reason_REASON_ADAPTIVE_PACED:  "adaptive_paced",
	admissionv1.Reason_REASON_RATE_LIMITED:    "rate_limited",
	admissionv1.Reason_REASON_QUEUED:          "queued",
	admissionv1.Reason_REASON_TENANT_LIMIT:    "tenant_limit",
	admissionv1.Reason_REASON_TENANT_BUDGET:   "tenant_budget",
}

func refusalName(r admissionv1.Reason) string {
	if s, ok := refusalNames[r]; ok {
		return s
	}
	return r.String()
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// truncate cuts s to at most n bytes without splitting a rune.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
