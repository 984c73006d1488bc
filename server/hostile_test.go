package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
