package policy_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

// releaseDuringJoin is a backend on which a permit is released while a
// read that joins a line is in flight: after the backend ran the read (the
// caller is in line) and before the sidecar has its answer. On Redis this
// is any Settle of another caller landing within a Peek's round trip.
type releaseDuringJoin struct {
	gate.Backend
	during func()
}

func (r *releaseDuringJoin) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	snap, err := r.Backend.Peek(ctx, req)
	if f := r.during; f != nil && req.Line != nil && req.Line.Join != nil {
		r.during = nil
		f()
	}
	return snap, err
}

// the slot a release hands to a caller while its joining
// read is in flight is the caller's (the backend keeps it for it, and the
// line behind it waits), so the caller's hold must end at once. The local
// line drops that wake-up: in case "FirstJoin" the caller has no local entry
// yet (line.wake finds none), and the release's freed ring, which did reach
// the caller's ticket, is ignored because the hold is in line; in case
// "AlreadyInLine" line.wake marks it handed and decide's placed (joined)
// then clears the mark as "spent". Either way the caller sleeps until the
// poller's next read (poll_interval, jittered: 7.5 s here) while the slot
// stays reserved for it and the source idles.
func TestSlotHandedDuringTheJoiningReadIsNotLost(t *testing.T) {
	for _, inLine := range []bool{false, true} {
		name := "FirstJoin"
		if inLine {
			name = "AlreadyInLine"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg, err := config.Parse([]byte("scopes:\n  s:\n    backpressure: {poll_interval: 10s, stall_window: 300s}\n    sources: [{name: only, max_concurrency: 1}]\n"), nil)
				if err != nil {
					t.Fatal(err)
				}
				b := &releaseDuringJoin{Backend: inmem.New(time.Now)}
				s := policy.NewScope(cfg.Scopes["s"], b, policy.Options{Rand: half})
				t.Cleanup(s.Close)
				holder := newCall(s)
				g := grant(t, s, holder)
				c := newCall(s)
				if p := pick(t, s, c); p.NoRunnable == nil {
					t.Fatalf("%+v, want a refusal", p)
				}
				if inLine {
					// A first hold cut short by its RPC's deadline: the
					// call stays in line; its Pick is refused again.
					short, cancel := context.WithTimeout(ctx(t), time.Second)
					if d, err := s.OnNoRunnable(short, c); err != nil || d.Woken {
						t.Fatalf("first hold: %+v %v", d, err)
					}
					cancel()
					if p := pick(t, s, c); p.NoRunnable == nil {
						t.Fatalf("%+v, want a refusal", p)
					}
				}
				b.during = func() { record(t, s, holder, g, policy.Success) }
				start := time.Now()
				d, err := s.OnNoRunnable(ctx(t), c)
				if err != nil {
					t.Fatal(err)
				}
				if slept := time.Since(start); !d.Woken || slept != 0 {
					t.Errorf("slot handed during the joining read: %+v after %v, want woken at once", d, slept)
				}
				if p := pick(t, s, c); p.Grant == nil {
					t.Fatalf("%+v, want the handed slot", p)
				}
			})
		})
	}
}

// reloads and a close racing with callers taking their
// tickets, reading and holding: every hold ends by the close at the latest,
// and a call that asks after the close is answered at once.
func TestReloadAndCloseEndEveryHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		body := "scopes:\n  s:\n    backpressure: {poll_interval: 10s, stall_window: 300s}\n    sources: [{name: only, max_concurrency: 1}]\n"
		cfg, err := config.Parse([]byte(body), nil)
		if err != nil {
			t.Fatal(err)
		}
		s := policy.NewScope(cfg.Scopes["s"], inmem.New(time.Now), policy.Options{Rand: half})
		grant(t, s, newCall(s))
		done := make(chan [2]time.Time, 100)
		for i := range 100 {
			c := newCall(s)
			if p := pick(t, s, c); p.NoRunnable == nil {
				t.Fatalf("%+v, want a refusal", p)
			}
			go func() {
				time.Sleep(time.Duration(i%7) * time.Millisecond)
				start := time.Now()
				for {
					d, err := s.OnNoRunnable(ctx(t), c)
					if err != nil || !d.Woken {
						break
					}
					pick(t, s, c)
				}
				done <- [2]time.Time{start, time.Now()}
			}()
		}
		for range 5 {
			time.Sleep(time.Millisecond)
			s.Update(cfg.Scopes["s"])
		}
		closed := time.Now()
		s.Close()
		for range 100 {
			if at := <-done; at[1].After(closed) && at[1].After(at[0]) {
				t.Errorf("a hold that began %v ended %v after the close", at[0].Sub(closed), at[1].Sub(closed))
			}
		}
	})
}

// the answers a call keeps lazily (the last one, and the
// earlier ones from the second attempt on) answer a repeated report of any
// of its permits with the first answer.
func TestRepeatedReportsOfEveryPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `sources: [{name: a}, {name: b}]`)
		c := newCall(s)
		g1 := grant(t, s, c)
		r1 := record(t, s, c, g1, policy.Transient)
		if r1.Next.Retry == nil {
			t.Fatalf("first answer %+v, want a retry", r1)
		}
		time.Sleep(*r1.Next.Retry)
		g2 := grant(t, s, c)
		r2 := record(t, s, c, g2, policy.Success)
		g := []*policy.Grant{g1, g2, g1, g2}
		want := []policy.Recorded{r1, r2, r1, r2}
		for i := range g {
			got := record(t, s, c, g[i], policy.SourceDead)
			if (got.Next.Retry == nil) != (want[i].Next.Retry == nil) || got.Next.Done != want[i].Next.Done || got.Effect != want[i].Effect {
				t.Fatalf("report %d of permit %s again: %+v, want the first answer %+v", i, g[i].Permit.ID, got, want[i])
			}
		}
	})
}
