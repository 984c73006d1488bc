package polygate

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// cancelReport bounds the CANCELLED report sent after the caller's context
// ended; it runs on a context detached from the caller's.
const cancelReport = 2 * time.Second

// maxDetail is the sidecar's limit on RecordOutcomeRequest.detail.
const maxDetail = 1024

// Client asks a polygate sidecar for admission. It is safe for concurrent use.
type Client struct {
	rpc   admissionv1.AdmissionServiceClient
	conn  *grpc.ClientConn // nil when the connection is the caller's
	token string
}

// Option configures a Client.
type Option func(*clientConfig)

type clientConfig struct {
	token string
	dial  []grpc.DialOption
}

// WithToken sends "authorization: Bearer token" with every call, for a
// sidecar configured with auth.token.
func WithToken(token string) Option { return func(c *clientConfig) { c.token = token } }

// WithDialOptions adds gRPC dial options (Dial only); without transport
// credentials among them the connection is plaintext, as a sidecar on the
// same host or pod usually is.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *clientConfig) { c.dial = append(c.dial, opts...) }
}

// Dial returns a client of the sidecar at target: "host:port" or
// "unix:///path/to/socket". It does not wait for the connection.
func Dial(target string, opts ...Option) (*Client, error) {
	cfg := configure(opts)
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cfg.dial...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("polygate: dial sidecar %q: %w", target, err)
	}
	return &Client{rpc: admissionv1.NewAdmissionServiceClient(conn), conn: conn, token: cfg.token}, nil
}

// New returns a client over a connection the caller owns (Close leaves it open).
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	cfg := configure(opts)
	return &Client{rpc: admissionv1.NewAdmissionServiceClient(conn), token: cfg.token}
}

func configure(opts []Option) clientConfig {
	var cfg clientConfig
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// Close closes the connection Dial opened.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// CallOption configures one Do.
type CallOption func(*callConfig)

type callConfig struct {
	tokens   int64
	deadline time.Duration
}

// WithEstimatedTokens charges n tokens to the TPM limit of each attempt's
// source, settled by Result.ActualTokens.
func WithEstimatedTokens(n int64) CallOption { return func(c *callConfig) { c.tokens = n } }

// WithDeadline gives the call a budget of d from now, capping every wait of
// the sidecar. Without it the budget is the context's deadline, if any; with
// both, the earlier wins.
func WithDeadline(d time.Duration) CallOption { return func(c *callConfig) { c.deadline = d } }

// Do runs one call of scope: it asks the sidecar for a source, runs fn for
// the attempt, reports fn's Result, and does what the sidecar answers (done,
// retry after a backoff, wait, or fail) until the call ends. It returns nil
// once an attempt succeeded, a *FailureError for the sidecar's verdict, a
// *StatusError for a gRPC error of the sidecar, or the context's error.
//
// fn gets a context that ends with ctx or after the source's timeout. When
// ctx ends while an attempt holds a permit, Do reports CANCELLED for it (so
// its slot is free at once) and returns ctx's error without waiting for
// anything else; a Result of SUCCESS is still reported as such.
func (c *Client) Do(ctx context.Context, scope string, fn func(ctx context.Context, g Grant) Result, opts ...CallOption) error {
	var cfg callConfig
	for _, o := range opts {
		o(&cfg)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx = c.authorize(ctx)
	req := &admissionv1.PickRequest{Scope: scope, EstimatedTokens: cfg.tokens}
	budget := cfg.deadline
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); budget <= 0 || left < budget {
			budget = left
		}
	}
	if budget > 0 {
		req.Deadline = durationpb.New(budget)
	} else if cfg.deadline != 0 || hasDeadline(ctx) {
		return context.DeadlineExceeded // no time left at all
	}
	pick, err := c.rpc.Pick(ctx, req)
	if err != nil {
		return rpcError(ctx, "Pick", err)
	}
	call := &callState{c: c, scope: scope, id: pick.GetCallId()}
	for {
		switch r := pick.GetResult().(type) {
		case *admissionv1.PickResponse_Grant:
			next, err := call.attempt(ctx, r.Grant, fn)
			if err != nil {
				return call.abandon(ctx, err)
			}
			switch n := next.GetNext().(type) {
			case *admissionv1.RecordOutcomeResponse_Done:
				return nil
			case *admissionv1.RecordOutcomeResponse_Failure:
				return call.failure(n.Failure, nil)
			case *admissionv1.RecordOutcomeResponse_Retry:
				if err := sleep(ctx, n.Retry.GetBackoff().AsDuration()); err != nil {
					return call.abandon(ctx, err)
				}
			default:
				return fmt.Errorf("polygate: RecordOutcome of call %s answered no next action", call.id)
			}
		case *admissionv1.PickResponse_NoRunnable:
			d, err := c.rpc.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: scope, CallId: call.id})
			if err != nil {
				return call.abandon(ctx, rpcError(ctx, "OnNoRunnable", err))
			}
			switch n := d.GetDecision().(type) {
			case *admissionv1.OnNoRunnableResponse_Failure:
				return call.failure(n.Failure, r.NoRunnable.GetPerSourceReasons())
			case *admissionv1.OnNoRunnableResponse_Wait:
				if err := sleep(ctx, n.Wait.GetSleep().AsDuration()); err != nil {
					return call.abandon(ctx, err)
				}
			default:
				return fmt.Errorf("polygate: OnNoRunnable of call %s answered no decision", call.id)
			}
		case *admissionv1.PickResponse_Failure:
			return call.failure(r.Failure, nil)
		default:
			return fmt.Errorf("polygate: Pick of call %s answered no result", call.id)
		}
		pick, err = c.rpc.Pick(ctx, &admissionv1.PickRequest{Scope: scope, CallId: call.id})
		if err != nil {
			return call.abandon(ctx, rpcError(ctx, "Pick", err))
		}
	}
}

