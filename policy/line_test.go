package policy_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

// lineBench holds callers of a one-slot scope in line and serves them one
// release at a time.
type lineBench struct {
	t     *testing.T
	s     *policy.Scope
	calls map[string]*policy.Call
	woken chan string
	wg    sync.WaitGroup
}

func newLineBench(t *testing.T) *lineBench {
	s, _ := newScope(t, `
backpressure: {poll_interval: 10s, stall_window: 300s}
sources: [{name: only, max_concurrency: 1}]
`)
	return &lineBench{t: t, s: s, calls: map[string]*policy.Call{}, woken: make(chan string, 16)}
}

// wait refuses a new call and holds it in OnNoRunnable until it is woken.
func (b *lineBench) wait(ctx context.Context, label string, prio int32, tenant string) {
	b.t.Helper()
	c := newCall(b.s)
	c.Priority, c.Tenant = prio, tenant
	b.calls[label] = c
	if p := pick(b.t, b.s, c); p.NoRunnable == nil {
		b.t.Fatalf("%s: %+v, want a refusal", label, p)
	}
	b.wg.Go(func() {
		d, err := b.s.OnNoRunnable(ctx, c)
		if err != nil {
			return // the client is gone
		}
		if !d.Woken {
			b.t.Errorf("%s: %+v, want woken", label, d)
		}
		b.woken <- label
	})
	synctest.Wait()
}

// serve releases held's permit, then each woken caller takes the slot and
// releases it; every release must wake exactly one caller.
func (b *lineBench) serve(holder *policy.Call, g *policy.Grant, n int) []string {
	b.t.Helper()
	var order []string
	for range n {
		record(b.t, b.s, holder, g, policy.Success)
		synctest.Wait()
		if len(b.woken) != 1 {
			b.t.Fatalf("one release woke %d callers (served so far %v)", len(b.woken), order)
		}
		label := <-b.woken
		order = append(order, label)
		holder = b.calls[label]
		g = grant(b.t, b.s, holder)
	}
	record(b.t, b.s, holder, g, policy.Success)
	b.wg.Wait()
	return order
}

// The line orders callers by priority, then fair share across tenants,
// then arrival, and hands each released slot to the head alone.
func TestLineOrdersAndHandsOff(t *testing.T) {
	t.Run("Order", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newLineBench(t)
			holder := newCall(b.s)
			g := grant(t, b.s, holder)
			for _, w := range []struct {
				label  string
				prio   int32
				tenant string
			}{{"a1", 0, "a"}, {"a2", 0, "a"}, {"a3", 0, "a"}, {"b1", 0, "b"}, {"hi", 5, "b"}} {
				b.wait(ctx(t), w.label, w.prio, w.tenant)
			}
			d, err := b.s.Describe(ctx(t))
			if err != nil || d.Sources[0].Line.Length != 5 {
				t.Fatalf("line %+v %v, want 5 waiting", d.Sources[0].Line, err)
			}
			want := []string{"hi", "a1", "b1", "a2", "a3"}
			if got := b.serve(holder, g, 5); !slices.Equal(got, want) {
				t.Fatalf("served %v, want %v", got, want)
			}
		})
	})
	t.Run("NewcomerQueuesBehindTheHead", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newLineBench(t)
			holder := newCall(b.s)
			g := grant(t, b.s, holder)
			b.wait(ctx(t), "first", 0, "")
			record(t, b.s, holder, g, policy.Success) // handed to first
			synctest.Wait()
			late := newCall(b.s)
			p := pick(t, b.s, late)
			if p.NoRunnable == nil || p.NoRunnable.Sources[0].Reason != gate.ReasonQueued {
				t.Fatalf("a newcomer while the slot is handed to the head: %+v, want queued", p)
			}
			grant(t, b.s, b.calls[<-b.woken])
			b.wg.Wait()
		})
	})
	t.Run("ClientGoneLeaves", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newLineBench(t)
			holder := newCall(b.s)
			g := grant(t, b.s, holder)
			gone, cancel := context.WithCancel(ctx(t))
			b.wait(gone, "gone", 0, "")
			b.wait(ctx(t), "stays", 0, "")
			cancel()
			synctest.Wait()
			if got := b.serve(holder, g, 1); !slices.Equal(got, []string{"stays"}) {
				t.Fatalf("served %v, want the caller that stayed", got)
			}
		})
	})
	t.Run("ForgottenCallLeaves", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newLineBench(t)
			holder := newCall(b.s)
			g := grant(t, b.s, holder)
			// A caller whose RPC deadline ends its hold stays in line; its
			// client then vanishes, and the sidecar forgets the call.
			idle := newCall(b.s)
			pick(t, b.s, idle)
			short, cancel := context.WithTimeout(ctx(t), time.Second)
			defer cancel()
			if d, err := b.s.OnNoRunnable(short, idle); err != nil || d.Woken {
				t.Fatalf("the short hold: %+v %v", d, err)
			}
			b.wait(ctx(t), "stays", 0, "")
			b.s.Forget(idle)
			if got := b.serve(holder, g, 1); !slices.Equal(got, []string{"stays"}) {
				t.Fatalf("served %v, want the caller that stayed", got)
			}
		})
	})
}

