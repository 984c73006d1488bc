package e2e

// The Go SDK's behaviour against the real sidecar: cancellation at every
// stage, panics, verdicts and gRPC errors, deadlines, token and unix socket.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	polygate "github.com/polygate/polygate/clientsdk/go"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
)

// oneSlot is a single-source scope with one concurrency slot and a long
// lease, so that a permit that is not released blocks everyone for minutes.
const oneSlot = `
scopes:
  one:
    quota_full: wait
    backoff: {base: 30s, max: 60s}
    backpressure: {stall_window: 60s, poll_interval: 10s}
    sources:
      - name: only
        max_concurrency: 1
        timeout: 120s
`

// rpcLog is a client interceptor that records each RPC and signals when one
// starts or ends.
type rpcLog struct {
	mu      sync.Mutex
	calls   []string
	outcome []admissionv1.Outcome
	hints   []time.Duration    // of the RecordOutcome requests
	ends    map[int]codes.Code // how each RPC ended, by its index in calls
	started chan string
	ended   chan string
}

func newRPCLog() *rpcLog {
	return &rpcLog{started: make(chan string, 100), ended: make(chan string, 100)}
}

func (l *rpcLog) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	name := method[len("/polygate.admission.v1.AdmissionService/"):]
	l.mu.Lock()
	l.calls = append(l.calls, name)
	i := len(l.calls) - 1
	if r, ok := req.(*admissionv1.RecordOutcomeRequest); ok {
		l.outcome = append(l.outcome, r.GetOutcome())
		l.hints = append(l.hints, r.GetRetryAfterHint().AsDuration())
	}
	l.mu.Unlock()
	l.started <- name
	err := invoker(ctx, method, req, reply, cc, opts...)
	l.mu.Lock()
	if l.ends == nil {
		l.ends = make(map[int]codes.Code)
	}
	l.ends[i] = status.Code(err)
	l.mu.Unlock()
	l.ended <- name
	return err
}

// endsOf is how each RPC named name ended, in order.
func (l *rpcLog) endsOf(name string) []codes.Code {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []codes.Code
	for i, c := range l.calls {
		if end, ok := l.ends[i]; ok && c == name {
			out = append(out, end)
		}
	}
	return out
}

func (l *rpcLog) outcomes() []admissionv1.Outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]admissionv1.Outcome(nil), l.outcome...)
}

// waitFor reads ch until it yields name.
func waitFor(t *testing.T, ch chan string, name string) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case got := <-ch:
			if got == name {
				return
			}
		case <-deadline:
			t.Fatalf("no %s RPC within %v", name, timeout)
		}
	}
}

type sdkFixture struct {
	addr   string
	client *polygate.Client
	raw    admissionv1.AdmissionServiceClient
	log    *rpcLog
}

// setupSDK starts a sidecar with config and a client whose RPCs are logged.
func setupSDK(t *testing.T, config string, opts ...polygate.Option) *sdkFixture {
	t.Helper()
	addr := startSidecar(t, config).addr
	log := newRPCLog()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(log.intercept))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &sdkFixture{addr: addr, client: polygate.New(conn, opts...), raw: admissionv1.NewAdmissionServiceClient(conn), log: log}
}

// inFlight reads the permits a source holds from DescribeScope.
func (f *sdkFixture) inFlight(t *testing.T, scope string) int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d, err := f.raw.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, s := range d.GetScope().GetSources() {
		n += s.GetInFlight()
	}
	return n
}

// liveCalls is the number of calls the sidecar holds open in scope.
func (f *sdkFixture) liveCalls(t *testing.T, scope string) int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d, err := f.raw.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	return d.GetScope().GetLiveCalls()
}

func (l *rpcLog) sent(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.calls {
		if c == name {
			return true
		}
	}
	return false
}

// admittedAtOnce opens a new call with a raw Pick and reports whether its
// first Pick is a grant, settling it again.
func (f *sdkFixture) admittedAtOnce(t *testing.T, scope string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	p, err := f.raw.Pick(ctx, &admissionv1.PickRequest{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	g := p.GetGrant()
	if g == nil {
		return false
	}
	_, err = f.raw.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: scope, CallId: p.GetCallId(), PermitId: g.GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// The caller's cancellation ends the call with CancelCall alone: the
// sidecar settles the permit it holds as CANCELLED, so no RecordOutcome.
func TestDo_CancelDuringAttemptEndsTheCallAndReleasesPermit(t *testing.T) {
	f := setupSDK(t, oneSlot)
	ctx, cancel := context.WithCancel(context.Background())
	inAttempt := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := polygate.Do(ctx, f.client, "one", func(ctx context.Context, g polygate.Attempt) (struct{}, polygate.Result) {
			close(inAttempt)
			<-ctx.Done() // a hung upstream request, abandoned with its context
			return struct{}{}, polygate.ResultOf(nil, nil, ctx.Err())
		})
		done <- err
	}()
	<-inAttempt
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v; want context.Canceled", err)
		}
	case <-time.After(timeout):
		t.Fatal("Do did not return after its context was cancelled")
	}
	f.log.mu.Lock()
	calls := slices.Clone(f.log.calls)
	f.log.mu.Unlock()
	if !slices.Equal(calls, []string{"Pick", "CancelCall"}) {
		t.Errorf("RPCs %v; want Pick, then CancelCall alone", calls)
	}
	if n := f.inFlight(t, "one"); n != 0 {
		t.Errorf("in_flight = %d after the cancelled call returned; want 0", n)
	}
	if !f.admittedAtOnce(t, "one") {
		t.Error("the next caller was not admitted at once: the cancelled call kept its permit")
	}
}

