package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testConfig = `
calls: {max_live: 3, idle_timeout: 1m}
scopes:
  chat:
    circuit_open: fail_fast
    breaker: {fail_threshold: 2, cooldown: 10s, probe_ttl: 60s}
    sources:
      - {name: primary, tpm: 1000, timeout: 30s, attributes: {model: m1}}
  other:
    sources: [{name: only, timeout: 30s}]
`

// harnessTimeout bounds every RPC of a harness. Tests that step time run in
// testing/synctest bubbles, where it is fake time: it is longer than any step
// they take (a hung RPC then fails at once, the bubble's clock jumping to the
// deadline); in real time it is short enough to fail a hung test.
const harnessTimeout = 5 * time.Minute

// harness is a server over bufconn with the real interceptor chain.
type harness struct {
	conn   *grpc.ClientConn
	client admissionv1.AdmissionServiceClient
	health healthpb.HealthClient
	srv    *Server
	ctx    context.Context
}

type harnessOpts struct {
	yaml    string
	backend gate.Backend
	token   string
	// operator is auth.operator_token.
	operator string
	// loopback serves on a real TCP port instead of bufconn (benchmarks).
	loopback bool
	// stateLoss is Options.StateLoss.
	stateLoss func(scope string) gate.StateLoss
	// auth, when set, is the whole auth configuration (token and operator
	// are then ignored).
	auth *config.Auth
}

func start(t testing.TB, o harnessOpts) *harness {
	t.Helper()
	if o.yaml == "" {
		o.yaml = testConfig
	}
	cfg, err := config.Parse([]byte(o.yaml), nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.backend == nil {
		o.backend = inmem.New(time.Now)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := New(cfg, o.backend, log, Options{StateLoss: o.stateLoss})
	a := config.Auth{Token: o.token, OperatorToken: o.operator}
	if o.auth != nil {
		a = *o.auth
	}
	gs := grpc.NewServer(append(ServerOptions(log, NewTokens(a), Interceptors{}), append(LimitOptions(cfg.Limits, log), CodecOption())...)...)
	admissionv1.RegisterAdmissionServiceServer(gs, srv)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	var conn *grpc.ClientConn
	if o.loopback {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = gs.Serve(lis) }()
		conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
	} else {
		lis := bufconn.Listen(1 << 20)
		go func() { _ = gs.Serve(lis) }()
		conn, err = grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), harnessTimeout)
	t.Cleanup(func() {
		cancel()
		conn.Close()
		srv.Close()
		gs.Stop()
	})
	return &harness{conn: conn, client: admissionv1.NewAdmissionServiceClient(conn), health: healthpb.NewHealthClient(conn), srv: srv, ctx: ctx}
}

// wantStatus checks an error's code, its ErrorInfo reason and, for
// INVALID_ARGUMENT on a field, the BadRequest field.
func wantStatus(t *testing.T, err error, code codes.Code, reason admissionv1.ErrorReason, field string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Fatalf("error %v, want code %v", err, code)
	}
	var info *errdetails.ErrorInfo
	var bad *errdetails.BadRequest
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.BadRequest:
			bad = d
		}
	}
	if info == nil || info.Reason != reason.String() || info.Domain != ErrorDomain {
		t.Fatalf("error info %v, want reason %v", info, reason)
	}
	if field != "" && (info.Metadata["field"] != field || code == codes.InvalidArgument && (bad == nil || bad.FieldViolations[0].Field != field)) {
		t.Fatalf("bad request %v / metadata %v, want field %q", bad, info.Metadata, field)
	}
}

func (h *harness) pick(t *testing.T, req *admissionv1.PickRequest) *admissionv1.PickResponse {
	t.Helper()
	resp, err := h.client.Pick(h.ctx, req)
	if err != nil {
		t.Fatalf("Pick: %v", err)
	}
	return resp
}