func hasDeadline(ctx context.Context) bool {
	_, ok := ctx.Deadline()
	return ok
}

func (c *Client) authorize(ctx context.Context) context.Context {
	if c.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
}

// callState is one Do's call.
type callState struct {
	c        *Client
	scope    string
	id       string
	attempts int
	last     *Result
}

// attempt runs fn under the grant and reports its result.
func (s *callState) attempt(ctx context.Context, pg *admissionv1.Grant, fn func(context.Context, Grant) Result) (*admissionv1.RecordOutcomeResponse, error) {
	g := Grant{
		CallID: s.id, Source: pg.GetSource(), Attributes: pg.GetAttributes(), Attempt: int(pg.GetAttempt()),
		Probe: pg.GetProbe(), Timeout: pg.GetTimeout().AsDuration(), PermitID: pg.GetPermitId(),
	}
	s.attempts++
	res := s.run(ctx, g, fn)
	s.last = &res
	if res.Outcome != Success && ctx.Err() != nil {
		s.cancel(ctx, g.PermitID)
		return nil, ctx.Err()
	}
	if _, ok := outcomeProto[res.Outcome]; !ok {
		s.cancel(ctx, g.PermitID)
		return nil, fmt.Errorf("polygate: the attempt on source %s of call %s returned no outcome (%v)", g.Source, s.id, res.Outcome)
	}
	req := &admissionv1.RecordOutcomeRequest{
		Scope: s.scope, CallId: s.id, PermitId: g.PermitID, Outcome: outcomeProto[res.Outcome],
		ActualTokens: res.ActualTokens, Detail: truncate(res.Detail, maxDetail),
	}
	if res.RetryAfter > 0 {
		req.RetryAfterHint = durationpb.New(res.RetryAfter)
	}
	if res.HTTPStatus >= 100 && res.HTTPStatus <= 599 {
		req.HttpStatus = int32(res.HTTPStatus)
	}
	if req.ActualTokens != nil && *req.ActualTokens < 0 {
		req.ActualTokens = nil
	}
	rctx := ctx
	if ctx.Err() != nil { // a SUCCESS reported after the caller gave up
		var stop context.CancelFunc
		rctx, stop = context.WithTimeout(context.WithoutCancel(ctx), cancelReport)
		defer stop()
	}
	next, err := s.c.rpc.RecordOutcome(rctx, req)
	if err != nil {
		if ctx.Err() != nil {
			// The report may or may not have landed; RecordOutcome is
			// idempotent per permit, so this settles it either way.
			s.cancel(ctx, g.PermitID)
		}
		return nil, rpcError(rctx, "RecordOutcome", err)
	}
	return next, nil
}

// run calls fn with the attempt's context; a panic in fn releases the permit
// before it goes on.
func (s *callState) run(ctx context.Context, g Grant, fn func(context.Context, Grant) Result) Result {
	actx, stop := ctx, context.CancelFunc(func() {})
	if g.Timeout > 0 {
		actx, stop = context.WithTimeout(ctx, g.Timeout)
	}
	defer stop()
	settled := false
	defer func() {
		if !settled {
			s.cancel(ctx, g.PermitID)
		}
	}()
	res := fn(actx, g)
	settled = true
	return res
}

// cancel reports CANCELLED for a permit on a short context detached from
// the caller's, so that the permit's slot is free at once.
func (s *callState) cancel(ctx context.Context, permit string) {
	rctx, stop := context.WithTimeout(context.WithoutCancel(ctx), cancelReport)
	defer stop()
	_, _ = s.c.rpc.RecordOutcome(rctx, &admissionv1.RecordOutcomeRequest{
		Scope: s.scope, CallId: s.id, PermitId: permit, Outcome: admissionv1.Outcome_OUTCOME_CANCELLED,
	})
}

// abandon ends the call in the sidecar when Do gives up on it without a
// verdict (its context ended, or an RPC failed), so that it stops counting as
// live there, and returns err. CancelCall settles a permit still held as
// CANCELLED and is a no-op for an ended call; it runs on a short context
// detached from ctx.
func (s *callState) abandon(ctx context.Context, err error) error {
	rctx, stop := context.WithTimeout(context.WithoutCancel(ctx), cancelReport)
	defer stop()
	_, _ = s.c.rpc.CancelCall(rctx, &admissionv1.CancelCallRequest{Scope: s.scope, CallId: s.id})
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