func TestDo_CancelDuringBackoffReturnsWithoutReport(t *testing.T) {
	f := setupSDK(t, oneSlot)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := polygate.Do(ctx, f.client, "one", func(context.Context, polygate.Attempt) (int, polygate.Result) {
			return 503, polygate.Result{Outcome: polygate.Transient, HTTPStatus: 503} // backoff base is 30s
		})
		done <- err
	}()
	waitFor(t, f.log.ended, "RecordOutcome") // the SDK now sleeps the backoff
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v; want context.Canceled", err)
		}
	case <-time.After(timeout):
		t.Fatal("Do slept through the cancellation")
	}
	if got := f.log.outcomes(); len(got) != 1 || got[0] != admissionv1.Outcome_OUTCOME_TRANSIENT {
		t.Errorf("reported outcomes %v; want only the attempt's TRANSIENT (no permit is held while sleeping)", got)
	}
	if n := f.inFlight(t, "one"); n != 0 {
		t.Errorf("in_flight = %d; want 0", n)
	}
	if !f.log.sent("CancelCall") || f.liveCalls(t, "one") != 0 {
		t.Errorf("the abandoned call is still live in the sidecar (CancelCall sent: %v)", f.log.sent("CancelCall"))
	}
}

func TestDo_CancelDuringOnNoRunnableReturnsAtOnce(t *testing.T) {
	f := setupSDK(t, oneSlot)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// Another caller holds the only slot, so Do's Pick is refused and the
	// sidecar makes OnNoRunnable wait (poll_interval is 10s).
	held, err := f.raw.Pick(ctx, &admissionv1.PickRequest{Scope: "one"})
	if err != nil || held.GetGrant() == nil {
		t.Fatalf("holding the slot: %v %v", held, err)
	}
	callCtx, cancelCall := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := polygate.Do(callCtx, f.client, "one", func(context.Context, polygate.Attempt) (int, polygate.Result) {
			t.Error("the attempt ran although the slot was held")
			return 0, polygate.Result{Outcome: polygate.Success}
		})
		done <- err
	}()
	waitFor(t, f.log.started, "OnNoRunnable")
	cancelCall()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v; want context.Canceled", err)
		}
	case <-time.After(timeout):
		t.Fatal("Do waited out the sidecar's sleep after its context was cancelled")
	}
	// The sidecar holds the caller until the slot frees (the holder never
	// releases it) or the 60s stall budget ends: an OnNoRunnable that ended
	// CANCELLED on the client was abandoned, not waited out (that one would
	// have ended OK with the sidecar's answer).
	if got := f.log.endsOf("OnNoRunnable"); len(got) != 1 || got[0] != codes.Canceled {
		t.Errorf("OnNoRunnable ended %v; want one RPC, abandoned with CANCELLED", got)
	}
	if got := f.log.outcomes(); len(got) != 0 {
		t.Errorf("reported outcomes %v; want none (no permit was held)", got)
	}
	if !f.log.sent("CancelCall") || f.liveCalls(t, "one") != 1 {
		t.Errorf("the abandoned call is still live in the sidecar (CancelCall sent: %v); only the holder should be", f.log.sent("CancelCall"))
	}
}

func TestDo_SuccessAfterCancellationIsReportedAsSuccess(t *testing.T) {
	f := setupSDK(t, oneSlot)
	ctx, cancel := context.WithCancel(context.Background())
	got, err := polygate.Do(ctx, f.client, "one", func(context.Context, polygate.Attempt) (string, polygate.Result) {
		cancel() // the caller gives up just as the upstream answered
		return "answer", polygate.Result{Outcome: polygate.Success, HTTPStatus: 200}
	})
	if err != nil || got != "answer" {
		t.Fatalf("Do = %q, %v; want the answer and nil: the attempt succeeded", got, err)
	}
	if got := f.log.outcomes(); len(got) != 1 || got[0] != admissionv1.Outcome_OUTCOME_SUCCESS {
		t.Errorf("reported outcomes %v; want one SUCCESS", got)
	}
}