func (h *harness) record(t *testing.T, scope string, p *admissionv1.PickResponse, o admissionv1.Outcome) *admissionv1.RecordOutcomeResponse {
	t.Helper()
	resp, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{
		Scope: scope, CallId: p.GetCallId(), PermitId: p.GetGrant().GetPermitId(), Outcome: o,
	})
	if err != nil {
		t.Fatalf("RecordOutcome: %v", err)
	}
	return resp
}

func TestRequestValidationNamesTheField(t *testing.T) {
	h := start(t, harnessOpts{})
	long := strings.Repeat("x", maxDetail+1)
	for _, tc := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"pick scope", func() error { _, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{}); return err }, "scope"},
		{"pick tokens", func() error {
			_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: -1})
			return err
		}, "estimated_tokens"},
		{"pick deadline", func() error {
			_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", Deadline: durationpb.New(-time.Second)})
			return err
		}, "deadline"},
		{"on_no_runnable call", func() error {
			_, err := h.client.OnNoRunnable(h.ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat"})
			return err
		}, "call_id"},
		{"record permit", func() error {
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "c", Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
			return err
		}, "permit_id"},
		{"record outcome", func() error {
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "c", PermitId: "p"})
			return err
		}, "outcome"},
		{"record status", func() error {
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "c", PermitId: "p", Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, HttpStatus: 42})
			return err
		}, "http_status"},
		{"record tokens", func() error {
			n := int64(-3)
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "c", PermitId: "p", Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, ActualTokens: &n})
			return err
		}, "actual_tokens"},
		{"record hint", func() error {
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "c", PermitId: "p", Outcome: admissionv1.Outcome_OUTCOME_RATE_LIMITED, RetryAfterHint: durationpb.New(-time.Second)})
			return err
		}, "retry_after_hint"},
		{"record detail", func() error {
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "c", PermitId: "p", Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, Detail: long})
			return err
		}, "detail"},
		{"override action", func() error {
			_, err := h.client.OverrideBreaker(h.ctx, &admissionv1.OverrideBreakerRequest{Scope: "chat", Source: "primary", Actor: "me", Reason: "r"})
			return err
		}, "action"},
		{"override actor", func() error {
			_, err := h.client.OverrideBreaker(h.ctx, &admissionv1.OverrideBreakerRequest{Scope: "chat", Source: "primary", Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Reason: "r"})
			return err
		}, "actor"},
		{"describe scope", func() error { _, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{}); return err }, "scope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantStatus(t, tc.call(), codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_INVALID_FIELD, tc.field)
		})
	}
}

func TestMisuseStatuses(t *testing.T) {
	h := start(t, harnessOpts{})
	g := h.pick(t, &admissionv1.PickRequest{Scope: "chat"})

	_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "nope"})
	wantStatus(t, err, codes.NotFound, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_SCOPE, "")
	_, err = h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", CallId: "c-unknown"})
	wantStatus(t, err, codes.NotFound, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_CALL, "")
	_, err = h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "other", CallId: g.CallId})
	wantStatus(t, err, codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_INVALID_FIELD, "scope")
	_, err = h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", CallId: g.CallId})
	wantStatus(t, err, codes.FailedPrecondition, admissionv1.ErrorReason_ERROR_REASON_PERMIT_OUTSTANDING, "")
	_, err = h.client.OnNoRunnable(h.ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: g.CallId})
	wantStatus(t, err, codes.FailedPrecondition, admissionv1.ErrorReason_ERROR_REASON_NO_REFUSAL, "")
	_, err = h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: g.CallId, PermitId: "p-other", Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
	wantStatus(t, err, codes.FailedPrecondition, admissionv1.ErrorReason_ERROR_REASON_PERMIT_NOT_OF_CALL, "permit_id")
	_, err = h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 5000})
	wantStatus(t, err, codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_ESTIMATE_TOO_LARGE, "estimated_tokens")
	_, err = h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "chat", Sources: []string{"nope"}})
	wantStatus(t, err, codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_SOURCE, "")

	first := h.record(t, "chat", g, admissionv1.Outcome_OUTCOME_SUCCESS)
	again := h.record(t, "chat", g, admissionv1.Outcome_OUTCOME_SUCCESS)
	if first.GetDone() == nil || again.GetDone() == nil || again.Effect != first.Effect {
		t.Fatalf("RecordOutcome twice: %v then %v, want the same Done", first, again)
	}
	_, err = h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", CallId: g.CallId})
	wantStatus(t, err, codes.FailedPrecondition, admissionv1.ErrorReason_ERROR_REASON_CALL_ENDED, "")
}

