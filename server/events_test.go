package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/admissiontest"
)

const eventsConfig = `
scopes:
  chat:
    circuit_open: wait
    backpressure: {stall_window: 300s, poll_interval: 1ms}
    breaker: {fail_threshold: 1, cooldown: 10s, max_cooldown: 10s, probe_ttl: 60s}
    sources: [{name: primary}]
  other:
    sources: [{name: only}]
`

// watch opens a WatchEvents stream and returns once the watch is registered
// (the stream's headers arrived).
func (e *opsEnv) watch(t *testing.T, scope string) grpc.ServerStreamingClient[admissionv1.WatchEventsResponse] {
	t.Helper()
	ctx, cancel := context.WithCancel(e.Ctx)
	t.Cleanup(cancel)
	stream, err := e.Client.WatchEvents(ctx, &admissionv1.WatchEventsRequest{Scope: scope})
	if err != nil {
		t.Fatalf("WatchEvents: %v", err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatalf("WatchEvents headers: %v", err)
	}
	return stream
}

func next(t *testing.T, s grpc.ServerStreamingClient[admissionv1.WatchEventsResponse]) *admissionv1.WatchEventsResponse {
	t.Helper()
	ev, err := s.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return ev
}

// TestWatchEventsBreakerCycle watches a breaker open, lease its probe and
// close, through the real server, and checks the events' order and content.
func TestWatchEventsBreakerCycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startOps(t, opsOpts{yaml: eventsConfig})
		chat, all := e.watch(t, "chat"), e.watch(t, "")
		t0 := time.Now()

		first := e.Grant(t, "chat", "", 0)
		e.Record(t, "chat", first, admissiontest.Outcome{Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT, Status: 503})
		e.Override(t, "other", "only", admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN) // not chat's
		time.Sleep(10 * time.Second)
		probe := e.Grant(t, "chat", first.GetCallId(), 0)
		if !probe.GetGrant().GetProbe() || probe.GetGrant().GetEpoch() != 1 {
			t.Fatalf("want the probe under epoch 1: %v", probe.GetGrant())
		}
		e.Record(t, "chat", probe, admissiontest.Outcome{Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, Status: 200})
		t1 := t0.Add(10 * time.Second)
		permit := probe.GetGrant().GetPermitId()

		const (
			closed   = admissionv1.BreakerState_BREAKER_STATE_CLOSED
			open     = admissionv1.BreakerState_BREAKER_STATE_OPEN
			halfOpen = admissionv1.BreakerState_BREAKER_STATE_HALF_OPEN
		)
		type want struct {
			at   time.Time
			body any
		}
		cycle := []want{
			{t0, &admissionv1.BreakerTransition{Source: "primary", From: closed, To: open,
				Cause: admissionv1.TransitionCause_TRANSITION_CAUSE_CONSECUTIVE_FAILURES, Epoch: 0, Reopens: 1}},
			{t1, &admissionv1.BreakerTransition{Source: "primary", From: open, To: halfOpen,
				Cause: admissionv1.TransitionCause_TRANSITION_CAUSE_COOLDOWN_ELAPSED, Epoch: 0, Reopens: 1}},
			{t1, &admissionv1.ProbeEvent{Source: "primary", Kind: admissionv1.ProbeEventKind_PROBE_EVENT_KIND_LEASED, PermitId: permit, Epoch: 1}},
			{t1, &admissionv1.BreakerTransition{Source: "primary", From: halfOpen, To: closed,
				Cause: admissionv1.TransitionCause_TRANSITION_CAUSE_PROBE_SUCCEEDED, Epoch: 1, Reopens: 0}},
			{t1, &admissionv1.ProbeEvent{Source: "primary", Kind: admissionv1.ProbeEventKind_PROBE_EVENT_KIND_SETTLED, PermitId: permit,
				Epoch: 1, CallId: first.GetCallId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, State: closed}},
		}
		var seqs []uint64
		for i, w := range cycle {
			ev := next(t, chat)
			if ev.GetScope() != "chat" || ev.GetDropped() != 0 || !ev.GetTime().AsTime().Equal(w.at) {
				t.Fatalf("event %d: scope %q dropped %d time %v, want chat, 0, %v", i, ev.GetScope(), ev.GetDropped(), ev.GetTime().AsTime(), w.at)
			}
			switch body := w.body.(type) {
			case *admissionv1.BreakerTransition:
				got := ev.GetBreakerTransition()
				if got == nil || got.GetSource() != body.Source || got.GetFrom() != body.From || got.GetTo() != body.To ||
					got.GetCause() != body.Cause || got.GetEpoch() != body.Epoch || got.GetReopens() != body.Reopens {
					t.Fatalf("event %d: %v, want transition %v", i, ev, body)
				}
				if wantCooldown := body.To == open; wantCooldown != (got.GetCooldown() != nil) ||
					wantCooldown && got.GetCooldown().AsDuration() != 10*time.Second {
					t.Fatalf("event %d: cooldown %v", i, got.GetCooldown())
				}
			case *admissionv1.ProbeEvent:
				got := ev.GetProbe()
				if got == nil || got.GetSource() != body.Source || got.GetKind() != body.Kind || got.GetPermitId() != body.PermitId ||
					got.GetEpoch() != body.Epoch || got.GetCallId() != body.CallId || got.GetOutcome() != body.Outcome || got.GetState() != body.State {
					t.Fatalf("event %d: %v, want probe %v", i, ev, body)
				}
			}
			seqs = append(seqs, ev.GetSequence())
		}
		// The other scope's override was published between the opening and the
		// cooldown: the chat watcher sees a gap there, the unfiltered one sees it.
		if want := []uint64{1, 3, 4, 5, 6}; !equal(seqs, want) {
			t.Fatalf("sequences %v, want %v", seqs, want)
		}
		for i := range 6 {
			ev := next(t, all)
			if ev.GetSequence() != uint64(i+1) {
				t.Fatalf("unfiltered watcher: event %d has sequence %d", i, ev.GetSequence())
			}
			if i == 1 {
				o := ev.GetOverrideChanged()
				if ev.GetScope() != "other" || o.GetSource() != "only" || o.GetOverride() != admissionv1.Override_OVERRIDE_FORCED_OPEN ||
					o.GetActor() != "oncall" || o.GetReason() != "test OVERRIDE_ACTION_FORCE_OPEN" || o.GetState() != closed {
					t.Fatalf("override event %v", ev)
				}
			}
		}
	})
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestWatchEventsWaitAndStaleAndBackend checks the content of the other
// event kinds: a wait that starts, a stale outcome, a released probe, and
// the backend health hook.
func TestWatchEventsWaitAndStaleAndBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startOps(t, opsOpts{yaml: eventsConfig})
		w := e.watch(t, "chat")

		// Two attempts out; the first fails and opens the breaker, the second's
		// success is then stale.
		a, b := e.Grant(t, "chat", "", 0), e.Grant(t, "chat", "", 0)
		e.Record(t, "chat", a, admissiontest.Outcome{Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT})
		e.Record(t, "chat", b, admissiontest.Outcome{Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
		// A third call is refused (the cooldown memo) and starts waiting.
		c := e.Pick(t, "chat", "", 0)
		e.answerWaitsAtOnce(t, "chat")
		if d := e.OnNoRunnable(t, "chat", c.GetCallId()); d.GetWait() == nil {
			t.Fatalf("OnNoRunnable: %v", d)
		}
		e.sc.srv.BackendChanged(BackendChange{Backend: "redis", Degraded: true, Detail: "dial tcp: connection refused; scopes fail closed"})
		e.sc.srv.BackendChanged(BackendChange{Scope: "other", Backend: "redis", Degraded: false}) // not chat's

		if ev := next(t, w).GetBreakerTransition(); ev.GetTo() != admissionv1.BreakerState_BREAKER_STATE_OPEN {
			t.Fatalf("want the opening first: %v", ev)
		}
		stale := next(t, w).GetStaleOutcome()
		if stale.GetSource() != "primary" || stale.GetPermitId() != b.GetGrant().GetPermitId() ||
			stale.GetState() != admissionv1.BreakerState_BREAKER_STATE_OPEN {
			t.Fatalf("stale outcome %v", stale)
		}
		ws := next(t, w).GetWaitStarted()
		if ws.GetCallId() != c.GetCallId() || ws.GetGateRejections() != 1 || ws.GetAttempts() != 0 || len(ws.GetPerSourceReasons()) != 1 {
			t.Fatalf("wait started %v", ws)
		}
		// The sleep is the remaining cooldown (10s, the clock stood still) plus
		// the jitter of at most one poll interval; the reason is what the
		// wait's read found (the Pick's was the cooldown memo's).
		r := ws.GetPerSourceReasons()[0]
		if r.GetSource() != "primary" || r.GetReason() != admissionv1.Reason_REASON_CIRCUIT_OPEN || r.GetRetryAfter().AsDuration() != 10*time.Second ||
			ws.GetSleep().AsDuration() < 10*time.Second || ws.GetSleep().AsDuration() > 10*time.Second+time.Millisecond {
			t.Fatalf("wait started %v", ws)
		}
		bh := next(t, w)
		if h := bh.GetBackendHealth(); bh.GetScope() != "" || h.GetBackend() != "redis" || !h.GetDegraded() || h.GetDetail() == "" {
			t.Fatalf("backend health %v", bh)
		}
		// The log has one line for the wait with its reasons and sleep.
		logs := e.logs.String()
		for _, want := range []string{
			`msg="call waiting" scope=chat call=` + c.GetCallId() + " sleep=10.00",
			"sources.primary.reason=circuit_open sources.primary.retry_after=10s attempts=0",
			`msg="breaker closed → open" scope=chat source=primary epoch=0 cause=consecutive_failures reopens=1 cooldown=10s`,
		} {
			if !strings.Contains(logs, want) {
				t.Errorf("log lacks %q:\n%s", want, logs)
			}
		}
	})
}