func TestDo_PanicInAttemptEndsTheCallAndReleasesPermit(t *testing.T) {
	f := setupSDK(t, oneSlot)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the attempt's panic was swallowed")
			}
		}()
		_, _ = polygate.Do(context.Background(), f.client, "one", func(context.Context, polygate.Attempt) (int, polygate.Result) {
			panic("bug in the application")
		})
	}()
	if got := f.log.outcomes(); len(got) != 0 || !f.log.sent("CancelCall") {
		t.Errorf("reported outcomes %v, CancelCall sent: %v; want CancelCall alone", got, f.log.sent("CancelCall"))
	}
	if !f.admittedAtOnce(t, "one") {
		t.Error("the panicking call kept its permit")
	}
}

func TestDo_AttemptWithoutOutcomeIsAnError(t *testing.T) {
	f := setupSDK(t, oneSlot)
	_, err := polygate.Do(context.Background(), f.client, "one", func(context.Context, polygate.Attempt) (int, polygate.Result) {
		return 0, polygate.Result{}
	})
	if err == nil {
		t.Fatal("Do = nil for an attempt that reported no outcome")
	}
	if !f.admittedAtOnce(t, "one") {
		t.Error("the call kept its permit")
	}
}

func TestDo_VerdictsAreTypedErrors(t *testing.T) {
	f := setupSDK(t, `
scopes:
  nr:
    sources: [{name: only}]
  exhausted:
    max_attempts: 2
    backoff: {base: 1ms, max: 1ms}
    breaker: {fail_threshold: 10}
    sources: [{name: only}]
`)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tests := []struct {
		scope    string
		outcome  polygate.Outcome
		reason   polygate.FailureReason
		sentinel error
		attempts int
	}{
		{"nr", polygate.ClientError, polygate.NonRetryable, polygate.ErrNonRetryable, 1},
		{"exhausted", polygate.Transient, polygate.RetryExhausted, polygate.ErrRetryExhausted, 2},
	}
	for _, tt := range tests {
		t.Run(tt.scope, func(t *testing.T) {
			calls := 0
			last, err := polygate.Do(ctx, f.client, tt.scope, func(_ context.Context, a polygate.Attempt) (int, polygate.Result) {
				calls++
				return a.Number, polygate.Result{Outcome: tt.outcome, HTTPStatus: 400}
			})
			if last != calls || last != tt.attempts {
				t.Errorf("Do's value = %d; want the last attempt's (%d of %d)", last, calls, tt.attempts)
			}
			var fe *polygate.FailureError
			if !errors.As(err, &fe) || fe.Reason != tt.reason || !errors.Is(err, tt.sentinel) || fe.Attempts != tt.attempts {
				t.Fatalf("Do = %#v; want a FailureError %v after %d attempts", err, tt.reason, tt.attempts)
			}
			if fe.Scope != tt.scope || fe.CallID == "" || fe.Last == nil || fe.Last.Outcome != tt.outcome {
				t.Errorf("FailureError = %+v; want scope, call id and the last result", fe)
			}
			if errors.Is(err, polygate.ErrAllSourcesExhausted) {
				t.Errorf("%v matches ErrAllSourcesExhausted", tt.reason)
			}
		})
	}
}

func TestDo_StatusErrorsKeepCodeAndReason(t *testing.T) {
	f := setupSDK(t, `
auth: {token: s3cret}
scopes:
  chat:
    sources: [{name: only, tpm: 100}]
`, polygate.WithToken("s3cret"))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	wrong := polygate.New(grpcConn(t, f.addr), polygate.WithToken("wrong"))
	never := func(context.Context, polygate.Attempt) (int, polygate.Result) {
		t.Error("attempt ran")
		return 0, polygate.Result{Outcome: polygate.Success}
	}
	tests := []struct {
		name     string
		client   *polygate.Client
		scope    string
		opts     []polygate.CallOption
		code     codes.Code
		reason   string
		field    string
		sentinel error
	}{
		{"unknown scope", f.client, "nope", nil, codes.NotFound, "ERROR_REASON_UNKNOWN_SCOPE", "", polygate.ErrNotFound},
		{"wrong token", wrong, "chat", nil, codes.Unauthenticated, "ERROR_REASON_UNAUTHENTICATED", "", polygate.ErrUnauthenticated},
		{"negative estimate", f.client, "chat", []polygate.CallOption{polygate.WithEstimatedTokens(-1)}, codes.InvalidArgument, "ERROR_REASON_INVALID_FIELD", "estimated_tokens", polygate.ErrInvalidArgument},
		{"estimate above tpm", f.client, "chat", []polygate.CallOption{polygate.WithEstimatedTokens(1000)}, codes.InvalidArgument, "ERROR_REASON_ESTIMATE_TOO_LARGE", "estimated_tokens", polygate.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := polygate.Do(ctx, tt.client, tt.scope, never, tt.opts...)
			var se *polygate.StatusError
			if !errors.As(err, &se) {
				t.Fatalf("Do = %v; want a *StatusError", err)
			}
			if se.Code != tt.code || se.Reason != tt.reason || se.Metadata["field"] != tt.field || se.Op != "Pick" {
				t.Errorf("StatusError = %+v; want %v %s field %q", se, tt.code, tt.reason, tt.field)
			}
			if !errors.Is(err, tt.sentinel) || status.Code(err) != tt.code {
				t.Errorf("errors.Is(%v, %v) = false or status.Code = %v", err, tt.sentinel, status.Code(err))
			}
		})
	}
	if _, err := polygate.Do(ctx, f.client, "chat", func(context.Context, polygate.Attempt) (int, polygate.Result) {
		return 0, polygate.Result{Outcome: polygate.Success}
	}); err != nil {
		t.Errorf("Do with the right token = %v", err)
	}
}

func grpcConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestDo_DeadlineIsSentFromContextOrOption(t *testing.T) {
	f := setupSDK(t, oneSlot)
	var got []time.Duration
	var mu sync.Mutex
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if p, ok := req.(*admissionv1.PickRequest); ok && p.GetCallId() == "" {
				mu.Lock()
				got = append(got, p.GetDeadline().AsDuration())
				mu.Unlock()
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := polygate.New(conn)
	ok := func(context.Context, polygate.Attempt) (int, polygate.Result) {
		return 0, polygate.Result{Outcome: polygate.Success}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, opts := range [][]polygate.CallOption{
		nil,
		{polygate.WithTimeout(5 * time.Second)},
		{polygate.WithTimeout(time.Hour)},
		{polygate.WithDeadline(time.Now().Add(3 * time.Second))},
	} {
		if _, err := polygate.Do(ctx, c, "one", ok, opts...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := polygate.Do(context.Background(), c, "one", ok); err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 {
		t.Fatalf("saw %d opening Picks; want 5", len(got))
	}
	if !(got[0] > 0 && got[0] <= 20*time.Second) || !(got[1] > 0 && got[1] <= 5*time.Second) ||
		!(got[2] > 5*time.Second && got[2] <= 20*time.Second) || !(got[3] > 0 && got[3] <= 3*time.Second) || got[4] != 0 {
		t.Errorf("deadlines sent %v; want ≤20s (context), ≤5s (WithTimeout), ≤20s (the earlier), ≤3s (WithDeadline), 0 (none)", got)
	}
	for _, opt := range []polygate.CallOption{polygate.WithTimeout(0), polygate.WithDeadline(time.Now().Add(-time.Second))} {
		if _, err := polygate.Do(ctx, c, "one", ok, opt); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Do with no time left = %v; want context.DeadlineExceeded", err)
		}
	}
}

func TestDial_UnixSocket(t *testing.T) {
	dir := t.TempDir()
	sock, file := filepath.Join(dir, "polygate.sock"), filepath.Join(dir, "polygate.yaml")
	if err := os.WriteFile(file, []byte(oneSlot), 0o600); err != nil {
		t.Fatal(err)
	}
	sidecartest.Start(t, []string{"--config", file, "--listen", "unix://" + sock})
	c, err := polygate.Dial("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	source, err := polygate.Do(ctx, c, "one", func(_ context.Context, g polygate.Attempt) (string, polygate.Result) {
		return g.Source, polygate.Result{Outcome: polygate.Success, ActualTokens: polygate.Tokens(3)}
	})
	if err != nil || source != "only" {
		t.Fatalf("Do over %s = %v (source %q)", sock, err, source)
	}
}

// A hint the application sets itself (not through Classify) is sent capped
// at MaxRetryHint: 100 years never reach the sidecar.
func TestDo_HintIsSentCapped(t *testing.T) {
	f := setupSDK(t, oneSlot)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := polygate.Do(ctx, f.client, "one", func(context.Context, polygate.Attempt) (int, polygate.Result) {
			return 0, polygate.Result{Outcome: polygate.RateLimited, HTTPStatus: 429, RetryAfter: 100 * 365 * 24 * time.Hour}
		})
		done <- err
	}()
	waitFor(t, f.log.ended, "RecordOutcome")
	cancel()
	<-done
	f.log.mu.Lock()
	defer f.log.mu.Unlock()
	if len(f.log.hints) == 0 || f.log.hints[0] != polygate.MaxRetryHint {
		t.Errorf("hints sent %v; want the first %v", f.log.hints, polygate.MaxRetryHint)
	}
}
