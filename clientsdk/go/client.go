package polygate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
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
	rpc  admissionv1.AdmissionServiceClient
	conn *grpc.ClientConn  // nil when the connection is the caller's
	call []grpc.CallOption // sent with every RPC: the token's credentials
	tr   trace.Tracer

	watch *watch // what a call does when the sidecar is unreachable

	priority int32  // every call's, unless WithPriority
	tenant   string // every call's, unless WithTenant
}

// Option configures a Client.
type Option func(*clientConfig)

type clientConfig struct {
	token    string
	tokenSet bool // WithToken was given, even ""
	tls      *tls.Config
	caFile   string
	dial     []grpc.DialOption

	priority int32
	tenant   string

	tracerProvider trace.TracerProvider

	mode      SidecarUnavailable
	fallbacks map[string]Attempt
	logger    *slog.Logger
}

// WithDefaultPriority is every call's priority unless the call sets its own
// (WithPriority); default 0.
func WithDefaultPriority(p int32) Option { return func(c *clientConfig) { c.priority = p } }

// WithDefaultTenant is every call's tenant unless the call sets its own
// (WithTenant); default none (the scope's default tenant).
func WithDefaultTenant(t string) Option { return func(c *clientConfig) { c.tenant = t } }

// WithToken sends "authorization: Bearer token" with every RPC, for a sidecar
// configured with auth.token (or auth.operator_token). Over a plaintext
// connection the token travels in clear: keep plaintext to loopback and unix
// sockets, and use WithTLS or WithTLSCAFile for a sidecar beyond the host.
// Without WithToken the token is $POLYGATE_TOKEN, if set; WithToken("")
// sends none.
func WithToken(token string) Option {
	return func(c *clientConfig) { c.token, c.tokenSet = token, true }
}

// WithTLS makes Dial connect with TLS configured by cfg (server CA, client
// certificate for mTLS, server name). Without WithTLS or WithTLSCAFile the
// connection is plaintext, as a sidecar on the same host or pod usually is.
func WithTLS(cfg *tls.Config) Option { return func(c *clientConfig) { c.tls = cfg } }

// WithTLSCAFile makes Dial connect with TLS, trusting the PEM certificates in
// file (the sidecar's tls.cert_file or its CA) in addition to the system's.
// With WithTLS too, the file's certificates are added to that configuration's
// RootCAs.
func WithTLSCAFile(file string) Option { return func(c *clientConfig) { c.caFile = file } }

// WithDialOptions adds gRPC dial options (Dial only), e.g. interceptors.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *clientConfig) { c.dial = append(c.dial, opts...) }
}

// Dial returns a client of the sidecar at target: "host:port" or
// "unix:///path/to/socket"; "" is $POLYGATE_ADDR. It does not wait for the
// connection.
func Dial(target string, opts ...Option) (*Client, error) {
	cfg := configure(opts)
	if target == "" {
		if target = strings.TrimSpace(os.Getenv(EnvAddr)); target == "" {
			return nil, fmt.Errorf("polygate: Dial needs a target or $%s", EnvAddr)
		}
	}
	if _, err := cfg.modeOf(); err != nil {
		return nil, err
	}
	if err := cfg.tokenError(); err != nil {
		return nil, err
	}
	creds, err := cfg.transportCredentials()
	if err != nil {
		return nil, err
	}
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, cfg.dial...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("polygate: dial sidecar %q: %w", target, err)
	}
	c := New(conn, opts...)
	c.conn = conn
	return c, nil
}

// New returns a client over a connection the caller owns (Close leaves it
// open). The options of the transport (TLS, dial options) do not apply: the
// connection's transport is the caller's. A bad value of
// $POLYGATE_ON_SIDECAR_UNAVAILABLE or $POLYGATE_TOKEN, which Dial returns as
// an error, is logged and ignored.
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	cfg := configure(opts)
	w := newWatch(cfg)
	c := &Client{rpc: admissionv1.NewAdmissionServiceClient(watchedConn{tracedConn{conn}, w}), priority: cfg.priority, tenant: cfg.tenant, tr: cfg.tracer(), watch: w}
	if err := cfg.tokenError(); err != nil {
		w.log.Error(err.Error() + "; no token sent")
	} else if cfg.token != "" {
		c.call = []grpc.CallOption{grpc.PerRPCCredentials(bearer(cfg.token))}
	}
	return c
}

func configure(opts []Option) clientConfig {
	var cfg clientConfig
	for _, o := range opts {
		o(&cfg)
	}
	if !cfg.tokenSet {
		cfg.token = strings.TrimSpace(os.Getenv(EnvToken))
	}
	return cfg
}

// tokenError refuses a token that cannot be a header value.
func (cfg clientConfig) tokenError() error {
	for _, r := range cfg.token {
		if r < 0x21 || r > 0x7e {
			where := "WithToken"
			if !cfg.tokenSet {
				where = "$" + EnvToken
			}
			return fmt.Errorf("polygate: %s: only printable ASCII without spaces is allowed in a bearer token", where)
		}
	}
	return nil
}

// maxCAFile bounds the CA file WithTLSCAFile reads.
const maxCAFile = 1 << 20

