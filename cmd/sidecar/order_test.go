package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/redistest"
	"github.com/polygate/polygate/internal/sidecartest"
)

// Ordered admission and shadow mode over the wire, on the real binary with
// the memory backend and with Redis, where the line is the fleet's (issue
// 14). The tests compare orders and counts, never durations.

// orderBackend is where the sidecars of an ordering test keep their line.
type orderBackend struct {
	name string
	// config is the backend's part of the configuration file.
	config func(t *testing.T) string
}

var orderBackends = []orderBackend{
	{"Memory", func(*testing.T) string { return "" }},
	{"Redis", func(t *testing.T) string {
		// A roomy timeout: the handoff test starts 1 000 waiters at once,
		// whose reads queue for the client's pool on a busy machine.
		return fmt.Sprintf("backend:\n  kind: redis\n  redis: {addrs: [%q], timeout: 10s}", redistest.Start(t).Addr)
	}},
}

// eachBackend runs f on every backend.
func eachBackend(t *testing.T, f func(t *testing.T, be orderBackend)) {
	for _, be := range orderBackends {
		t.Run(be.name, func(t *testing.T) { f(t, be) })
	}
}

func startScope(t *testing.T, scope string, extra ...string) (*sidecartest.Sidecar, admissionv1.AdmissionServiceClient) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	body := ""
	for _, e := range extra {
		body += e + "\n"
	}
	if err := os.WriteFile(file, []byte(body+"scopes:\n"+scope), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	client, _ := dial(t, s.Addr)
	return s, client
}

// queue drives calls of one scope and logs their grants in order.
type queue struct {
	t       *testing.T
	ctx     context.Context
	c       admissionv1.AdmissionServiceClient
	scope   string
	attempt time.Duration // how long an attempt holds its permit
	tokens  int64         // each call's estimated_tokens

	// via is the client of the sidecar a label's calls go to (default c).
	via map[string]admissionv1.AdmissionServiceClient

	picks atomic.Int64
	mu    sync.Mutex
	order []string // labels, in grant order
	waits map[string][]time.Duration
	wg    sync.WaitGroup
}

func newQueue(t *testing.T, c admissionv1.AdmissionServiceClient, scope string, attempt time.Duration) *queue {
	return &queue{t: t, ctx: testContext(t), c: c, scope: scope, attempt: attempt, waits: map[string][]time.Duration{},
		via: map[string]admissionv1.AdmissionServiceClient{}}
}

// hold opens a call and keeps its permit until release is called.
func (q *queue) hold() (release func()) {
	q.t.Helper()
	p, err := q.c.Pick(q.ctx, &admissionv1.PickRequest{Scope: q.scope})
	if err != nil || p.GetGrant() == nil {
		q.t.Fatalf("blocker: %v %v", p, err)
	}
	return func() {
		if _, err := q.c.RecordOutcome(q.ctx, &admissionv1.RecordOutcomeRequest{Scope: q.scope, CallId: p.GetCallId(),
			PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}); err != nil {
			q.t.Errorf("release: %v", err)
		}
	}
}

// call runs one call in the background: Pick, wait in line, and on a grant
// log label, hold the permit for the attempt and report success.
func (q *queue) call(label string, priority int32, tenant string) {
	c := q.c
	if v, ok := q.via[label]; ok {
		c = v
	}
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		start := time.Now()
		req := &admissionv1.PickRequest{Scope: q.scope, Priority: priority, Tenant: tenant, EstimatedTokens: q.tokens}
		for {
			q.picks.Add(1)
			p, err := c.Pick(q.ctx, req)
			if err != nil {
				q.t.Errorf("%s: Pick: %v", label, err)
				return
			}
			req = &admissionv1.PickRequest{Scope: q.scope, CallId: p.GetCallId()}
			if g := p.GetGrant(); g != nil {
				q.mu.Lock()
				q.order = append(q.order, label)
				q.waits[label] = append(q.waits[label], time.Since(start))
				q.mu.Unlock()
				if q.attempt > 0 {
					time.Sleep(q.attempt) // the attempt itself
				}
				if _, err := c.RecordOutcome(q.ctx, &admissionv1.RecordOutcomeRequest{Scope: q.scope, CallId: p.GetCallId(),
					PermitId: g.GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}); err != nil {
					q.t.Errorf("%s: RecordOutcome: %v", label, err)
				}
				return
			}
			if p.GetNoRunnable() == nil {
				q.t.Errorf("%s: %v", label, p)
				return
			}
			d, err := c.OnNoRunnable(q.ctx, &admissionv1.OnNoRunnableRequest{Scope: q.scope, CallId: p.GetCallId()})
			if err != nil || d.GetWait() == nil {
				q.t.Errorf("%s: OnNoRunnable: %v %v", label, d, err)
				return
			}
		}
	}()
}