// blockingSend holds the first message of every WatchEvents stream until
// released, so that a test can make a watcher as slow as it likes.
type blockingSend struct {
	entered chan struct{}
	release chan struct{}
}

func (b *blockingSend) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != admissionv1.AdmissionService_WatchEvents_FullMethodName {
		return handler(srv, ss)
	}
	return handler(srv, &heldStream{ServerStream: ss, b: b})
}

type heldStream struct {
	grpc.ServerStream
	b    *blockingSend
	sent int
}

func (h *heldStream) SendMsg(m any) error {
	if h.sent++; h.sent == 1 {
		close(h.b.entered)
		<-h.b.release
	}
	return h.ServerStream.SendMsg(m)
}

// TestSlowWatcherLosesEventsNotDecisions blocks a watcher's stream on its
// first event and shows that decisions that publish events still complete
// while it is blocked; the watcher's buffer keeps the first events, the
// rest are dropped, and the next event it receives carries the count.
func TestSlowWatcherLosesEventsNotDecisions(t *testing.T) {
	block := &blockingSend{entered: make(chan struct{}), release: make(chan struct{})}
	const buffer = 4
	e := startOps(t, opsOpts{yaml: eventsConfig, watchBuffer: buffer, interceptors: Interceptors{Stream: []grpc.StreamServerInterceptor{block.intercept}}})
	w := e.watch(t, "chat")

	// Event 1 (an override) is taken by the stream, which then blocks.
	e.Override(t, "chat", "primary", admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN)
	<-block.entered
	// Ten calls are refused and start waiting: ten decisions, ten events.
	e.answerWaitsAtOnce(t, "chat")
	const calls = 10
	for i := range calls {
		p := e.Pick(t, "chat", "", 0)
		if p.GetNoRunnable() == nil {
			t.Fatalf("call %d: %v", i, p)
		}
		if d := e.OnNoRunnable(t, "chat", p.GetCallId()); d.GetWait() == nil {
			t.Fatalf("call %d: %v", i, d)
		}
	}
	// Every decision above returned while the watcher's stream was still
	// blocked on event 1.
	select {
	case <-block.release:
		t.Fatal("released early")
	default:
	}
	e.sc.srv.events.sync()
	if got := e.sc.srv.events.dropped.Load(); got != calls-buffer {
		t.Fatalf("dropped %d events, want %d", got, calls-buffer)
	}
	close(block.release)

	if ev := next(t, w); ev.GetSequence() != 1 || ev.GetOverrideChanged() == nil || ev.GetDropped() != 0 {
		t.Fatalf("first event %v", ev)
	}
	for i := range buffer {
		ev := next(t, w)
		if ev.GetSequence() != uint64(2+i) || ev.GetWaitStarted() == nil || ev.GetDropped() != 0 {
			t.Fatalf("buffered event %d: %v", i, ev)
		}
	}
	// The next event says how many were lost before it.
	e.Override(t, "chat", "primary", admissionv1.OverrideAction_OVERRIDE_ACTION_CLEAR)
	ev := next(t, w)
	if ev.GetSequence() != 2+calls || ev.GetOverrideChanged().GetOverride() != admissionv1.Override_OVERRIDE_UNSPECIFIED || ev.GetDropped() != calls-buffer {
		t.Fatalf("event after the losses: %v, want sequence %d with dropped %d", ev, 2+calls, calls-buffer)
	}
}