func TestLiveCallCap(t *testing.T) {
	h := start(t, harnessOpts{}) // calls.max_live: 3
	var held []*admissionv1.PickResponse
	for range 3 {
		held = append(held, h.pick(t, &admissionv1.PickRequest{Scope: "other"}))
	}
	_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "other"})
	wantStatus(t, err, codes.ResourceExhausted, admissionv1.ErrorReason_ERROR_REASON_TOO_MANY_CALLS, "")
	h.record(t, "other", held[0], admissionv1.Outcome_OUTCOME_SUCCESS)
	h.pick(t, &admissionv1.PickRequest{Scope: "other"}) // an ended call frees its place
}

func TestIdleCallsExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, harnessOpts{}) // calls.idle_timeout: 1m
		p := h.pick(t, &admissionv1.PickRequest{Scope: "other"})
		time.Sleep(time.Minute - time.Millisecond)
		h.srv.Sweep()
		if _, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "other", CallId: p.CallId, PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT}); err != nil {
			t.Fatalf("call expired early: %v", err)
		}
		time.Sleep(time.Minute)
		h.srv.Sweep()
		_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "other", CallId: p.CallId})
		wantStatus(t, err, codes.NotFound, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_CALL, "")
	})
}

// stalledSettles is a backend whose settles fail after its timeout, as on
// a Redis that stopped answering (a give-back's context has no deadline: the
// backend bounds it).
type stalledSettles struct{ gate.Backend }

const stalledTimeout = 500 * time.Millisecond

func (stalledSettles) Settle(context.Context, gate.SettleRequest) (gate.Settlement, error) {
	time.Sleep(stalledTimeout)
	return gate.Settlement{}, context.DeadlineExceeded
}

// Calls forgotten together give their permits back together: against a
// backend that does not answer, one sweep waits one give-back's timeout, not
// one per call (the sweep also writes the "calls waiting" lines and forgets
// the next idle calls, which must not wait minutes behind a dead backend).
func TestIdleCallsGiveBackTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, harnessOpts{backend: stalledSettles{inmem.New(time.Now)}})
		for range 3 {
			h.pick(t, &admissionv1.PickRequest{Scope: "other"}) // holds a permit, never reported
		}
		time.Sleep(time.Minute)
		began := time.Now()
		h.srv.Sweep()
		if took := time.Since(began); took != stalledTimeout {
			t.Fatalf("a sweep forgetting 3 permit holders took %v against a backend that does not answer; want one backend timeout, %v", took, stalledTimeout)
		}
		if n := h.srv.calls.liveIn("other"); n != 0 {
			t.Fatalf("%d calls live after the sweep, want 0", n)
		}
	})
}

// A call forgotten while it holds a permit gives the permit back at once,
// not at the end of its lease.
func TestIdleCallGivesItsPermitBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, harnessOpts{})
		p := h.pick(t, &admissionv1.PickRequest{Scope: "other"}) // holds a permit, never reported
		time.Sleep(time.Minute)
		h.srv.Sweep()
		d, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "other"})
		if err != nil || d.Scope.Sources[0].InFlight != 0 || d.Scope.LiveCalls != 0 {
			t.Fatalf("after forgetting call %s: %v %v, want its slot free and no live call", p.CallId, d, err)
		}
	})
}