// line reads the scope's line from DescribeScope.
func (q *queue) line() *admissionv1.SourceLine {
	d, err := q.c.DescribeScope(q.ctx, &admissionv1.DescribeScopeRequest{Scope: q.scope})
	if err != nil {
		q.t.Fatal(err)
	}
	return d.GetScope().GetSources()[0].GetLine()
}

// until polls cond until it holds or the test's context ends.
func (q *queue) until(what string, cond func() bool) {
	q.t.Helper()
	for !cond() {
		select {
		case <-q.ctx.Done():
			q.t.Fatalf("waiting for %s: %v", what, q.ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (q *queue) granted() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.order)
}

// percentiles logs wait-time percentiles per label.
func (q *queue) percentiles() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, label := range slices.Sorted(func(yield func(string) bool) {
		for k := range q.waits {
			if !yield(k) {
				return
			}
		}
	}) {
		w := slices.Clone(q.waits[label])
		slices.Sort(w)
		pct := func(p int) time.Duration { return w[min(len(w)-1, len(w)*p/100)] }
		q.t.Logf("wait %-8s n=%4d p50=%v p90=%v p99=%v max=%v", label, len(w), pct(50).Round(time.Millisecond),
			pct(90).Round(time.Millisecond), pct(99).Round(time.Millisecond), w[len(w)-1].Round(time.Millisecond))
	}
}

// nth is the index in order of label's nth grant (from 1), or -1.
func nth(order []string, label string, n int) int {
	seen := 0
	for i, l := range order {
		if l == label {
			if seen++; seen == n {
				return i
			}
		}
	}
	return -1
}

// fairShare: tenant a opens 200 calls and b 20, at once, on a scope of two
// slots and attempts of 50ms. With sidecars 2 (on Redis), a's calls go to
// one sidecar and b's to the other.
func fairShare(t *testing.T, be orderBackend, sidecars int, weights string) []string {
	scope := fmt.Sprintf(`  chat:
    backpressure: {poll_interval: 100ms}
    tenants: %s
    sources: [{name: only, max_concurrency: 2}]
`, weights)
	backend := be.config(t)
	_, client := startScope(t, scope, backend)
	q := newQueue(t, client, "chat", 50*time.Millisecond)
	if sidecars == 2 {
		_, other := startScope(t, scope, backend)
		q.via["b"] = other
	}
	r1, r2 := q.hold(), q.hold()
	for i := range 200 {
		q.call("a", 0, "a")
		if i < 20 {
			q.call("b", 0, "b")
		}
	}
	q.until("220 calls in line", func() bool { return q.line().GetLength() == 220 })
	r1()
	r2()
	q.wg.Wait()
	q.percentiles()
	return q.granted()
}

func TestFairShareAcrossTenants(t *testing.T) {
	eachBackend(t, func(t *testing.T, be orderBackend) { testFairShare(t, be, 1) })
}

// TestFairShareAcrossSidecars: on Redis the line is the fleet's: tenant a's
// calls on one sidecar and b's on another share the slots by weight.
func TestFairShareAcrossSidecars(t *testing.T) {
	testFairShare(t, orderBackends[1], 2)
}

func testFairShare(t *testing.T, be orderBackend, sidecars int) {
	t.Run("EqualWeights", func(t *testing.T) {
		order := fairShare(t, be, sidecars, "{a: 1, b: 1}")
		// Alternating: B's 20th grant comes before A's 60th, in fact
		// around the 40th grant of all.
		if b20, a60 := nth(order, "b", 20), nth(order, "a", 60); b20 < 0 || b20 > a60 {
			t.Fatalf("b's 20th grant at %d, a's 60th at %d: %v", b20, a60, order)
		}
		if a := countOf(order[:40], "a"); a < 19 || a > 21 {
			t.Fatalf("first 40 grants: %d of a, want 20 ± 1: %v", a, order[:40])
		}
	})
	t.Run("ThreeToOne", func(t *testing.T) {
		order := fairShare(t, be, sidecars, "{a: 3, b: 1}")
		if a := countOf(order[:80], "a"); a < 58 || a > 62 {
			t.Fatalf("first 80 grants: %d of a, want 60 ± 2 (3:1): %v", a, order[:80])
		}
	})
}

func countOf(order []string, label string) int {
	n := 0
	for _, l := range order {
		if l == label {
			n++
		}
	}
	return n
}

// sources reads the scope's sources from DescribeScope, by name.
func (q *queue) sources() map[string]*admissionv1.SourceState {
	d, err := q.c.DescribeScope(q.ctx, &admissionv1.DescribeScopeRequest{Scope: q.scope})
	if err != nil {
		q.t.Fatal(err)
	}
	out := map[string]*admissionv1.SourceState{}
	for _, s := range d.GetScope().GetSources() {
		out[s.GetName()] = s
	}
	return out
}

// TestLinePerSource: each source has its own line. Source a is full with
// three calls in its line (too big for b's tpm, they wait for a alone);
// b is free with nobody in its line: a newcomer that fits b is refused
// queued on a and granted on b. The release on a then serves a's line.
func TestLinePerSource(t *testing.T) { eachBackend(t, testLinePerSource) }

func testLinePerSource(t *testing.T, be orderBackend) {
	_, client := startScope(t, `  chat:
    backpressure: {poll_interval: 100ms}
    sources: [{name: a, max_concurrency: 1}, {name: b, max_concurrency: 1, tpm: 50}]
`, be.config(t))
	q := newQueue(t, client, "chat", 0)
	q.tokens = 100 // beyond b's tpm: a's calls
	holder, err := q.c.Pick(q.ctx, &admissionv1.PickRequest{Scope: q.scope, EstimatedTokens: q.tokens})
	if err != nil || holder.GetGrant().GetSource() != "a" {
		t.Fatalf("holder: %v %v, want a grant on a", holder, err)
	}
	for range 3 {
		q.call("w", 0, "")
	}
	q.until("3 calls in a's line", func() bool { return q.sources()["a"].GetLine().GetLength() == 3 })
	if n := q.sources()["b"].GetLine().GetLength(); n != 0 {
		t.Fatalf("b's line: %d waiting, want none (the calls are too big for b)", n)
	}
	p, err := q.c.Pick(q.ctx, &admissionv1.PickRequest{Scope: q.scope, EstimatedTokens: 10})
	if err != nil || p.GetGrant().GetSource() != "b" {
		t.Fatalf("a newcomer, a full with a line and b free: %v %v, want a grant on b", p, err)
	}
	if _, err := q.c.RecordOutcome(q.ctx, &admissionv1.RecordOutcomeRequest{Scope: q.scope, CallId: holder.GetCallId(),
		PermitId: holder.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}); err != nil {
		t.Fatalf("release on a: %v", err)
	}
	q.wg.Wait()
	if got := q.granted(); len(got) != 3 {
		t.Fatalf("granted %v, want a's 3 waiters", got)
	}
	if n := q.sources()["a"].GetLine().GetLength(); n != 0 {
		t.Fatalf("a's line after serving it: %d waiting", n)
	}
}

func TestPriorityGoesFirst(t *testing.T) { eachBackend(t, testPriorityGoesFirst) }

func testPriorityGoesFirst(t *testing.T, be orderBackend) {
	_, client := startScope(t, `  chat:
    backpressure: {poll_interval: 500ms}
    default_tenant: {max_priority: 10} # callers that name no tenant may rank up to 10
    sources: [{name: only, max_concurrency: 1}]
`, be.config(t))
	q := newQueue(t, client, "chat", 0)
	release := q.hold()
	for range 100 {
		q.call("p0", 0, "")
	}
	q.until("100 calls in line", func() bool { return q.line().GetLength() == 100 })
	q.call("p10", 10, "")
	q.until("101 calls in line", func() bool { return q.line().GetLength() == 101 })
	release()
	q.wg.Wait()
	q.percentiles()
	if order := q.granted(); order[0] != "p10" {
		t.Fatalf("first grant after the release: %s, want p10", order[0])
	}
}

// TestPriorityAcrossSidecars: on Redis a priority-10 call held by one
// sidecar is served before 20 priority-0 calls held by another.
func TestPriorityAcrossSidecars(t *testing.T) {
	scope := `  chat:
    backpressure: {poll_interval: 100ms}
    default_tenant: {max_priority: 10}
    sources: [{name: only, max_concurrency: 1}]
`
	backend := orderBackends[1].config(t)
	_, client := startScope(t, scope, backend)
	_, other := startScope(t, scope, backend)
	q := newQueue(t, client, "chat", 0)
	q.via["p10"] = other
	release := q.hold()
	for range 20 {
		q.call("p0", 0, "")
	}
	q.until("20 calls in line", func() bool { return q.line().GetLength() == 20 })
	q.call("p10", 10, "")
	q.until("21 calls in line", func() bool { return q.line().GetLength() == 21 })
	release()
	q.wg.Wait()
	q.percentiles()
	if order := q.granted(); order[0] != "p10" {
		t.Fatalf("first grant after the release: %s, want p10 (held by the other sidecar)", order[0])
	}
}

func TestAgingServesTheOldFirst(t *testing.T) { eachBackend(t, testAgingServesTheOldFirst) }

func testAgingServesTheOldFirst(t *testing.T, be orderBackend) {
	const aging = 100 * time.Millisecond
	_, client := startScope(t, fmt.Sprintf(`  chat:
    backpressure: {poll_interval: 500ms}
    priority_aging: %v
    default_tenant: {max_priority: 10}
    sources: [{name: only, max_concurrency: 1}]
`, aging), be.config(t))
	q := newQueue(t, client, "chat", 0)
	release := q.hold()
	q.call("old-p0", 0, "")
	// Past 12 horizons the old call's effective priority is above 10 plus
	// whatever the newer calls gain meanwhile.
	q.until("the old call to age", func() bool {
		l := q.line()
		return l.GetLength() == 1 && l.GetOldestWait().AsDuration() > 12*aging
	})
	for range 5 {
		q.call("new-p10", 10, "")
	}
	q.until("6 calls in line", func() bool { return q.line().GetLength() == 6 })
	release()
	q.wg.Wait()
	q.percentiles()
	if order := q.granted(); order[0] != "old-p0" {
		t.Fatalf("grant order %v, want the aged call first", order)
	}
}

// TestHandoffWakesOnlyTheHead: 1 000 calls held on a full source; each
// release makes exactly one Pick reach the sidecar, the head's.
func TestHandoffWakesOnlyTheHead(t *testing.T) { eachBackend(t, testHandoffWakesOnlyTheHead) }

func testHandoffWakesOnlyTheHead(t *testing.T, be orderBackend) {
	_, client := startScope(t, `  chat:
    backpressure: {poll_interval: 500ms}
    sources: [{name: only, max_concurrency: 1}]
`, "limits: {max_streams_per_connection: 2000}", be.config(t)) // 1000 held on one connection
	q := newQueue(t, client, "chat", 0)
	// The calls keep their permits until the test lets them go, one by one.
	release := q.hold()
	next := make(chan struct{})
	holding := make(chan string, 1000)
	run := func(label string) {
		q.wg.Add(1)
		go func() {
			defer q.wg.Done()
			req := &admissionv1.PickRequest{Scope: "chat"}
			for {
				q.picks.Add(1)
				p, err := client.Pick(q.ctx, req)
				if err != nil {
					t.Errorf("%s: %v", label, err)
					return
				}
				req.CallId = p.GetCallId()
				if g := p.GetGrant(); g != nil {
					q.mu.Lock()
					q.order = append(q.order, label)
					q.mu.Unlock()
					holding <- label
					<-next
					if _, err := client.RecordOutcome(q.ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(),
						PermitId: g.GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}); err != nil {
						t.Errorf("%s: %v", label, err)
					}
					return
				}
				if _, err := client.OnNoRunnable(q.ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.GetCallId()}); err != nil {
					t.Errorf("%s: %v", label, err)
					return
				}
			}
		}()
	}
	run("head")
	q.until("the head in line", func() bool { return q.line().GetLength() == 1 })
	for i := range 999 {
		run(fmt.Sprint("w", i))
	}
	q.until("1000 calls in line", func() bool { return q.line().GetLength() == 1000 })
	q.until("every call's first Pick", func() bool { return q.picks.Load() >= 1000 })

	before := q.picks.Load()
	release()
	if got := <-holding; got != "head" {
		t.Fatalf("the first grant went to %s, want the head of the line", got)
	}
	// Each further release (the holder reports) hands the slot to exactly
	// one waiter: one Pick per release.
	for k := int64(1); k <= 20; k++ {
		if n := q.picks.Load() - before; n != k {
			t.Fatalf("after %d releases, %d Picks reached the sidecar", k, n)
		}
		next <- struct{}{}
		<-holding
	}
	t.Logf("20 releases with 1000 waiters: %d Picks", q.picks.Load()-before)
	close(next) // the rest go through without waiting for the test
	q.wg.Wait()
}