// TestWatchEventsEnds: an unknown scope is NOT_FOUND; stopping the sidecar
// ends the stream cleanly.
func TestWatchEventsEnds(t *testing.T) {
	e := startOps(t, opsOpts{yaml: eventsConfig})
	s, err := e.Client.WatchEvents(e.Ctx, &admissionv1.WatchEventsRequest{Scope: "nope"})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.NotFound {
		t.Fatalf("unknown scope: %v", err)
	}
	w := e.watch(t, "")
	e.sc.stop()
	if _, err := w.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after stop: %v, want the stream to end", err)
	}
}

// TestWatchersAreCapped: events.max_watchers streams are admitted, one more
// is RESOURCE_EXHAUSTED (TOO_MANY_WATCHERS), and a closed stream frees its
// place.
func TestWatchersAreCapped(t *testing.T) {
	e := startOps(t, opsOpts{yaml: "events: {max_watchers: 2}\n" + eventsConfig})
	e.watch(t, "")
	ctx, cancel := context.WithCancel(e.Ctx)
	second, err := e.Client.WatchEvents(ctx, &admissionv1.WatchEventsRequest{Scope: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.Header(); err != nil {
		t.Fatal(err)
	}
	third := func() error {
		s, err := e.Client.WatchEvents(e.Ctx, &admissionv1.WatchEventsRequest{})
		if err != nil {
			return err
		}
		md, err := s.Header()
		if err == nil && md == nil {
			_, err = s.Recv()
		}
		return err
	}
	wantStatus(t, third(), codes.ResourceExhausted, admissionv1.ErrorReason_ERROR_REASON_TOO_MANY_WATCHERS, "")
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for e.sc.srv.events.watching.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the closed stream was not unregistered")
		}
		time.Sleep(time.Millisecond)
	}
	e.watch(t, "other")
}

// BenchmarkPublish: the cost of one published event to the decision that
// publishes it, by the number of watchers (none of which reads). It should
// not grow with the number of watchers: the fan-out runs on its own goroutine.
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{0, 1, 100, 500} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			h := newHub(1024, 1000)
			defer h.close()
			for range n {
				if _, err := h.subscribe(""); err != nil {
					b.Fatal(err)
				}
			}
			ev := &admissionv1.WatchEventsResponse{Event: &admissionv1.WatchEventsResponse_BackendHealth{BackendHealth: &admissionv1.BackendHealth{Backend: "memory"}}}
			b.ResetTimer()
			for b.Loop() {
				h.publish("chat", ev)
			}
		})
	}
}