// Verdicts are responses, not errors: a circuit-open failure comes back in
// OnNoRunnable's response with the remaining cooldown.
func TestVerdictsAreResponses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, harnessOpts{})
		for range 2 {
			h.record(t, "chat", h.pick(t, &admissionv1.PickRequest{Scope: "chat"}), admissionv1.Outcome_OUTCOME_TRANSIENT)
		}
		time.Sleep(3 * time.Second)
		p := h.pick(t, &admissionv1.PickRequest{Scope: "chat"})
		nr := p.GetNoRunnable()
		if nr == nil || nr.GateRejections != 1 || nr.PerSourceReasons[0].Reason != admissionv1.Reason_REASON_COOLDOWN {
			t.Fatalf("pick while open: %v", p)
		}
		d, err := h.client.OnNoRunnable(h.ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.CallId})
		if err != nil {
			t.Fatal(err)
		}
		f := d.GetFailure()
		if f == nil || f.Reason != admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN || f.RetryAfter.AsDuration() != 7*time.Second {
			t.Fatalf("decision %v, want circuit_open with 7s left", d)
		}
		ra, err := h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "chat"})
		if err != nil || ra.RetryAfter.AsDuration() != 7*time.Second || ra.Sources[0].State != admissionv1.BreakerState_BREAKER_STATE_OPEN {
			t.Fatalf("RetryAfter %v %v", ra, err)
		}
	})
}

func TestDescribeShowsLiveStateAndDerivedValues(t *testing.T) {
	h := start(t, harnessOpts{})
	h.pick(t, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 100})
	resp, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	d := resp.Scope
	src := d.Sources[0]
	if d.LiveCalls != 1 || d.Backend != "memory" || d.ProgressAge != nil || src.InFlight != 1 || src.TokensLastMinute != 100 ||
		src.PacerCeiling != 8 || src.Config.Breaker.ProbeTtl.AsDuration() != time.Minute || src.Config.Breaker.ProbeTtlDerived ||
		src.Config.Lease.AsDuration() != 35*time.Second || src.Config.Attributes["model"] != "m1" {
		t.Fatalf("describe %v", d)
	}
	list, err := h.client.ListScopes(h.ctx, &admissionv1.ListScopesRequest{})
	if err != nil || len(list.Scopes) != 2 || list.Scopes[0].Config.Name != "chat" {
		t.Fatalf("list %v %v", list, err)
	}
}

func TestOverrideSaysWhoAndWhy(t *testing.T) {
	h := start(t, harnessOpts{})
	resp, err := h.client.OverrideBreaker(h.ctx, &admissionv1.OverrideBreakerRequest{
		Scope: "chat", Source: "primary", Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: "oncall", Reason: "key rotated",
	})
	if err != nil || resp.Source.Override != admissionv1.Override_OVERRIDE_FORCED_OPEN || resp.Source.OverrideActor != "oncall" {
		t.Fatalf("override %v %v", resp, err)
	}
	p := h.pick(t, &admissionv1.PickRequest{Scope: "chat"})
	if r := p.GetNoRunnable().GetPerSourceReasons(); len(r) != 1 || r[0].Reason != admissionv1.Reason_REASON_FORCED_OPEN {
		t.Fatalf("pick under a forced open: %v", p)
	}
	_, err = h.client.OverrideBreaker(h.ctx, &admissionv1.OverrideBreakerRequest{Scope: "chat", Source: "nope", Action: admissionv1.OverrideAction_OVERRIDE_ACTION_RESET, Actor: "a", Reason: "b"})
	wantStatus(t, err, codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_SOURCE, "")
}