func (cfg clientConfig) transportCredentials() (credentials.TransportCredentials, error) {
	if cfg.tls == nil && cfg.caFile == "" {
		return insecure.NewCredentials(), nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.tls != nil {
		tc = cfg.tls.Clone()
	}
	if cfg.caFile != "" {
		pem, err := readBounded(cfg.caFile, maxCAFile)
		if err != nil {
			return nil, fmt.Errorf("polygate: WithTLSCAFile %q: %w", cfg.caFile, err)
		}
		if tc.RootCAs == nil {
			if tc.RootCAs, err = x509.SystemCertPool(); err != nil {
				tc.RootCAs = x509.NewCertPool()
			}
		} else {
			tc.RootCAs = tc.RootCAs.Clone() // the caller's pool stays as it is
		}
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("polygate: WithTLSCAFile %q: no PEM certificate in the file", cfg.caFile)
		}
	}
	return credentials.NewTLS(tc), nil
}

func readBounded(file string, limit int64) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

// bearer is the token's per-RPC credentials. It does not require transport
// security, so that plaintext loopback and unix sockets keep working (see
// WithToken).
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

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
// ctx ends while an attempt holds a permit, Do reports CANCELLED for it (so
// its slot is free at once) and returns ctx's error without waiting for
// anything else; a Result of SUCCESS is still reported as such. A panic in fn
// releases the permit and goes on.
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
		budget := time.Until(deadline)
		if budget <= 0 {
			return last, context.DeadlineExceeded // no time left at all
		}
		req.Deadline = durationpb.New(budget)
	}
	// actx carries the span of the attempt being sought or run: its Picks,
	// waits, fn and report are under it.
	actx := call.spans.startAttempt(ctx, 1)
	pick, err := c.rpc.Pick(actx, req, c.call...)
	if err != nil {
		return last, rpcError(ctx, "Pick", err)
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
				return last, fmt.Errorf("polygate: RecordOutcome of call %s answered no next action", call.id)
			}
			actx = call.spans.startAttempt(ctx, call.attempts+1)
		case *admissionv1.PickResponse_NoRunnable:
			d, err := c.rpc.OnNoRunnable(actx, &admissionv1.OnNoRunnableRequest{Scope: scope, CallId: call.id}, c.call...)
			if err != nil {
				return last, call.abandon(ctx, rpcError(ctx, "OnNoRunnable", err))
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
				return last, fmt.Errorf("polygate: OnNoRunnable of call %s answered no decision", call.id)
			}
		case *admissionv1.PickResponse_Failure:
			return last, call.failure(r.Failure, nil)
		default:
			return last, fmt.Errorf("polygate: Pick of call %s answered no result", call.id)
		}
		pick, err = c.rpc.Pick(actx, &admissionv1.PickRequest{Scope: scope, CallId: call.id}, c.call...)
		if err != nil {
			return last, call.abandon(ctx, rpcError(ctx, "Pick", err))
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
	if res.Outcome != Success && ctx.Err() != nil {
		s.cancel(ctx, a.PermitID)
		return value, nil, ctx.Err()
	}
	if _, ok := outcomeProto[res.Outcome]; !ok {
		s.cancel(ctx, a.PermitID)
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
	rctx := ctx
	if ctx.Err() != nil { // a SUCCESS reported after the caller gave up
		var stop context.CancelFunc
		rctx, stop = context.WithTimeout(context.WithoutCancel(ctx), cancelReport)
		defer stop()
	}
	next, err := s.c.rpc.RecordOutcome(rctx, req, s.c.call...)
	if err != nil {
		if ctx.Err() != nil {
			// The report may or may not have landed; RecordOutcome is
			// idempotent per permit, so this settles it either way.
			s.cancel(ctx, a.PermitID)
		}
		return value, nil, rpcError(rctx, "RecordOutcome", err)
	}
	return value, next, nil
}

// run calls fn with the attempt's context; a panic in fn releases the permit
// before it goes on.
func run[T any](ctx context.Context, s *callState, a Attempt, fn func(context.Context, Attempt) (T, Result)) (T, Result) {
	actx, stop := ctx, context.CancelFunc(func() {})
	if a.Timeout > 0 {
		actx, stop = context.WithTimeout(ctx, a.Timeout)
	}
	defer stop()
	settled := false
	defer func() {
		if !settled {
			s.cancel(ctx, a.PermitID)
		}
	}()
	value, res := fn(actx, a)
	settled = true
	return value, res
}

// cancel reports CANCELLED for a permit on a short context detached from
// the caller's, so that the permit's slot is free at once.
func (s *callState) cancel(ctx context.Context, permit string) {
	rctx, stop := context.WithTimeout(context.WithoutCancel(ctx), cancelReport)
	defer stop()
	_, _ = s.c.rpc.RecordOutcome(rctx, &admissionv1.RecordOutcomeRequest{
		Scope: s.scope, CallId: s.id, PermitId: permit, Outcome: admissionv1.Outcome_OUTCOME_CANCELLED,
	}, s.c.call...)
}

// abandon ends the call in the sidecar when Do gives up on it without a
// verdict (its context ended, or an RPC failed), so that it stops counting as
// live there, and returns err. CancelCall settles a permit still held as
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
