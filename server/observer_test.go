package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

const waitLogConfig = `
scopes:
  held:
    circuit_open: wait
    backpressure: {stall_window: 600s, poll_interval: 50ms}
    sources: [{name: only, timeout: 30s}]
`

// lines renders the records with message msg as "LEVEL key=value ...".
func (r *records) lines(msg string) (out []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if rec.Message != msg {
			continue
		}
		line := rec.Level.String()
		rec.Attrs(func(a slog.Attr) bool {
			if a.Value.Kind() == slog.KindGroup {
				for _, g := range a.Value.Group() {
					line += fmt.Sprintf(" %s.%s=%v", a.Key, g.Key, g.Value)
				}
				return true
			}
			if a.Key != "call" && a.Key != "sleep" && a.Key != "waited" {
				line += fmt.Sprintf(" %s=%v", a.Key, a.Value)
			}
			return true
		})
		out = append(out, line)
	}
	return out
}

// Calls that wait are logged per scope once per interval at INFO, with how
// many started waiting, how many are held and why; one line per call only at
// DEBUG.
func TestWaitsAreLoggedPerScopePerInterval(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testWaitLog(t, level) })
		})
	}
}

func testWaitLog(t *testing.T, level slog.Level) {
	cfg, err := config.Parse([]byte(waitLogConfig), nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &records{level: level}
	srv := New(cfg, inmem.New(time.Now), slog.New(logs), Options{})
	defer srv.Close()
	ctx := context.Background()
	if _, err := srv.OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{Scope: "held", Source: "only",
		Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: "test", Reason: "wait log"}); err != nil {
		t.Fatal(err)
	}
	const calls = 5
	var answered sync.WaitGroup
	for range calls {
		p, err := srv.Pick(ctx, &admissionv1.PickRequest{Scope: "held"})
		if err != nil || p.GetNoRunnable() == nil {
			t.Fatalf("Pick: %v %v, want NoRunnable", p, err)
		}
		answered.Go(func() {
			if _, err := srv.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "held", CallId: p.CallId}); err != nil {
				t.Errorf("OnNoRunnable: %v", err)
			}
		})
	}
	synctest.Wait() // every call is held

	srv.Sweep() // not due yet
	if got := logs.lines("calls waiting"); len(got) != 0 {
		t.Fatalf("lines before the interval: %q", got)
	}
	time.Sleep(waitLogInterval)
	srv.Sweep()
	time.Sleep(waitLogInterval / 2)
	srv.Sweep() // not due again yet
	time.Sleep(waitLogInterval / 2)
	srv.Sweep()
	want := []string{
		"INFO scope=held started=5 held=5 reasons.forced_open=5 interval=10s",
		"INFO scope=held started=0 held=5 interval=10s",
	}
	if got := logs.lines("calls waiting"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("calls waiting lines:\n%q\nwant\n%q", got, want)
	}

	srv.Close() // answers every wait
	answered.Wait()
	time.Sleep(waitLogInterval)
	srv.Sweep()
	if got := logs.lines("calls waiting"); len(got) != len(want) {
		t.Errorf("lines once nothing waits: %q, want none more", got[len(want):])
	}

	perCall := logs.lines("call waiting")
	wantPerCall := 0
	if level == slog.LevelDebug {
		wantPerCall = calls
	}
	if len(perCall) != wantPerCall {
		t.Fatalf("%d per-call lines at %v, want %d: %q", len(perCall), level, wantPerCall, perCall)
	}
	for _, l := range perCall {
		if want := "DEBUG scope=held sources.only=[reason=forced_open retry_after=0s] attempts=0"; l != want {
			t.Errorf("per-call line %q, want %q", l, want)
		}
	}
}
