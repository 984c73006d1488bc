package server

import (
	"context"
	"math"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

const twoSources = `
scopes:
  chat:
    sources:
      - {name: a, timeout: 30s}
      - {name: b, timeout: 30s}
`

// A RetryAfter source list is bounded by the scope: no duplicates, no more
// names than sources (a repeated name amplified one request into a read of
// the same source per copy).
func TestRetryAfterSourceListIsBounded(t *testing.T) {
	h := start(t, harnessOpts{yaml: twoSources})
	for _, tc := range []struct {
		name    string
		sources []string
	}{
		{"duplicate", []string{"a", "a"}},
		{"more than the scope has", []string{"a", "b", "c"}},
		{"amplifier", slicesRepeat("a", 10000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "chat", Sources: tc.sources})
			wantStatus(t, err, codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_INVALID_FIELD, "sources")
		})
	}
	if _, err := h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "chat", Sources: []string{"b", "a"}}); err != nil {
		t.Fatalf("every source once: %v", err)
	}
}

func slicesRepeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// A name or id longer than any configured or minted one is INVALID_ARGUMENT
// naming the field (not NOT_FOUND), and the answer shows only a short,
// escaped prefix of it.
func TestOverlongNamesAreInvalidWithAShortMessage(t *testing.T) {
	h := start(t, harnessOpts{})
	huge := strings.Repeat("é\"\n", 15000) // 60 000 bytes, to be escaped
	long := strings.Repeat("x", 65)
	for _, tc := range []struct {
		name  string
		call  func(v string) error
		field string
	}{
		{"pick scope", func(v string) error { _, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: v}); return err }, "scope"},
		{"pick call_id", func(v string) error {
			_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", CallId: v})
			return err
		}, "call_id"},
		{"record call_id", func(v string) error {
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: v, PermitId: "p", Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
			return err
		}, "call_id"},
		{"record permit_id", func(v string) error {
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "c", PermitId: v, Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
			return err
		}, "permit_id"},
		{"cancel call_id", func(v string) error {
			_, err := h.client.CancelCall(h.ctx, &admissionv1.CancelCallRequest{Scope: "chat", CallId: v})
			return err
		}, "call_id"},
		{"retry_after source", func(v string) error {
			_, err := h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "chat", Sources: []string{v}})
			return err
		}, "sources"},
		{"override source", func(v string) error {
			_, err := h.client.OverrideBreaker(h.ctx, &admissionv1.OverrideBreakerRequest{Scope: "chat", Source: v,
				Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: "me", Reason: "r"})
			return err
		}, "source"},
		{"describe scope", func(v string) error {
			_, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: v})
			return err
		}, "scope"},
		{"watch scope", func(v string) error {
			s, err := h.client.WatchEvents(h.ctx, &admissionv1.WatchEventsRequest{Scope: v})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range []string{long, huge} {
				err := tc.call(v)
				if tc.field == "" {
					if status.Code(err) != codes.InvalidArgument {
						t.Fatalf("got %v, want INVALID_ARGUMENT", err)
					}
				} else {
					wantStatus(t, err, codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_INVALID_FIELD, tc.field)
				}
				if msg := status.Convert(err).Message(); len(msg) > 300 {
					t.Fatalf("status message is %d bytes; want a short prefix of the input", len(msg))
				}
			}
		})
	}
}

// A request beyond limits.max_request_bytes is refused before it is decoded.
func TestRequestSizeIsLimited(t *testing.T) {
	h := start(t, harnessOpts{})
	_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: strings.Repeat("x", 1<<20)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 1 MiB request: %v, want RESOURCE_EXHAUSTED", err)
	}
}