// In shadow mode nobody waits, so nobody is in line and no would-be refusal
// is queued: a Pick that enforcement would refuse for capacity reports that
// capacity's own reason, even with a waiter of the fleet in the backend's
// line, and the Pick does not join it.
func TestShadowReportsNoQueued(t *testing.T) {
	s, b := newScope(t, `
mode: shadow
sources: [{name: only, max_concurrency: 1}]
`)
	grant(t, s, newCall(s)) // takes the only slot
	waiter := &gate.Waiter{ID: "elsewhere", Weight: 1, OtherWeight: 1, MaxTenants: 1, Lease: time.Hour}
	only := []*gate.Source{{Name: "only", Limits: gate.Limits{MaxConcurrency: 1}}}
	if _, err := b.Peek(ctx(t), gate.PeekRequest{Scope: s.Name(), Sources: only, Line: &gate.LineRead{Lease: time.Hour, Join: waiter, Joins: []string{"only"}}}); err != nil {
		t.Fatalf("Peek: %v", err)
	}
	g := grant(t, s, newCall(s))
	if !g.Shadow || reasons(g.ShadowRefusals) != "only:rate_limited:0s " {
		t.Fatalf("shadow grant %+v refusals %s, want only:rate_limited", g, reasons(g.ShadowRefusals))
	}
	snap, err := b.Peek(ctx(t), gate.PeekRequest{Scope: s.Name(), Sources: only, Line: &gate.LineRead{Lease: time.Hour}})
	if err != nil || snap.Sources[0].Line.Length != 1 {
		t.Fatalf("line after the shadow Pick: %+v, %v; want the one waiter", snap.Sources, err)
	}
}

// Each source has its own line: the poller wakes a line's head only when
// that source admits. Here a is full with the waiter at the head of its
// line (it is too big for b's tpm), and b is free with a caller of another
// replica in its line: the poller's reads leave the waiter held until a's
// release hands it a's slot.
func TestPollerWakesAHeadOnlyForItsSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b := newScope(t, `
backpressure: {poll_interval: 10s, stall_window: 300s}
sources: [{name: a, max_concurrency: 1}, {name: b, max_concurrency: 1, tpm: 50}]
`)
		big := func() *policy.Call { return policy.NewCall(policy.NewID("c"), s.Name(), 100, time.Time{}, time.Now()) }
		holder := big()
		g := grant(t, s, holder)
		waiter := big()
		if p := pick(t, s, waiter); p.NoRunnable == nil {
			t.Fatalf("%+v, want a refusal", p)
		}
		done := make(chan policy.Decision, 1)
		go func() {
			d, err := s.OnNoRunnable(ctx(t), waiter)
			if err != nil {
				t.Error(err)
			}
			done <- d
		}()
		synctest.Wait()
		other := &gate.Waiter{ID: "elsewhere", Replica: "r2", Weight: 1, OtherWeight: 1, MaxTenants: 1, Lease: time.Hour}
		onB := []*gate.Source{{Name: "b", Limits: gate.Limits{MaxConcurrency: 1, TPM: 50}}}
		if _, err := b.Peek(ctx(t), gate.PeekRequest{Scope: s.Name(), Sources: onB, Line: &gate.LineRead{Replica: "r2", Lease: time.Hour, Join: other, Joins: []string{"b"}}}); err != nil {
			t.Fatalf("Peek: %v", err)
		}
		time.Sleep(35 * time.Second) // three poll intervals and more
		synctest.Wait()
		select {
		case d := <-done:
			t.Fatalf("woken by the poller while a is full: %+v", d)
		default:
		}
		record(t, s, holder, g, policy.Success)
		if d := <-done; !d.Woken {
			t.Fatalf("after a's release: %+v, want woken", d)
		}
		if p := grant(t, s, waiter); p.Permit.Source != "a" {
			t.Fatalf("granted on %s, want a", p.Permit.Source)
		}
	})
}

