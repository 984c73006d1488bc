package status

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

const (
	closed      = admissionv1.BreakerState_BREAKER_STATE_CLOSED
	open        = admissionv1.BreakerState_BREAKER_STATE_OPEN
	halfOpen    = admissionv1.BreakerState_BREAKER_STATE_HALF_OPEN
	circuitOpen = admissionv1.Reason_REASON_CIRCUIT_OPEN
	admitted    = admissionv1.Reason_REASON_UNSPECIFIED
)

func src(name string, st admissionv1.BreakerState, r admissionv1.Reason, f ...func(*admissionv1.SourceState)) *admissionv1.SourceState {
	s := &admissionv1.SourceState{Name: name, State: st, Reason: r}
	for _, fn := range f {
		fn(s)
	}
	return s
}

func cooldown(d time.Duration) func(*admissionv1.SourceState) {
	return func(s *admissionv1.SourceState) { s.RetryAfter = durationpb.New(d) }
}

func forcedOpen(s *admissionv1.SourceState) {
	s.Override, s.OverrideActor, s.OverrideReason, s.Reason = admissionv1.Override_OVERRIDE_FORCED_OPEN, "alice", "key rotation", admissionv1.Reason_REASON_FORCED_OPEN
}

// TestHeadline: up, degraded or down, with why and what comes next, from a
// scope's description and what the Recorder kept.
func TestHeadline(t *testing.T) {
	dead := ScopeRecord{Sources: map[string]Source{"a": {OpenCause: "source_dead", Status: 401, Outcome: "source_dead", StatusAt: time.Unix(1, 0)}}}
	for _, tc := range []struct {
		name    string
		d       *admissionv1.ScopeDescription
		err     string
		rec     ScopeRecord
		health  Health
		why     []string
		next    string
		waiting int
	}{
		{name: "every source closed", d: &admissionv1.ScopeDescription{Sources: []*admissionv1.SourceState{src("a", closed, admitted), src("b", closed, admitted)}},
			health: Up, why: []string{"all 2 sources CLOSED"}},
		{name: "one source open", d: &admissionv1.ScopeDescription{Sources: []*admissionv1.SourceState{
			src("a", open, circuitOpen, cooldown(30*time.Second), func(s *admissionv1.SourceState) { s.OpenCause = admissionv1.OpenCause_OPEN_CAUSE_SOURCE_DEAD }),
			src("b", closed, admitted)}}, rec: dead,
			health: Degraded, why: []string{"a OPEN: source_dead, last HTTP 401 (source_dead)"}, next: "cooldown of a ends in 30s, then it is probed"},
		{name: "every source refuses, calls waiting", d: &admissionv1.ScopeDescription{Sources: []*admissionv1.SourceState{
			src("a", open, circuitOpen, cooldown(30*time.Second)), src("b", open, circuitOpen, cooldown(10*time.Second))}},
			rec:    ScopeRecord{Waiting: 6},
			health: Down, waiting: 6, why: []string{"every source refuses", "a OPEN: opened before this sidecar saw it", "b OPEN: opened before this sidecar saw it"},
			next: "cooldown of b ends in 10s, then it is probed"},
		{name: "a probe out", d: &admissionv1.ScopeDescription{Sources: []*admissionv1.SourceState{
			src("a", halfOpen, admissionv1.Reason_REASON_PROBE_IN_FLIGHT, func(s *admissionv1.SourceState) { s.ProbeOut, s.ProbeLeft = true, durationpb.New(20*time.Second) })}},
			health: Down, why: []string{"every source refuses", "a HALF_OPEN: opened before this sidecar saw it"}, next: "probe out on a (lease 20s left)"},
		{name: "forced open only", d: &admissionv1.ScopeDescription{Sources: []*admissionv1.SourceState{src("a", closed, 0, forcedOpen)}},
			health: Down, why: []string{"every source refuses", `a OPEN (forced by alice: "key rotation"; breaker CLOSED)`},
			next: "nothing recovers on its own: an operator forced every refusing source open"},
		{name: "waiting for capacity", d: &admissionv1.ScopeDescription{Sources: []*admissionv1.SourceState{src("a", closed, admitted)}},
			rec: ScopeRecord{Waiting: 2}, health: Degraded, waiting: 2, why: []string{"calls wait for capacity"}},
		{name: "redis unavailable, fail_closed", d: &admissionv1.ScopeDescription{Backend: "redis (unavailable: fail_closed)",
			Sources: []*admissionv1.SourceState{src("a", closed, admitted)}},
			health: Down, why: []string{"the shared backend is unavailable and on_unavailable is fail_closed: every call is refused"}},
		{name: "redis unavailable, local fallback", d: &admissionv1.ScopeDescription{Backend: "redis (unavailable: local fallback)",
			Sources: []*admissionv1.SourceState{src("a", closed, admitted)}},
			health: Degraded, why: []string{"the shared backend is unavailable: redis (unavailable: local fallback)"}},
		{name: "unreadable", err: "redis: connection circuitOpen", health: Down, why: []string{"its state cannot be read: redis: connection circuitOpen"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := headline(tc.d, tc.err, tc.rec)
			if h.Health != tc.health || strings.Join(h.Why, "|") != strings.Join(tc.why, "|") || h.Next != tc.next || h.Waiting != tc.waiting {
				t.Errorf("headline %+v,\nwant %s %q next %q waiting %d", h, tc.health, tc.why, tc.next, tc.waiting)
			}
		})
	}
}