// Token counts and durations are bounded on input: a count that could wrap
// the minute's TPM sum, or a deadline of centuries, is INVALID_ARGUMENT.
func TestNumbersAreBoundedOnInput(t *testing.T) {
	h := start(t, harnessOpts{})
	p := h.pick(t, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 10})
	huge := int64(math.MaxInt64)
	for _, tc := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"estimated_tokens", func() error {
			_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: MaxTokens + 1})
			return err
		}, "estimated_tokens"},
		{"actual_tokens", func() error {
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(),
				PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, ActualTokens: &huge})
			return err
		}, "actual_tokens"},
		{"deadline", func() error {
			_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", Deadline: durationpb.New(100 * 365 * 24 * time.Hour)})
			return err
		}, "deadline"},
		{"invalid duration", func() error {
			_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", Deadline: &durationpb.Duration{Seconds: math.MaxInt64}})
			return err
		}, "deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantStatus(t, tc.call(), codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_INVALID_FIELD, tc.field)
		})
	}
	// The permit is still the call's: the refused report changed nothing.
	max := int64(MaxTokens)
	if _, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(),
		PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, ActualTokens: &max}); err != nil {
		t.Fatal(err)
	}
	d, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.GetScope().GetSources()[0].GetTokensLastMinute(); got != MaxTokens {
		t.Fatalf("the minute's tokens: %d, want %d", got, MaxTokens)
	}
}

const hintConfig = `
scopes:
  chat:
    max_attempts: 5
    backoff: {base: 1s, max: 60s, max_retry_after: 10m}
    backpressure: {stall_window: 1h}
    breaker: {cooldown: 10s, max_cooldown: 5m}
    sources:
      - {name: a, timeout: 30s}
      - {name: b, timeout: 30s}
`

// Upstream hints are floors with a ceiling: a SOURCE_DEAD hint of a century
// opens the breaker for max_cooldown, not a century; a RATE_LIMITED or
// TRANSIENT hint beyond backoff.max_retry_after fails the call with the hint
// in the answer instead of a Retry that sleeps for it.
func TestHintsHaveACeiling(t *testing.T) {
	century := durationpb.New(100 * 365 * 24 * time.Hour)
	forever := &durationpb.Duration{Seconds: math.MaxInt64 / int64(time.Second)} // 292 years, the SDK's saturated header
	report := func(t *testing.T, h *harness, o admissionv1.Outcome, hint *durationpb.Duration) (*admissionv1.PickResponse, *admissionv1.RecordOutcomeResponse) {
		t.Helper()
		p := h.pick(t, &admissionv1.PickRequest{Scope: "chat"})
		r, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(),
			PermitId: p.GetGrant().GetPermitId(), Outcome: o, RetryAfterHint: hint})
		if err != nil {
			t.Fatal(err)
		}
		return p, r
	}

	t.Run("source dead", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { // the OPEN's remaining cooldown, read at a later instant
			h := start(t, harnessOpts{yaml: hintConfig})
			for i, hint := range []*durationpb.Duration{century, forever} {
				p, r := report(t, h, admissionv1.Outcome_OUTCOME_SOURCE_DEAD, hint)
				if i == 0 && (r.GetRetry() == nil || r.GetRetry().GetBackoff().AsDuration() > 5*time.Minute) {
					t.Fatalf("next: %v, want a retry on the other source within max_cooldown", r)
				}
				// The second dead source leaves none alive: the call ends.
				if f := r.GetFailure(); i == 1 && (f.GetReason() != admissionv1.FailureReason_FAILURE_REASON_SOURCE_DEAD || f.GetRetryAfter().AsDuration() > 5*time.Minute) {
					t.Fatalf("next: %v, want source_dead with retry_after within max_cooldown", r)
				}
				ra, err := h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "chat", Sources: []string{p.GetGrant().GetSource()}})
				if err != nil {
					t.Fatal(err)
				}
				if got := ra.GetRetryAfter().AsDuration(); got != 5*time.Minute {
					t.Fatalf("dead source's OPEN: %v, want max_cooldown 5m", got)
				}
				if _, err := h.client.CancelCall(h.ctx, &admissionv1.CancelCallRequest{Scope: "chat", CallId: p.GetCallId()}); err != nil {
					t.Fatal(err)
				}
			}
		})
	})
	for _, o := range []admissionv1.Outcome{admissionv1.Outcome_OUTCOME_RATE_LIMITED, admissionv1.Outcome_OUTCOME_TRANSIENT} {
		t.Run(o.String(), func(t *testing.T) {
			h := start(t, harnessOpts{yaml: hintConfig})
			_, r := report(t, h, o, durationpb.New(9*time.Minute))
			if got := r.GetRetry().GetBackoff().AsDuration(); got != 9*time.Minute {
				t.Fatalf("a hint under the cap: %v, want Retry(9m)", r)
			}
			for _, hint := range []*durationpb.Duration{durationpb.New(10*time.Minute + time.Millisecond), century, forever} {
				_, r := report(t, h, o, hint)
				f := r.GetFailure()
				if f.GetReason() != admissionv1.FailureReason_FAILURE_REASON_RETRY_AFTER_TOO_LONG || f.GetRetryAfter().AsDuration() < hint.AsDuration() {
					t.Fatalf("hint %v: %v, want Failure(retry_after_too_long) carrying the hint", hint.AsDuration(), r)
				}
			}
		})
	}
	t.Run("described", func(t *testing.T) {
		h := start(t, harnessOpts{yaml: hintConfig})
		d, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
		if err != nil {
			t.Fatal(err)
		}
		if got := d.GetScope().GetConfig().GetMaxRetryAfter().AsDuration(); got != 10*time.Minute {
			t.Fatalf("max_retry_after: %v", got)
		}
	})
}

