package gatetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// runLineService is the line's contract past its order: handoff of a
// released slot, wake-ups, waiters that vanish, leave or are set aside,
// the describe, one line per source, and the cap.
func runLineService(t *testing.T, factory Factory) {
	roomy := Src("s")
	t.Run("Handoff", func(t *testing.T) {
		e := newEnv(t, factory)
		src := one(2)
		p1, p2 := e.grant(src), e.grant(src)
		w1, w2, w3 := waiter("w1", 0, "x"), waiter("w2", 0, "x"), waiter("w3", 0, "x")
		for _, w := range []*gate.Waiter{w1, w2, w3} {
			e.join(src, w)
		}
		// The head asks and is refused for capacity: it keeps its place.
		if a := e.pick(src, w1); queued(a) || a.Granted || len(a.Places) == 0 {
			t.Fatalf("the head on a full source: %+v", a)
		}
		handoff := &gate.LineHandoff{Replica: "r1", Lease: lineLease}
		settle := func(p gate.Permit) string {
			return e.settleReq(gate.SettleRequest{Source: src, PermitID: p.ID, Epoch: p.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1, Line: handoff}).Handoff
		}
		// Two releases call the first two waiters; the third stays queued.
		if h := settle(p1); h != "w1" {
			t.Fatalf("first release handed to %q, want w1", h)
		}
		if h := settle(p2); h != "w2" {
			t.Fatalf("second release handed to %q, want w2", h)
		}
		if a := e.pick(src, w3); !queued(a) {
			t.Fatalf("w3 behind two called waiters: %+v", a)
		}
		// The poller's read wakes the called waiters, not the next one.
		if v := e.readLine(src, &gate.LineRead{Replica: "r1", Lease: lineLease}); !slices.Equal(v.Wake, []string{"w1", "w2"}) || v.Head != "" {
			t.Fatalf("front %+v, want the two called waiters and no head", v)
		}
		if a := e.pick(src, w2); !a.Granted {
			t.Fatalf("w2, called: %+v", a)
		}
		if a := e.pick(src, w1); !a.Granted {
			t.Fatalf("w1, called: %+v", a)
		}
		if a := e.pick(src, w3); queued(a) || a.Granted {
			t.Fatalf("w3 at the head on a full source: %+v", a)
		}
	})
	t.Run("Wake", func(t *testing.T) {
		e := newEnv(t, factory)
		other := func(w *gate.Waiter) { w.Replica = "r2" }
		w1, w2, w3 := waiter("w1", 0, "x", other), waiter("w2", 0, "x"), waiter("w3", 0, "x")
		for _, w := range []*gate.Waiter{w1, w2, w3} {
			e.join(roomy, w)
		}
		read := func(replica string) gate.LineView {
			return e.readLine(roomy, &gate.LineRead{Replica: replica, Lease: lineLease})
		}
		if got := read("r2"); got.Head != "w1" || len(got.Wake) != 0 {
			t.Fatalf("r2's front: %+v, want its head w1", got)
		}
		if got := read("r1"); got.Head != "" || len(got.Wake) != 0 {
			t.Fatalf("r1's front: %+v, want none (r2's waiter is the head)", got)
		}
	})
	t.Run("Vanish", func(t *testing.T) {
		e := newEnv(t, factory)
		gone := waiter("gone", 1, "x", func(w *gate.Waiter) { w.Replica = "r2" })
		stays := waiter("stays", 0, "x")
		e.join(roomy, gone)
		e.join(roomy, stays)
		if a := e.pick(roomy, stays); !queued(a) {
			t.Fatalf("behind a live replica's waiter: %+v", a)
		}
		// r2 is not heard of for longer than its lease; r1 is.
		for range 3 {
			e.clock.Advance(lineLease / 2)
			e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease})
		}
		if a := e.pick(roomy, stays); !a.Granted {
			t.Fatalf("behind a silent replica's waiter: %+v, want granted", a)
		}
	})
	t.Run("CalledSetAside", func(t *testing.T) {
		e := newEnv(t, factory)
		src := one(1)
		p := e.grant(src)
		slow, next := waiter("slow", 0, "x"), waiter("next", 0, "x")
		e.join(src, slow)
		e.join(src, next)
		if h := e.settleReq(gate.SettleRequest{Source: src, PermitID: p.ID, Epoch: p.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1,
			Line: &gate.LineHandoff{Replica: "r1", Lease: lineLease}}).Handoff; h != "slow" {
			t.Fatalf("handed to %q, want slow", h)
		}
		e.clock.Advance(2 * lineLease)
		if v := e.readLine(src, &gate.LineRead{Replica: "r1", Lease: lineLease}); v.Length != 1 || v.Head != "next" || len(v.Wake) != 0 {
			t.Fatalf("after the called waiter did not ask: %+v, want only next", v)
		}
		// It takes its place back when it asks at last.
		if a := e.pick(src, slow); !a.Granted {
			t.Fatalf("the waiter set aside, asking: %+v", a)
		}
	})
	t.Run("LeaveAndDescribe", func(t *testing.T) {
		e := newEnv(t, factory)
		few := func(w *gate.Waiter) { w.MaxTenants = 1 }
		ws := []*gate.Waiter{waiter("a1", 0, "a", few), waiter("b1", 0, "b", few), waiter("b2", 2, "b", few)}
		for _, w := range ws {
			e.join(roomy, w)
			e.clock.Advance(100 * time.Millisecond)
		}
		v := e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease, Describe: true})
		want := []gate.LineGroup{{Priority: 2, Tenant: gate.OverflowTenant, Waiting: 1}, {Priority: 0, Tenant: gate.OverflowTenant, Waiting: 1}, {Priority: 0, Tenant: "a", Waiting: 1}}
		gate.SortGroups(want)
		if v.Length != 3 || v.Oldest != 300*time.Millisecond || !slices.Equal(v.Groups, want) {
			t.Fatalf("line %+v, want 3 waiting for 300ms in %v", v, want)
		}
		if err := e.b.Leave(e.ctx, gate.LeaveRequest{Scope: e.scope, Waiter: "b2", Sources: []string{roomy.Name}}); err != nil {
			t.Fatal(err)
		}
		if got := e.serve(roomy, ws[:2]); !slices.Equal(got, []string{"a1", "b1"}) {
			t.Fatalf("after b2 left: %v", got)
		}
	})
	t.Run("DescribeReadsTheFirstWaiters", func(t *testing.T) {
		// A describe counts the first DescribeMax waiters in line order
		// (those served next) and takes out those of a replica gone among
		// them; the length counts every waiter. The older waiters of
		// priority 0 are behind the others: neither their group nor their
		// wait shows.
		e := newEnv(t, factory)
		for i := range 3 {
			e.join(roomy, waiter(fmt.Sprintf("low%d", i), 0, "y"))
		}
		e.clock.Advance(time.Second)
		for i := range gate.DescribeMax {
			e.join(roomy, waiter(fmt.Sprintf("high%d", i), 1, "x"))
			if i == 0 { // second in line: not the head, which any read checks
				e.join(roomy, waiter("gone", 1, "x", func(w *gate.Waiter) { w.Replica = "r2" }))
			}
		}
		e.clock.Advance(lineLease / 2)
		e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease}) // r1 is heard of, r2 is not
		e.clock.Advance(lineLease/2 + time.Millisecond)
		v := e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease, Describe: true})
		want := []gate.LineGroup{{Priority: 1, Tenant: "x", Waiting: gate.DescribeMax - 1}}
		if v.Length != gate.DescribeMax+3 || v.Oldest != lineLease+time.Millisecond || !slices.Equal(v.Groups, want) {
			t.Fatalf("a line of %d, r2's waiter gone: length %d, oldest %v, groups %v; want %d, %v, %v",
				gate.DescribeMax+4, v.Length, v.Oldest, v.Groups, gate.DescribeMax+3, lineLease+time.Millisecond, want)
		}
	})
	t.Run("PerSource", func(t *testing.T) {
		// A is full with a line, B is free with none: a newcomer is refused
		// queued on A only, and granted on B.
		e := newEnv(t, factory)
		a := Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
		b := Src("b", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
		e.grant(a)
		e.join(a, waiter("w", 0, "x"))
		newcomer := waiter("new", 0, "x")
		got, err := e.b.Admit(e.ctx, gate.AdmitRequest{Scope: e.scope, PermitID: e.nextID(), Line: newcomer,
			Candidates: []gate.Candidate{{Source: a, Ceiling: 1}, {Source: b, Ceiling: 1}}})
		if err != nil {
			t.Fatalf("Admit: %v", err)
		}
		if !got.Granted || got.Permit.Source != "b" || len(got.Rejections) != 1 || got.Rejections[0] != (gate.Rejection{Source: "a", Reason: gate.ReasonQueued}) {
			t.Fatalf("a newcomer, A full with a line and B free: %+v, want granted on b after a queued refusal on a", got)
		}
		if len(got.Places) != 0 {
			t.Fatalf("the newcomer granted on b has places %v", got.Places)
		}
		// The line is A's alone: B shows none.
		snap, err := e.b.Peek(e.ctx, gate.PeekRequest{Scope: e.scope, Sources: []*gate.Source{a, b}, Line: &gate.LineRead{Replica: "r1", Lease: lineLease, Describe: true}})
		if err != nil {
			t.Fatalf("Peek: %v", err)
		}
		if snap.Sources[0].Line.Length != 1 || snap.Sources[1].Line.Length != 0 {
			t.Fatalf("lines a %+v, b %+v; want 1 and 0", snap.Sources[0].Line, snap.Sources[1].Line)
		}
	})
	t.Run("HandoffPerSource", func(t *testing.T) {
		// A release on A hands off A's head only, however B's line ranks.
		e := newEnv(t, factory)
		a := Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
		b := Src("b", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
		pa, pb := e.grant(a), e.grant(b)
		onB, onA := waiter("onB", 5, "x"), waiter("onA", 0, "x")
		e.join(b, onB)
		e.join(a, onA)
		handoff := &gate.LineHandoff{Replica: "r1", Lease: lineLease}
		settle := func(src *gate.Source, p gate.Permit) string {
			return e.settleReq(gate.SettleRequest{Source: src, PermitID: p.ID, Epoch: p.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1, Line: handoff}).Handoff
		}
		if h := settle(a, pa); h != "onA" {
			t.Fatalf("a release on a handed to %q, want onA", h)
		}
		if h := settle(b, pb); h != "onB" {
			t.Fatalf("a release on b handed to %q, want onB", h)
		}
		// A grant on one source leaves every line.
		both := waiter("both", 0, "y")
		e.join(a, both)
		e.join(b, both)
		got, err := e.b.Admit(e.ctx, gate.AdmitRequest{Scope: e.scope, PermitID: e.nextID(), Line: onA,
			Candidates: []gate.Candidate{{Source: a, Ceiling: 1}}})
		if err != nil || !got.Granted {
			t.Fatalf("onA, called: %+v, %v", got, err)
		}
		if err := e.b.Leave(e.ctx, gate.LeaveRequest{Scope: e.scope, Waiter: "onB", Sources: []string{"a", "b"}}); err != nil {
			t.Fatal(err)
		}
		got, err = e.b.Admit(e.ctx, gate.AdmitRequest{Scope: e.scope, PermitID: e.nextID(), Line: both,
			Candidates: []gate.Candidate{{Source: a, Ceiling: 1}, {Source: b, Ceiling: 1}}})
		if err != nil || !got.Granted || got.Permit.Source != "b" || len(got.Places) != 0 {
			t.Fatalf("both, at the head of a (full) and b (free): %+v, %v; want granted on b, in no line", got, err)
		}
		snap, err := e.b.Peek(e.ctx, gate.PeekRequest{Scope: e.scope, Sources: []*gate.Source{a, b}, Line: &gate.LineRead{Replica: "r1", Lease: lineLease}})
		if err != nil || snap.Sources[0].Line.Length != 0 || snap.Sources[1].Line.Length != 0 {
			t.Fatalf("lines after the grant: %+v, %v; want both empty", snap.Sources, err)
		}
	})
	t.Run("Cap", func(t *testing.T) {
		if testing.Short() {
			t.Skip("fills a line of gate.LineCap waiters")
		}
		e := newEnv(t, factory)
		for i := range gate.LineCap {
			e.join(roomy, waiter(fmt.Sprint("w", i), 0, "x"))
		}
		full := waiter("late", 5, "x")
		if v := e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease, Join: full, Joins: []string{roomy.Name}}); v.Place != "" || v.Length != gate.LineCap {
			t.Fatalf("joining a full line: %+v, want no place", v)
		}
		// Without a place it is a newcomer: ranked first, it goes to the walk.
		if a := e.pick(roomy, full); !a.Granted {
			t.Fatalf("a newcomer ranked first, the line full: %+v", a)
		}
	})
}
