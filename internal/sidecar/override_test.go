package sidecar

import (
	"strings"
	"testing"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// TestOverrideActionsAreNamed: each operator action is named in its log
// line and its OverrideChanged event, with the override it leaves: a clear
// and a reset both leave none, and only the action tells them apart.
func TestOverrideActionsAreNamed(t *testing.T) {
	e := startOps(t, "scopes: {chat: {sources: [{name: primary}]}}\n")
	stream, err := e.Client.WatchEvents(e.Ctx, &admissionv1.WatchEventsRequest{Scope: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		action   admissionv1.OverrideAction
		override admissionv1.Override
		log      string
	}{
		{admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, admissionv1.Override_OVERRIDE_FORCED_OPEN, `msg="breaker override force_open" scope=chat source=primary epoch=0 override=forced_open actor=alice why="key rotation"`},
		{admissionv1.OverrideAction_OVERRIDE_ACTION_CLEAR, admissionv1.Override_OVERRIDE_UNSPECIFIED, `msg="breaker override clear" scope=chat source=primary epoch=0 override=none actor=alice why="key rotation"`},
		{admissionv1.OverrideAction_OVERRIDE_ACTION_RESET, admissionv1.Override_OVERRIDE_UNSPECIFIED, `msg="breaker override reset" scope=chat source=primary epoch=1 override=none actor=alice why="key rotation"`},
	} {
		if _, err := e.Client.OverrideBreaker(e.Ctx, &admissionv1.OverrideBreakerRequest{Scope: "chat", Source: "primary", Action: tc.action,
			Actor: "alice", Reason: "key rotation"}); err != nil {
			t.Fatal(err)
		}
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if o := ev.GetOverrideChanged(); o.GetAction() != tc.action || o.GetOverride() != tc.override || o.GetActor() != "alice" {
			t.Errorf("%v: event %v, want the action and override %v", tc.action, ev, tc.override)
		}
		if !strings.Contains(e.logs.String(), tc.log) {
			t.Errorf("%v: the log lacks %s:\n%s", tc.action, tc.log, e.logs)
		}
	}
}