// lostJoin is a backend whose first read that joins a line does join it,
// then loses its answer after its timeout (the script ran, the reply never
// came), and whose leaves take the same timeout to be answered, as a Redis
// that stopped answering after the join, then came back, would.
type lostJoin struct {
	gate.Backend
	timeout time.Duration
	lost    atomic.Bool
}

func (l *lostJoin) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	if req.Line != nil && req.Line.Join != nil && l.lost.CompareAndSwap(false, true) {
		_, _ = l.Backend.Peek(ctx, req)
		time.Sleep(l.timeout)
		return gate.Snapshot{}, gate.ErrUnavailable
	}
	return l.Backend.Peek(ctx, req)
}

func (l *lostJoin) Leave(ctx context.Context, req gate.LeaveRequest) error {
	time.Sleep(l.timeout)
	return l.Backend.Leave(ctx, req)
}

// A read that joined the line but did not answer leaves no place behind:
// nobody would ask for it, and at the head it would stall the line. The
// error is answered after one round trip, not after the leave's as well;
// the call's next read that joins waits for the leave, which therefore
// never takes out the place joined after it.
func TestLostJoinLeavesNoPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 300 * time.Millisecond
		cfg, err := config.Parse([]byte("scopes:\n  s:\n    sources: [{name: only, max_concurrency: 1}]\n"), nil)
		if err != nil {
			t.Fatal(err)
		}
		b := inmem.New(time.Now)
		s := policy.NewScope(cfg.Scopes["s"], &lostJoin{Backend: b, timeout: timeout}, policy.Options{Rand: half})
		t.Cleanup(s.Close)
		grant(t, s, newCall(s)) // takes the only slot
		c := newCall(s)
		if p := pick(t, s, c); p.NoRunnable == nil {
			t.Fatalf("%+v, want a refusal", p)
		}
		asked := time.Now()
		if _, err := s.OnNoRunnable(ctx(t), c); err == nil {
			t.Fatal("OnNoRunnable answered although its read failed")
		}
		if took := time.Since(asked); took != timeout {
			t.Fatalf("the failed read was answered after %v; want one round trip, %v", took, timeout)
		}
		only := []*gate.Source{{Name: "only", Limits: gate.Limits{MaxConcurrency: 1}}}
		line := func() int {
			t.Helper()
			snap, err := b.Peek(ctx(t), gate.PeekRequest{Scope: s.Name(), Sources: only, Line: &gate.LineRead{Lease: time.Hour}})
			if err != nil {
				t.Fatal(err)
			}
			return snap.Sources[0].Line.Length
		}
		// The caller asks again at once, while the leave is out.
		again, cancel := context.WithCancel(ctx(t))
		defer cancel()
		held := make(chan error, 1)
		go func() {
			_, err := s.OnNoRunnable(again, c)
			held <- err
		}()
		time.Sleep(timeout) // the leave's round trip
		synctest.Wait()
		if n := line(); n != 1 {
			t.Fatalf("line of %d after the leave and the call's next read; want the call's one place", n)
		}
		cancel()
		<-held
		synctest.Wait()
		if n := line(); n != 0 {
			t.Fatalf("line of %d after the call left; want empty", n)
		}
	})
}

// park picks for c, which must be refused, and holds it in OnNoRunnable on a
// goroutine of its own (in a synctest bubble): its decision arrives on the
// channel, nothing if OnNoRunnable fails.
func park(t *testing.T, s *policy.Scope, c *policy.Call) <-chan policy.Decision {
	t.Helper()
	if p := pick(t, s, c); p.NoRunnable == nil {
		t.Fatalf("%+v, want a refusal", p)
	}
	out := make(chan policy.Decision, 1)
	go func() {
		d, err := s.OnNoRunnable(ctx(t), c)
		if err == nil {
			out <- d
		}
	}()
	synctest.Wait()
	return out
}

