package main

import (
	"testing"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// TestStateSaysWhatTheOverrideDoes: an override shows as what the breaker
// does now, with the automatic state it hides when they differ.
func TestStateSaysWhatTheOverrideDoes(t *testing.T) {
	const (
		closed = admissionv1.BreakerState_BREAKER_STATE_CLOSED
		open   = admissionv1.BreakerState_BREAKER_STATE_OPEN
	)
	for _, tc := range []struct {
		state            admissionv1.BreakerState
		override         admissionv1.Override
		effective, short string
	}{
		{open, admissionv1.Override_OVERRIDE_UNSPECIFIED, "OPEN", "OPEN"},
		{closed, admissionv1.Override_OVERRIDE_FORCED_OPEN, "OPEN (forced; breaker CLOSED)", "OPEN(forced)"},
		{open, admissionv1.Override_OVERRIDE_FORCED_OPEN, "OPEN (forced)", "OPEN(forced)"},
		{open, admissionv1.Override_OVERRIDE_FORCED_CLOSED, "CLOSED (forced; breaker OPEN)", "CLOSED(forced)"},
		{closed, admissionv1.Override_OVERRIDE_DISABLED, "DISABLED (breaker CLOSED)", "DISABLED"},
	} {
		if got := effectiveState(tc.state, tc.override); got != tc.effective {
			t.Errorf("%v %v: %q, want %q", tc.state, tc.override, got, tc.effective)
		}
		if got := compactState(tc.state, tc.override); got != tc.short {
			t.Errorf("%v %v compact: %q, want %q", tc.state, tc.override, got, tc.short)
		}
	}
}
