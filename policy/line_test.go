package policy

import (
	"testing"
	"time"

	"github.com/polygate/polygate/config"
)

func lineScope(weights map[string]int, aging time.Duration) *config.Scope {
	return &config.Scope{Tenants: weights, DefaultTenantWeight: 1, MaxTenants: 2, PriorityAging: aging}
}

// serve grants the head of the line n times and returns the tenants served.
func serve(l *line, cfg *config.Scope, now time.Time, n int) []string {
	var out []string
	for range n {
		l.mu.Lock()
		var head *Call
		best := l.head(cfg, now, false)
		for c, p := range l.entries {
			if p == best {
				head = c
			}
		}
		l.mu.Unlock()
		if head == nil {
			break
		}
		l.after(head, cfg, true, false)
		out = append(out, head.Tenant)
	}
	return out
}

func TestLineOrder(t *testing.T) {
	now := time.Unix(1000, 0)
	join := func(l *line, cfg *config.Scope, prio int32, tenant string, at time.Time) *Call {
		c := &Call{Priority: prio, Tenant: tenant}
		l.join(c, cfg, at)
		return c
	}
	t.Run("WeightedShare", func(t *testing.T) {
		cfg := lineScope(map[string]int{"a": 3, "b": 1}, 0)
		l := newLine()
		for range 40 {
			join(l, cfg, 0, "a", now)
		}
		for range 40 {
			join(l, cfg, 0, "b", now)
		}
		got := serve(l, cfg, now, 40)
		a := 0
		for _, x := range got {
			if x == "a" {
				a++
			}
		}
		if a != 30 {
			t.Fatalf("a served %d of 40, want 30 (3:1): %v", a, got)
		}
	})
	t.Run("PriorityThenFIFO", func(t *testing.T) {
		cfg := lineScope(nil, 0)
		l := newLine()
		first := join(l, cfg, 0, "", now)
		join(l, cfg, 0, "", now)
		high := join(l, cfg, 5, "", now)
		if l.admit(high, cfg, now) || !l.admit(first, cfg, now) {
			t.Fatal("the high-priority call must be the head, the first low one queued behind it")
		}
		if !l.admit(&Call{}, cfg, now) || l.admit(&Call{Priority: 6}, cfg, now) {
			t.Fatal("a newcomer queues behind the head unless it ranks before it")
		}
	})
	t.Run("Aging", func(t *testing.T) {
		cfg := lineScope(nil, time.Second)
		l := newLine()
		old := join(l, cfg, 0, "", now)
		later := now.Add(11 * time.Second)
		join(l, cfg, 10, "", later)
		if l.admit(old, cfg, later) {
			t.Fatal("a call aged 11 horizons must rank before a new priority-10 call")
		}
	})
	t.Run("TenantsBeyondTheCapShareABucket", func(t *testing.T) {
		cfg := lineScope(nil, 0)
		l := newLine()
		for _, tenant := range []string{"a", "b", "c", "d"} {
			join(l, cfg, 0, tenant, now)
		}
		st := l.state(now)
		if len(st.Groups) != 3 || st.Groups[2].Tenant != overflowTenant || st.Groups[2].Waiting != 2 {
			t.Fatalf("groups %+v, want a, b and the shared bucket", st.Groups)
		}
	})
	t.Run("HandoffOnePerRelease", func(t *testing.T) {
		cfg := lineScope(nil, 0)
		l := newLine()
		calls := []*Call{join(l, cfg, 0, "", now), join(l, cfg, 0, "", now), join(l, cfg, 0, "", now)}
		l.handoff(cfg, now)
		woken := 0
		for _, c := range calls {
			select {
			case <-l.waker(c):
				woken++
				if c != calls[0] {
					t.Fatal("the slot went to a waiter that is not the head")
				}
			default:
			}
		}
		if woken != 1 {
			t.Fatalf("one release woke %d waiters", woken)
		}
		// A waiter that does not answer a handed slot is set aside by the
		// poller after a round, and the next is handed one.
		l.polled(cfg, now)
		l.polled(cfg, now)
		if _, in := l.entries[calls[0]]; in {
			t.Fatal("a waiter that never answered stays in line")
		}
		if l.admit(calls[0], cfg, now) {
			t.Fatal("a waiter set aside takes its place back when it asks")
		}
	})
}