// Call and permit ids carry 128 random bits each (26 base32 characters of
// crypto/rand): two consecutive ids share no guessable part, so a client
// that knows its own ids cannot settle or cancel another client's call.
func TestIDsAreUnguessable(t *testing.T) {
	h := start(t, harnessOpts{yaml: twoSources})
	callRE := regexp.MustCompile(`^c-[A-Z2-7]{26}$`)
	permitRE := regexp.MustCompile(`^p-[A-Z2-7]{26}$`)
	var prev *admissionv1.PickResponse
	for range 3 {
		p := h.pick(t, &admissionv1.PickRequest{Scope: "chat"})
		if !callRE.MatchString(p.GetCallId()) || !permitRE.MatchString(p.GetGrant().GetPermitId()) {
			t.Fatalf("ids %q, %q: want 128 random bits each", p.GetCallId(), p.GetGrant().GetPermitId())
		}
		if prev != nil {
			for _, pair := range [][2]string{{prev.GetCallId(), p.GetCallId()}, {prev.GetGrant().GetPermitId(), p.GetGrant().GetPermitId()}} {
				if n := commonPrefix(pair[0][2:], pair[1][2:]); n >= 8 {
					t.Fatalf("ids %q and %q share %d leading characters", pair[0], pair[1], n)
				}
			}
		}
		h.record(t, "chat", p, admissionv1.Outcome_OUTCOME_SUCCESS)
		prev = p
	}
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// With auth.operator_token set, the application's token runs the
// application's RPCs but gets PERMISSION_DENIED for OverrideBreaker and
// WatchEvents; the operator's token runs everything.
func TestOperatorRole(t *testing.T) {
	h := start(t, harnessOpts{token: "app-token", operator: "operator-token"})
	as := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(h.ctx, "authorization", "Bearer "+token)
	}
	override := func(ctx context.Context) error {
		_, err := h.client.OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{Scope: "chat", Source: "primary",
			Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: "me", Reason: "test"})
		return err
	}
	watch := func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s, err := h.client.WatchEvents(ctx, &admissionv1.WatchEventsRequest{})
		if err != nil {
			return err
		}
		md, err := s.Header() // sent once the watch is registered
		if err == nil && md == nil {
			_, err = s.Recv() // ended without headers: the status says why
		}
		return err
	}
	for name, call := range map[string]func(context.Context) error{"override": override, "watch": watch} {
		t.Run(name, func(t *testing.T) {
			wantStatus(t, call(as("app-token")), codes.PermissionDenied, admissionv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED, "")
			wantStatus(t, call(as("wrong")), codes.Unauthenticated, admissionv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED, "")
			wantStatus(t, call(h.ctx), codes.Unauthenticated, admissionv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED, "")
			if err := call(as("operator-token")); err != nil {
				t.Fatalf("operator: %v", err)
			}
		})
	}
	for _, token := range []string{"app-token", "operator-token"} {
		p, err := h.client.Pick(as(token), &admissionv1.PickRequest{Scope: "other"})
		if err != nil {
			t.Fatalf("Pick with %s: %v", token, err)
		}
		if _, err := h.client.CancelCall(as(token), &admissionv1.CancelCallRequest{Scope: "other", CallId: p.GetCallId()}); err != nil {
			t.Fatal(err)
		}
	}
	// Without an operator token, the application's token runs everything.
	h2 := start(t, harnessOpts{token: "app-token"})
	ctx := metadata.AppendToOutgoingContext(h2.ctx, "authorization", "Bearer app-token")
	if _, err := h2.client.OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{Scope: "chat", Source: "primary",
		Action: admissionv1.OverrideAction_OVERRIDE_ACTION_CLEAR, Actor: "me", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
}

