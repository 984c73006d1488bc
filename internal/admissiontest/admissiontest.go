// Package admissiontest drives an AdmissionService from tests: one line per
// RPC, the test failing on a transport error, so that a test reads as the
// calls an SDK would make.
package admissiontest

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Caller makes the calls of a test on Client, all under Ctx.
type Caller struct {
	Client admissionv1.AdmissionServiceClient
	Ctx    context.Context
}

// Dial connects to a server listening on lis (in memory) and closes the
// connection when the test ends.
func Dial(t testing.TB, lis *bufconn.Listener) admissionv1.AdmissionServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return admissionv1.NewAdmissionServiceClient(conn)
}

// Pick asks for a permit for call and returns the answer, grant or not.
func (c Caller) Pick(t testing.TB, scope, call string, tokens int64) *admissionv1.PickResponse {
	t.Helper()
	resp, err := c.Client.Pick(c.Ctx, &admissionv1.PickRequest{Scope: scope, CallId: call, EstimatedTokens: tokens})
	if err != nil {
		t.Fatalf("Pick: %v", err)
	}
	return resp
}

// Grant is Pick that fails the test unless it is granted.
func (c Caller) Grant(t testing.TB, scope, call string, tokens int64) *admissionv1.PickResponse {
	t.Helper()
	resp := c.Pick(t, scope, call, tokens)
	if resp.GetGrant() == nil {
		t.Fatalf("Pick(%s, %q) refused: %v", scope, call, resp)
	}
	return resp
}

// Outcome is what an attempt reports: its outcome, the HTTP status, the
// upstream's retry-after hint and the tokens it used (nil: not reported).
type Outcome struct {
	Outcome admissionv1.Outcome
	Status  int32
	Hint    time.Duration
	Actual  *int64
}

// Record reports the attempt of the call granted in p.
func (c Caller) Record(t testing.TB, scope string, p *admissionv1.PickResponse, o Outcome) *admissionv1.RecordOutcomeResponse {
	t.Helper()
	req := &admissionv1.RecordOutcomeRequest{
		Scope: scope, CallId: p.GetCallId(), PermitId: p.GetGrant().GetPermitId(), Outcome: o.Outcome,
		HttpStatus: o.Status, ActualTokens: o.Actual,
	}
	if o.Hint > 0 {
		req.RetryAfterHint = durationpb.New(o.Hint)
	}
	resp, err := c.Client.RecordOutcome(c.Ctx, req)
	if err != nil {
		t.Fatalf("RecordOutcome: %v", err)
	}
	return resp
}

// OnNoRunnable asks what call should do now that no source is runnable.
func (c Caller) OnNoRunnable(t testing.TB, scope, call string) *admissionv1.OnNoRunnableResponse {
	t.Helper()
	resp, err := c.Client.OnNoRunnable(c.Ctx, &admissionv1.OnNoRunnableRequest{Scope: scope, CallId: call})
	if err != nil {
		t.Fatalf("OnNoRunnable: %v", err)
	}
	return resp
}

// Override applies an operator override as actor "oncall".
func (c Caller) Override(t testing.TB, scope, source string, a admissionv1.OverrideAction) {
	t.Helper()
	if _, err := c.Client.OverrideBreaker(c.Ctx, &admissionv1.OverrideBreakerRequest{
		Scope: scope, Source: source, Action: a, Actor: "oncall", Reason: "test " + a.String(),
	}); err != nil {
		t.Fatalf("OverrideBreaker: %v", err)
	}
}

// LockedBuffer collects what several goroutines write (logs, output).
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