func TestReloadKeepsState(t *testing.T) {
	h := start(t, harnessOpts{})
	for range 2 {
		h.record(t, "chat", h.pick(t, &admissionv1.PickRequest{Scope: "chat"}), admissionv1.Outcome_OUTCOME_TRANSIENT)
	}
	cfg, err := config.Parse([]byte(strings.Replace(testConfig, "tpm: 1000", "tpm: 1000, max_concurrency: 2", 1)), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.Apply(cfg)
	d, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	src := d.Scope.Sources[0]
	if src.State != admissionv1.BreakerState_BREAKER_STATE_OPEN || src.Config.MaxConcurrency != 2 || src.PacerCeiling != 2 {
		t.Fatalf("after reload: %v, want the breaker still open and the new limit", src)
	}
}

func TestAuth(t *testing.T) {
	h := start(t, harnessOpts{token: "s3cret-token"})
	_, err := h.client.ListScopes(h.ctx, &admissionv1.ListScopesRequest{})
	wantStatus(t, err, codes.Unauthenticated, admissionv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED, "")
	wrong := metadata.AppendToOutgoingContext(h.ctx, "authorization", "Bearer nope")
	_, err = h.client.ListScopes(wrong, &admissionv1.ListScopesRequest{})
	wantStatus(t, err, codes.Unauthenticated, admissionv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED, "")
	right := metadata.AppendToOutgoingContext(h.ctx, "authorization", "Bearer s3cret-token")
	if _, err := h.client.ListScopes(right, &admissionv1.ListScopesRequest{}); err != nil {
		t.Fatal(err)
	}
	if hc, err := h.health.Check(h.ctx, &healthpb.HealthCheckRequest{}); err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without a token: %v %v", hc, err)
	}
}

// brokenBackend fails every decision the way a real backend can.
type brokenBackend struct {
	gate.Backend
	err   error
	panic bool
}

func (b brokenBackend) Admit(context.Context, gate.AdmitRequest) (gate.Admission, error) {
	if b.panic {
		panic("backend bug")
	}
	return gate.Admission{}, b.err
}

func TestBackendFailures(t *testing.T) {
	t.Run("Unavailable", func(t *testing.T) {
		h := start(t, harnessOpts{backend: brokenBackend{err: errors.Join(gate.ErrUnavailable, errors.New("dial tcp: refused"))}})
		_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat"})
		wantStatus(t, err, codes.Unavailable, admissionv1.ErrorReason_ERROR_REASON_BACKEND_UNAVAILABLE, "")
	})
	t.Run("InternalErrorIsGeneric", func(t *testing.T) {
		h := start(t, harnessOpts{backend: brokenBackend{err: errors.New("lua: attempt to index nil")}})
		_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat"})
		wantStatus(t, err, codes.Internal, admissionv1.ErrorReason_ERROR_REASON_INTERNAL, "")
		if strings.Contains(err.Error(), "lua") {
			t.Fatalf("internal detail leaked to the client: %v", err)
		}
	})
	t.Run("PanicIsRecovered", func(t *testing.T) {
		h := start(t, harnessOpts{backend: brokenBackend{panic: true}})
		_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat"})
		wantStatus(t, err, codes.Internal, admissionv1.ErrorReason_ERROR_REASON_INTERNAL, "")
		if _, err := h.client.ListScopes(h.ctx, &admissionv1.ListScopesRequest{}); err == nil {
			t.Fatal("ListScopes over a backend without Peek should fail, not pass") // the embedded nil Backend panics too
		}
	})
}

