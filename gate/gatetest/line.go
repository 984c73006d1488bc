package gatetest

import (
	"slices"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// The line's contract (gate/line.go): the order (priority with aging, then
// weighted fair share, then arrival), newcomers against the head, handoff to
// the first waiter not called, and waiters that vanish or leave.

const lineLease = time.Second

// waiter is a waiter of replica r1; tenant a weighs 2, the others 1.
func waiter(id string, prio int32, tenant string, opts ...func(*gate.Waiter)) *gate.Waiter {
	w := &gate.Waiter{ID: id, Replica: "r1", Priority: prio, Tenant: tenant, Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: lineLease}
	switch tenant {
	case "a":
		w.Weight = 2
	}
	for _, o := range opts {
		o(w)
	}
	return w
}

// join gives w a place (the Peek of a caller that waits).
func (e *env) join(src *gate.Source, w *gate.Waiter) {
	e.t.Helper()
	v := e.readLine(src, &gate.LineRead{Replica: w.Replica, Lease: w.Lease, Join: w, Joins: []string{src.Name}})
	if v.Place == "" {
		e.t.Fatalf("join %s: no place", w.ID)
	}
	if w.Places == nil {
		w.Places = map[string]string{}
	}
	w.Places[src.Name] = v.Place
}

func (e *env) readLine(src *gate.Source, r *gate.LineRead) gate.LineView {
	e.t.Helper()
	s, err := e.b.Peek(e.ctx, gate.PeekRequest{Scope: e.scope, Sources: []*gate.Source{src}, Line: r})
	if err != nil {
		e.t.Fatalf("Peek: %v", err)
	}
	return s.Sources[0].Line
}

// pick is w's Pick on src.
func (e *env) pick(src *gate.Source, w *gate.Waiter) gate.Admission {
	e.t.Helper()
	a, err := e.b.Admit(e.ctx, gate.AdmitRequest{Scope: e.scope, PermitID: e.nextID(), Line: w,
		Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}}})
	if err != nil {
		e.t.Fatalf("Admit: %v", err)
	}
	if queued(a) && len(a.Events) > 0 {
		e.t.Fatalf("a queued Pick asked the source: %+v", a)
	}
	w.Places = a.Places
	return a
}

// queued reports whether a one-candidate Pick was refused by the line.
func queued(a gate.Admission) bool {
	return len(a.Rejections) == 1 && a.Rejections[0].Reason == gate.ReasonQueued
}

// serve lets every waiter Pick, again and again, and returns the ids in the
// order they were granted: in each round exactly the head passes.
func (e *env) serve(src *gate.Source, ws []*gate.Waiter) []string {
	e.t.Helper()
	var order []string
	for len(ws) > 0 {
		i := slices.IndexFunc(ws, func(w *gate.Waiter) bool { return e.pick(src, w).Granted })
		if i < 0 {
			e.t.Fatalf("nobody of %d waiters passes; granted so far %v", len(ws), order)
		}
		order = append(order, ws[i].ID)
		ws = slices.Delete(ws, i, i+1)
	}
	return order
}

// one is a source of n slots.
func one(n int) *gate.Source {
	return Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = n })
}

func runLine(t *testing.T, factory Factory) {
	roomy := Src("s")
	t.Run("Order", func(t *testing.T) {
		e := newEnv(t, factory)
		var ws []*gate.Waiter
		for _, w := range []*gate.Waiter{
			waiter("a1", 0, "a"), waiter("a2", 0, "a"), waiter("a3", 0, "a"),
			waiter("b1", 0, "b"), waiter("b2", 0, "b"), waiter("b3", 0, "b"),
			waiter("c1", 5, "c"),
		} {
			e.join(roomy, w)
			ws = append(ws, w)
		}
		// Priority first; then a (weight 2) gets two grants to b's one;
		// then arrival.
		want := []string{"c1", "a1", "a2", "b1", "a3", "b2", "b3"}
		if got := e.serve(roomy, ws); !slices.Equal(got, want) {
			t.Fatalf("order %v, want %v", got, want)
		}
		if v := e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease, Describe: true}); v.Length != 0 {
			t.Fatalf("line after serving everyone: %+v", v)
		}
	})
	t.Run("NoBankedShare", func(t *testing.T) {
		// b joins after a's first grant: it starts where the line is, not
		// with credit for the time it had nobody waiting.
		e := newEnv(t, factory)
		a := []*gate.Waiter{waiter("a1", 0, "c"), waiter("a2", 0, "c"), waiter("a3", 0, "c"), waiter("a4", 0, "c")}
		for _, w := range a {
			e.join(roomy, w)
		}
		got := e.serve(roomy, a[:1])
		b := []*gate.Waiter{waiter("b1", 0, "b"), waiter("b2", 0, "b")}
		for _, w := range b {
			e.join(roomy, w)
		}
		got = append(got, e.serve(roomy, append(a[1:], b...))...)
		if want := []string{"a1", "a2", "b1", "a3", "b2", "a4"}; !slices.Equal(got, want) {
			t.Fatalf("order %v, want %v", got, want)
		}
	})
	t.Run("Aging", func(t *testing.T) {
		for _, aging := range []time.Duration{0, time.Second} {
			e := newEnv(t, factory)
			age := func(w *gate.Waiter) { w.Aging = aging }
			old := waiter("old", 0, "x", age)
			e.join(roomy, old)
			e.clock.Advance(800 * time.Millisecond) // the replica stays heard of
			e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease})
			e.clock.Advance(800 * time.Millisecond)
			e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease})
			e.clock.Advance(800 * time.Millisecond)
			e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease})
			young := waiter("young", 1, "x", age)
			e.join(roomy, young)
			want := []string{"young", "old"}
			if aging > 0 {
				want = []string{"old", "young"} // one horizon and more behind
			}
			if got := e.serve(roomy, []*gate.Waiter{young, old}); !slices.Equal(got, want) {
				t.Fatalf("aging %v: order %v, want %v", aging, got, want)
			}
		}
	})
	t.Run("Newcomer", func(t *testing.T) {
		e := newEnv(t, factory)
		w := waiter("w", 0, "x")
		e.join(roomy, w)
		if a := e.pick(roomy, waiter("same", 0, "x")); !queued(a) || len(a.Places) != 0 {
			t.Fatalf("a newcomer behind the head: %+v, want queued without a place", a)
		}
		if a := e.pick(roomy, waiter("urgent", 1, "x")); !a.Granted {
			t.Fatalf("a newcomer ranked before the head: %+v, want granted", a)
		}
		if a := e.pick(roomy, w); !a.Granted || len(a.Places) != 0 {
			t.Fatalf("the head: %+v", a)
		}
		if a := e.pick(roomy, waiter("late", 0, "x")); !a.Granted || queued(a) {
			t.Fatalf("a newcomer to an empty line: %+v", a)
		}
	})
	runLineService(t, factory)
}