// rawCodec sends pre-encoded bytes as a request, so a test can send what
// no well-behaved client would (invalid UTF-8 in a string field).
type rawCodec struct{ encoding.CodecV2 }

type rawRequest []byte

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawRequest); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// Undecodable requests (invalid UTF-8 in a string, malformed bytes) answer
// INVALID_ARGUMENT with an ErrorInfo naming the field, not INTERNAL, and are
// counted.
func TestUndecodableRequestsAreInvalid(t *testing.T) {
	h := start(t, harnessOpts{})
	str := func(num protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), s)
	}
	before := undecodableRequests.Load()
	for _, tc := range []struct {
		name, method string
		req          []byte
		field        string
	}{
		{"pick scope", admissionv1.AdmissionService_Pick_FullMethodName, str(1, "\xff\xfe"), "scope"},
		{"record detail", admissionv1.AdmissionService_RecordOutcome_FullMethodName,
			append(append(str(1, "chat"), str(2, "c-x")...), str(8, "bad \xc3\x28 detail")...), "detail"},
		{"retry_after sources", admissionv1.AdmissionService_RetryAfter_FullMethodName, append(str(1, "chat"), str(2, "\x80")...), "sources"},
		{"truncated", admissionv1.AdmissionService_Pick_FullMethodName, []byte{0x0a, 0x05, 'c'}, "request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var resp emptypb.Empty
			err := h.conn.Invoke(h.ctx, tc.method, rawRequest(tc.req), &resp, grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(encproto.Name)}))
			wantStatus(t, err, codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_INVALID_FIELD, tc.field)
		})
	}
	if got := undecodableRequests.Load() - before; got != 4 {
		t.Fatalf("counted %d undecodable requests, want 4", got)
	}
}

// A request that carries, among its unknown fields, one of the number the
// codec marks undecodable requests with (the fuzzer's find) decodes, and its
// unknown fields are ignored as any others: it is not refused as
// undecodable, with no field named.
func TestUnknownFieldOfTheMarksNumberIsIgnored(t *testing.T) {
	h := start(t, harnessOpts{})
	before := undecodableRequests.Load()
	req := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "other")
	req = protowire.AppendString(protowire.AppendTag(req, undecodableField, protowire.BytesType), "")
	var resp admissionv1.PickResponse
	if err := h.conn.Invoke(h.ctx, admissionv1.AdmissionService_Pick_FullMethodName, rawRequest(req), &resp,
		grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(encproto.Name)})); err != nil {
		t.Fatalf("Pick with an unknown field %d: %v", undecodableField, err)
	}
	if resp.GetGrant() == nil {
		t.Fatalf("Pick with an unknown field %d: %v, want a grant", undecodableField, &resp)
	}
	if got := undecodableRequests.Load() - before; got != 0 {
		t.Fatalf("counted %d undecodable requests, want 0", got)
	}
}

// limits.max_streams_per_connection bounds one connection's concurrent
// RPCs: with one WatchEvents stream open, a Pick on the same connection
// waits for a free stream (and runs once the watch ends).
func TestStreamsPerConnectionAreLimited(t *testing.T) {
	h := start(t, harnessOpts{yaml: "limits: {max_streams_per_connection: 1}\n" + testConfig})
	wctx, stop := context.WithCancel(h.ctx)
	w, err := h.client.WatchEvents(wctx, &admissionv1.WatchEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Header(); err != nil {
		t.Fatal(err)
	}
	// Without the limit this Pick would be answered at once; with it, it
	// cannot start while the watch holds the connection's only stream.
	short, cancel := context.WithTimeout(h.ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := h.client.Pick(short, &admissionv1.PickRequest{Scope: "other"}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a second RPC on the connection: %v, want it held until its deadline", err)
	}
	stop()
	h.pick(t, &admissionv1.PickRequest{Scope: "other"})
}