func TestCancelCall(t *testing.T) {
	h := start(t, harnessOpts{yaml: `
calls: {max_live: 2}
scopes:
  one:
    sources: [{name: only, max_concurrency: 1}]
`})
	holder := h.pick(t, &admissionv1.PickRequest{Scope: "one"})
	waiter := h.pick(t, &admissionv1.PickRequest{Scope: "one"})
	if waiter.GetNoRunnable() == nil {
		t.Fatalf("second call: %v, want refused", waiter)
	}
	live := func() int32 {
		d, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "one"})
		if err != nil {
			t.Fatal(err)
		}
		return d.Scope.LiveCalls
	}
	// The waiter gives up between attempts: its call ends and frees its place.
	r, err := h.client.CancelCall(h.ctx, &admissionv1.CancelCallRequest{Scope: "one", CallId: waiter.CallId})
	if err != nil || !r.EndedNow || live() != 1 {
		t.Fatalf("cancel of a waiting call: %v %v, live %d", r, err, live())
	}
	if r, err := h.client.CancelCall(h.ctx, &admissionv1.CancelCallRequest{Scope: "one", CallId: waiter.CallId}); err != nil || r.EndedNow {
		t.Fatalf("second cancel: %v %v, want a no-op", r, err)
	}
	_, err = h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "one", CallId: waiter.CallId})
	wantStatus(t, err, codes.FailedPrecondition, admissionv1.ErrorReason_ERROR_REASON_CALL_ENDED, "")

	// The holder gives up mid-attempt: its permit is settled as CANCELLED and
	// the slot is free at once.
	if r, err := h.client.CancelCall(h.ctx, &admissionv1.CancelCallRequest{Scope: "one", CallId: holder.CallId}); err != nil || !r.EndedNow {
		t.Fatalf("cancel of a call holding a permit: %v %v", r, err)
	}
	if live() != 0 {
		t.Fatalf("live calls %d after both cancels", live())
	}
	if g := h.pick(t, &admissionv1.PickRequest{Scope: "one"}).GetGrant(); g == nil {
		t.Fatal("the cancelled call's slot was not released")
	}
	_, err = h.client.CancelCall(h.ctx, &admissionv1.CancelCallRequest{Scope: "one"})
	wantStatus(t, err, codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_INVALID_FIELD, "call_id")
}

// An opening Pick that fails never gave its call id to the caller, so the
// call must not stay live (it would count against calls.max_live).
func TestFailedOpeningPickLeavesNoCall(t *testing.T) {
	h := start(t, harnessOpts{}) // calls.max_live: 3; chat's source has tpm 1000
	for range 5 {
		_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 5000})
		wantStatus(t, err, codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_ESTIMATE_TOO_LARGE, "estimated_tokens")
	}
	h.pick(t, &admissionv1.PickRequest{Scope: "chat"})
	d, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
	if err != nil || d.Scope.LiveCalls != 1 {
		t.Fatalf("live calls %v %v, want only the good one", d.GetScope().GetLiveCalls(), err)
	}
}

// Grants share their lease and timeout messages while they repeat, and
// answers that end a call share their Done: concurrent answers from sources
// of different timeouts still each carry their own source's values (every
// answer is marshaled while others share its parts).
func TestConcurrentAnswersCarryTheirOwnDurations(t *testing.T) {
	h := start(t, harnessOpts{yaml: `
calls: {max_live: 1000}
scopes:
  two:
    sources: [{name: fast, timeout: 5s, max_concurrency: 1000}, {name: slow, timeout: 7s, max_concurrency: 1000}]
`})
	sc, err := h.srv.Scope("two")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]time.Duration{} // source → timeout, lease
	for i, src := range sc.Config().Sources {
		want[src.Name] = [2]time.Duration{src.Timeout, sc.Config().Gate(i).Limits.Lease}
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			for range 50 {
				p, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "two"})
				if err != nil {
					errs <- err.Error()
					return
				}
				g := p.GetGrant()
				if w := want[g.GetSource()]; g.GetTimeout().AsDuration() != w[0] || g.GetLease().AsDuration() != w[1] {
					errs <- fmt.Sprintf("grant of %s: timeout %v, lease %v; want %v, %v", g.GetSource(), g.GetTimeout().AsDuration(), g.GetLease().AsDuration(), w[0], w[1])
					return
				}
				r, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "two", CallId: p.GetCallId(), PermitId: g.GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
				if err != nil || r.GetDone() == nil {
					errs <- fmt.Sprintf("RecordOutcome: %v %v, want Done", r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