// TestSourceSaysWhatTheOverrideDoes: a forced-open breaker reads OPEN, with
// who forced it and why, and the automatic state it hides.
func TestSourceSaysWhatTheOverrideDoes(t *testing.T) {
	for _, tc := range []struct {
		s    *admissionv1.SourceState
		does string
	}{
		{src("a", closed, 0, forcedOpen), `OPEN (forced by alice: "key rotation"; breaker CLOSED)`},
		{src("a", open, 0, forcedOpen), `OPEN (forced by alice: "key rotation")`},
		{src("a", open, 0, func(s *admissionv1.SourceState) {
			s.Override, s.OverrideActor, s.OverrideReason = admissionv1.Override_OVERRIDE_FORCED_CLOSED, "bob", "x"
		}),
			`CLOSED (forced by bob: "x"; breaker OPEN)`},
		{src("a", closed, 0, func(s *admissionv1.SourceState) {
			s.Override, s.OverrideActor, s.OverrideReason = admissionv1.Override_OVERRIDE_DISABLED, "bob", "x"
		}),
			`DISABLED (admits every attempt, records nothing by bob: "x"; breaker CLOSED)`},
	} {
		if v := viewSource(tc.s, Source{}, time.Time{}); v.Does != tc.does || v.Class != "FORCED" {
			t.Errorf("%v: %q (%s), want %q", tc.s, v.Does, v.Class, tc.does)
		}
	}
}

// TestTransitionsFoldAndFilter: runs of alike events fold into one row with
// their count and first time; a filter keeps one source or one kind.
func TestTransitionsFoldAndFilter(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(1_800_000_000+s), 0) }
	open := func(src string, s int) Transition {
		return Transition{At: at(s), Scope: "chat", Source: src, Kind: "transition", From: "half_open", To: "open", Cause: "probe_failed"}
	}
	ts := []Transition{ // newest first
		open("a", 40), open("a", 30), open("a", 20),
		{At: at(15), Scope: "chat", Source: "b", Kind: "override", Action: "force_open", Override: "forced_open", Actor: "alice"},
		open("a", 10),
	}
	rows := groupTransitions(ts, Filter{})
	if len(rows) != 3 || rows[0].Count != 3 || !rows[0].First.Equal(at(20)) || !rows[0].At.Equal(at(40)) || rows[1].Source != "b" || rows[2].Count != 1 {
		t.Errorf("folded rows: %+v", rows)
	}
	if rows := groupTransitions(ts, Filter{Source: "a"}); len(rows) != 1 || rows[0].Count != 4 {
		t.Errorf("source a's rows: %+v, want one run of 4 once b's override is filtered out", rows)
	}
	if rows := groupTransitions(ts, Filter{Kind: "override"}); len(rows) != 1 || rows[0].Action != "force_open" {
		t.Errorf("overrides: %+v", rows)
	}
}