// TestKilledReplicaLeavesTheLine: on Redis, a waiter at the head of the
// fleet's line whose sidecar is killed leaves the line within its lease,
// and the slot goes to the next waiter, held by another sidecar.
func TestKilledReplicaLeavesTheLine(t *testing.T) {
	scope := `  chat:
    backpressure: {poll_interval: 100ms}
    sources: [{name: only, max_concurrency: 1}]
`
	backend := orderBackends[1].config(t)
	_, client := startScope(t, scope, backend)
	doomed, doomedClient := startScope(t, scope, backend)
	q := newQueue(t, client, "chat", 0)
	release := q.hold()
	go func() {
		// Ranked first, held by the sidecar about to be killed; its RPCs
		// end with the process.
		p, err := doomedClient.Pick(q.ctx, &admissionv1.PickRequest{Scope: "chat", Priority: 10})
		if err != nil || p.GetNoRunnable() == nil {
			return
		}
		_, _ = doomedClient.OnNoRunnable(q.ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.GetCallId()})
	}()
	q.until("the doomed waiter in line", func() bool { return q.line().GetLength() == 1 })
	q.call("survivor", 0, "")
	q.until("2 calls in line", func() bool { return q.line().GetLength() == 2 })
	doomed.Signal(t, syscall.SIGKILL)
	release()
	q.wg.Wait()
	if order := q.granted(); !slices.Equal(order, []string{"survivor"}) {
		t.Fatalf("grants %v, want the survivor's", order)
	}
	q.until("an empty line", func() bool { return q.line().GetLength() == 0 })
	q.percentiles()
}