// A head the poller woke that does not come for the slot within a grace of
// its answer (its client died between two RPCs) is set aside, so that the
// line behind it moves: here the RPM frees up without any release to hand
// off. Its place in the backend would be kept until the end of the hold it
// was promised; this replica knows it answered early.
func TestWokenHeadThatNeverAsksIsSetAside(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
backpressure: {poll_interval: 1s, stall_window: 600s}
sources: [{name: only, rpm: 1}]
`)
		grant(t, s, newCall(s)) // the minute's one request
		a := park(t, s, newCall(s))
		time.Sleep(time.Second)
		b := park(t, s, newCall(s))
		time.Sleep(time.Minute) // the RPM is free again: the poller wakes a, the head
		synctest.Wait()
		if d := <-a; !d.Woken {
			t.Fatalf("a: %+v, want woken", d)
		}
		// a's client is gone and never asks; within a grace (one poll
		// interval) and two polls, b is the head and is woken in turn.
		time.Sleep(3 * time.Second)
		synctest.Wait()
		mustBeWoken(t, b, "b", "behind a head that never came for its slot")
	})
}

// Callers that Pick, wait in line with a short RPC deadline, are answered
// and leave without a word cost the caller behind them one grace (a poll
// interval), however many: each place lapses at its own due. Before, each
// was woken in turn and waited for a lease.
func TestCallersGoneBetweenRPCsCostTheLineOneGrace(t *testing.T) {
	const poll = 50 * time.Millisecond
	for _, n := range []int{20, 40} {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
backpressure: {poll_interval: 50ms}
sources: [{name: only, max_concurrency: 1, timeout: 20s}]
`)
			holder := newCall(s)
			g := grant(t, s, holder)
			var gone sync.WaitGroup
			for range n {
				c := newCall(s)
				if p := pick(t, s, c); p.NoRunnable == nil {
					t.Fatalf("%+v, want a refusal", p)
				}
				gone.Go(func() {
					rpc, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
					defer cancel()
					if d, err := s.OnNoRunnable(rpc, c); err != nil || d.Failure != nil {
						t.Errorf("a caller about to leave: %+v, %v; want a wait", d, err)
					}
				})
			}
			gone.Wait() // answered: their callers leave without a word
			live := park(t, s, newCall(s))
			record(t, s, holder, g, policy.Success)
			time.Sleep(poll + poll) // a grace, then the poller's read
			synctest.Wait()
			mustBeWoken(t, live, "the live caller", fmt.Sprintf("behind %d callers gone", n))
		})
	}
}

// A caller in line that is slow to turn around between a Pick and its next
// OnNoRunnable (a loaded client) keeps its rank: a Pick keeps the place a
// lease. Were it set aside after one poll interval, the line could empty
// meanwhile and start its order afresh, and the place it took back would
// rank behind a caller who came later.
func TestSlowTurnaroundKeepsItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
backpressure: {poll_interval: 50ms}
sources: [{name: only, max_concurrency: 1, timeout: 20s}]
`)
		holder := newCall(s)
		g := grant(t, s, holder)
		// IDs that rank the later caller first where their keys tie.
		slow := policy.NewCall("c-z", s.Name(), 0, time.Time{}, time.Now())
		if p := pick(t, s, slow); p.NoRunnable == nil {
			t.Fatalf("%+v, want a refusal", p)
		}
		rpc, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
		d, err := s.OnNoRunnable(rpc, slow) // joins the line; answered before the deadline
		cancel()
		if err != nil || d.Failure != nil {
			t.Fatalf("the slow caller's wait: %+v, %v", d, err)
		}
		if p := pick(t, s, slow); p.NoRunnable == nil { // keeps its place
			t.Fatalf("%+v, want a refusal", p)
		}
		time.Sleep(200 * time.Millisecond) // four poll intervals before its OnNoRunnable
		later := park(t, s, policy.NewCall("c-a", s.Name(), 0, time.Time{}, time.Now()))
		first := make(chan policy.Decision, 1)
		go func() {
			if d, err := s.OnNoRunnable(ctx(t), slow); err == nil {
				first <- d
			}
		}()
		synctest.Wait()
		record(t, s, holder, g, policy.Success)
		synctest.Wait()
		mustBeWoken(t, first, "the slow caller", "while the released slot went past it")
		select {
		case d := <-later:
			t.Fatalf("the later caller was answered %+v before the slow one", d)
		default:
		}
	})
}

// mustBeWoken fails unless who's OnNoRunnable, held on d, has been answered
// Woken by now (call it after synctest.Wait); while says what it is held
// behind otherwise.
func mustBeWoken(t *testing.T, d <-chan policy.Decision, who, while string) {
	t.Helper()
	select {
	case got := <-d:
		if !got.Woken {
			t.Fatalf("%s: %+v, want woken", who, got)
		}
	default:
		t.Fatalf("%s is still held %s", who, while)
	}
}