// TestShadowModeGrantsAndReports: a scope in shadow mode grants every Pick,
// lists the would-be refusals on the grant and in the metrics, and its
// breaker still opens, probes and closes.
func TestShadowModeGrantsAndReports(t *testing.T) {
	const cooldown = 2 * time.Second
	metricsAddr := freeTCPAddr(t)
	s, client := startScope(t, fmt.Sprintf(`  chat:
    mode: shadow
    backoff: {base: 1ms, max: 1ms}
    breaker: {fail_threshold: 1, cooldown: %v, max_cooldown: %v}
    sources: [{name: only, max_concurrency: 1}]
`, cooldown, cooldown), "metrics_listen: "+metricsAddr)
	ctx := testContext(t)
	pickCall := func() (string, *admissionv1.Grant) {
		t.Helper()
		p, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
		if err != nil || p.GetGrant() == nil || !p.GetGrant().GetShadow() {
			t.Fatalf("Pick in shadow mode: %v %v", p, err)
		}
		return p.GetCallId(), p.GetGrant()
	}
	record := func(call string, g *admissionv1.Grant, o admissionv1.Outcome) *admissionv1.RecordOutcomeResponse {
		t.Helper()
		r, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: call, PermitId: g.GetPermitId(), Outcome: o})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	describe := func() *admissionv1.ScopeDescription {
		d, err := client.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
		if err != nil {
			t.Fatal(err)
		}
		return d.GetScope()
	}
	reasons := func(g *admissionv1.Grant) []admissionv1.Reason {
		var rs []admissionv1.Reason
		for _, r := range g.GetShadowRefusals() {
			rs = append(rs, r.GetReason())
		}
		return rs
	}

	if d := describe(); d.GetConfig().GetMode() != admissionv1.ScopeMode_SCOPE_MODE_SHADOW {
		t.Fatalf("DescribeScope mode %v", d.GetConfig().GetMode())
	}
	if !strings.Contains(s.Logs(), "shadow_scopes=[chat]") {
		t.Fatalf("the start log does not name the shadow scope:\n%s", s.Logs())
	}
	// A takes the only slot, as enforcing would.
	a, ga := pickCall()
	if len(ga.GetShadowRefusals()) != 0 {
		t.Fatalf("A: %v", ga)
	}
	// The quota is full: B is granted anyway, without a slot.
	b, gb := pickCall()
	if got := reasons(gb); !slices.Equal(got, []admissionv1.Reason{admissionv1.Reason_REASON_RATE_LIMITED}) {
		t.Fatalf("B's would-be refusals %v", got)
	}
	if in := describe().GetSources()[0].GetInFlight(); in != 1 {
		t.Fatalf("in_flight %d after a shadow grant, want 1 (only what enforcement admits)", in)
	}
	// A fails: the breaker opens, as when enforcing.
	if r := record(a, ga, admissionv1.Outcome_OUTCOME_TRANSIENT); r.GetBreakerState() != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("A's failure: %v", r)
	}
	// C while OPEN: granted, would have been refused by the breaker (unless
	// the machine is so slow that the cooldown already ended: then C is the
	// probe).
	c, gc := pickCall()
	var probe *admissionv1.Grant
	var pc string
	sawOpen := !gc.GetProbe()
	if sawOpen {
		if got := reasons(gc); len(got) != 1 || (got[0] != admissionv1.Reason_REASON_CIRCUIT_OPEN && got[0] != admissionv1.Reason_REASON_COOLDOWN) {
			t.Fatalf("C's would-be refusals %v", got)
		}
	} else {
		probe, pc = gc, c
	}
	// Outcomes of shadow-only grants change nothing: B's success is stale.
	if r := record(b, gb, admissionv1.Outcome_OUTCOME_SUCCESS); r.GetEffect() != admissionv1.OutcomeEffect_OUTCOME_EFFECT_STALE {
		t.Fatalf("B's success: %v", r)
	}
	if sawOpen {
		record(c, gc, admissionv1.Outcome_OUTCOME_SUCCESS)
		// After the cooldown the next Pick is the breaker's real probe; its
		// success closes the breaker.
		for describe().GetSources()[0].GetState() != admissionv1.BreakerState_BREAKER_STATE_HALF_OPEN {
			select {
			case <-ctx.Done():
				t.Fatalf("the breaker did not reach HALF_OPEN: %v", ctx.Err())
			case <-time.After(cooldown / 10):
			}
		}
	}
	for probe == nil {
		call, g := pickCall()
		if g.GetProbe() {
			probe, pc = g, call
			break
		}
		record(call, g, admissionv1.Outcome_OUTCOME_CANCELLED)
	}
	if r := record(pc, probe, admissionv1.Outcome_OUTCOME_SUCCESS); r.GetBreakerState() != admissionv1.BreakerState_BREAKER_STATE_CLOSED {
		t.Fatalf("probe's success: %v", r)
	}
	for _, want := range []string{
		`polygate_shadow_refusals_total{reason="rate_limited",scope="chat",source="only"}`,
	} {
		if line := scrapeLine(t, ctx, metricsAddr, want); line != want+" 1" {
			t.Errorf("metrics: %q, want %q", line, want+" 1")
		}
	}
	open := scrapeLine(t, ctx, metricsAddr, `polygate_shadow_refusals_total{reason="circuit_open",scope="chat",source="only"}`) +
		scrapeLine(t, ctx, metricsAddr, `polygate_shadow_refusals_total{reason="cooldown",scope="chat",source="only"}`)
	if sawOpen && open == "" {
		t.Errorf("metrics count no breaker refusal in shadow mode")
	}
}
