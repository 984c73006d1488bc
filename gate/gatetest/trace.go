package gatetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// A Trace is a random but reproducible sequence of backend operations over a
// few sources: admissions over several candidates with pacer ceilings,
// settlements with random verdicts, floors and token counts (including
// repeated, late and forged ones), peeks, operator actions, configuration
// reloads and clock steps. Replaying one trace on two backends must give the
// same answer to every operation: Differential checks that.
type Trace struct {
	Seed int64
	// Variants[i] are the configurations source i takes; a reload switches.
	Variants [][]gate.Source
	// Tenants are the tenants an admit may name; every peek reads them.
	Tenants []gate.TenantCall
	Ops     []Op
}

// OpKind names an operation of a trace.
type OpKind uint8

const (
	OpAdvance OpKind = iota + 1
	OpAdmit
	OpSettle
	OpPeek
	OpOverride
	OpReload
)

func (k OpKind) String() string {
	return [...]string{"?", "advance", "admit", "settle", "peek", "override", "reload"}[min(int(k), 6)]
}

// Op is one operation. Which fields matter depends on Kind. Operations that
// depend on earlier answers (which permit to settle) name them by position,
// so a trace is fixed before it runs.
type Op struct {
	Kind OpKind
	// Advance: how far the clock moves.
	Advance time.Duration
	// Admit: the candidates (source indexes, in walk order), how far below
	// its max_concurrency each one's pacer ceiling is, and the tokens.
	Candidates []int
	Cut        []int
	Tokens     int64
	// Tenant is the admit's tenant, from 1 (0: none).
	Tenant int
	// Settle: the permit (index into the permits granted so far, modulo
	// their number), the verdict, an upstream floor, the actual tokens
	// (< 0 keeps the estimate), whether the attempt made progress, and
	// Forge to report it with a wrong epoch (a late or foreign outcome).
	Permit   int
	Verdict  gate.Verdict
	Floor    time.Duration
	Actual   int64
	Progress bool
	Forge    bool
	// Peek: the sources read. Override and Reload: the source.
	Sources []int
	Source  int
	// Override: the action. Reload: the variant the source switches to.
	Action  gate.Action
	Variant int
}

// NewTrace generates a trace of n operations from seed; the same seed gives
// the same trace.
func NewTrace(seed int64, n int) Trace {
	r := rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	pick := func(vs ...int64) int64 { return vs[r.IntN(len(vs))] }
	tr := Trace{Seed: seed, Tenants: []gate.TenantCall{
		{Name: "ta", Limits: gate.TenantLimits{MaxConcurrency: 2, RPM: 4, Budget: 120, BudgetWindow: 3 * time.Second}},
		{Name: "tb", Limits: gate.TenantLimits{TPM: 80}},
	}}
	// The tenants come from a stream of their own, so that the rest of a
	// seed's trace is what it was before traces named tenants.
	tenants := rand.New(rand.NewPCG(uint64(seed), 7))
	for i, name := range []string{"a", "b", "c"} {
		var vs []gate.Source
		for range 2 {
			vs = append(vs, gate.Source{
				Name: name,
				Limits: gate.Limits{
					MaxConcurrency: int(pick(1, 2, 3, 5)),
					RPM:            pick(0, 0, 3, 6),
					TPM:            pick(0, 0, 60, 100),
					Lease:          time.Duration(pick(300, 1500, 2000)) * time.Millisecond,
				},
				Breaker: gate.BreakerPolicy{
					FailThreshold: int(pick(2, 3, 4)),
					MinCalls:      int(pick(2, 3, 4)),
					// 1/3 is not exact in binary: the rate compare is fails/calls >= rate in float64.
					FailRate:    []float64{0.5, 1.0 / 3, 0.34, 0.6, 1}[r.IntN(5)],
					Window:      time.Duration(pick(500, 1000, 1000+int64(i)*7)) * time.Millisecond,
					Cooldown:    time.Duration(pick(100, 200, 300)) * time.Millisecond,
					MaxCooldown: time.Duration(pick(300, 800, 1600)) * time.Millisecond,
					ProbeTTL:    time.Duration(pick(250, 500, 700)) * time.Millisecond,
				},
			})
		}
		tr.Variants = append(tr.Variants, vs)
	}
	steps := []time.Duration{
		400 * time.Microsecond, time.Millisecond, 49 * time.Millisecond, 50 * time.Millisecond,
		99 * time.Millisecond, 100 * time.Millisecond, 199 * time.Millisecond, 250 * time.Millisecond,
		500 * time.Millisecond, time.Second, 2 * time.Second, 30 * time.Second, 61 * time.Second,
	}
	for range n {
		var op Op
		switch w := r.IntN(100); {
		case w < 20:
			op = Op{Kind: OpAdvance, Advance: steps[r.IntN(len(steps))]}
		case w < 55:
			op = Op{Kind: OpAdmit, Tokens: pick(0, 5, 20, 40, 61), Tenant: tenants.IntN(3)}
			op.Candidates = r.Perm(3)[:1+r.IntN(3)]
			for range op.Candidates {
				op.Cut = append(op.Cut, int(pick(0, 0, 0, 1, 2)))
			}
		case w < 85:
			op = Op{
				Kind: OpSettle, Permit: r.IntN(1 << 20), Forge: r.IntN(12) == 0,
				Verdict: []gate.Verdict{gate.VerdictSuccess, gate.VerdictSuccess, gate.VerdictFailure, gate.VerdictFailure,
					gate.VerdictFailure, gate.VerdictNone, gate.VerdictForceOpen}[r.IntN(7)],
				Floor:  time.Duration(pick(0, 0, 0, 150, 2500)) * time.Millisecond,
				Actual: pick(-1, -1, 0, 10, 70),
			}
			op.Progress = op.Verdict == gate.VerdictSuccess || r.IntN(10) == 0
		case w < 93:
			op = Op{Kind: OpPeek, Sources: r.Perm(3)[:r.IntN(4)]}
		case w < 97:
			op = Op{Kind: OpOverride, Source: r.IntN(3), Action: []gate.Action{
				gate.ActionForceOpen, gate.ActionForceClosed, gate.ActionDisable,
				gate.ActionClear, gate.ActionClear, gate.ActionReset, gate.ActionReset,
			}[r.IntN(7)]}
		default:
			op = Op{Kind: OpReload, Source: r.IntN(3), Variant: r.IntN(2)}
		}
		tr.Ops = append(tr.Ops, op)
	}
	return tr
}

// Replay runs the trace on b in scope, advancing clock (b's clock) as the
// trace says, and returns one line per operation: the operation and the
// backend's whole answer. Two backends agree on a trace when their lines are
// equal. Coverage counts what the answers contained, so a caller can check
// that a batch of traces reached the states that matter.
func (tr Trace) Replay(ctx context.Context, b gate.Backend, clock *Clock, scope string, cov Coverage) ([]string, error) {
	current := make([]gate.Source, len(tr.Variants))
	for i, vs := range tr.Variants {
		current[i] = vs[0]
	}
	index := map[string]int{}
	for i, s := range current {
		index[s.Name] = i
	}
	var permits []gate.Permit
	var permitTenants []*gate.TenantCall
	lines := make([]string, 0, len(tr.Ops))
	for n, op := range tr.Ops {
		var res any
		var err error
		switch op.Kind {
		case OpAdvance:
			clock.Advance(op.Advance)
			res = clock.Now().Sub(Epoch)
		case OpAdmit:
			req := gate.AdmitRequest{Scope: scope, PermitID: fmt.Sprintf("p%d", n), Tokens: op.Tokens}
			if op.Tenant > 0 {
				req.Tenant = &tr.Tenants[op.Tenant-1]
			}
			for k, i := range op.Candidates {
				src := current[i]
				req.Candidates = append(req.Candidates, gate.Candidate{Source: &src, Ceiling: max(1, src.Limits.MaxConcurrency-op.Cut[k])})
			}
			var a gate.Admission
			a, err = b.Admit(ctx, req)
			if a.Granted {
				permits = append(permits, a.Permit)
				permitTenants = append(permitTenants, req.Tenant)
			}
			cov.admission(a)
			res = a
		case OpSettle:
			if len(permits) == 0 {
				res = "no permit yet"
				break
			}
			p := permits[op.Permit%len(permits)]
			src := current[index[p.Source]]
			req := gate.SettleRequest{
				Scope: scope, Source: &src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: op.Verdict,
				Floor: op.Floor, ActualTokens: op.Actual, Progress: op.Progress, Tenant: permitTenants[op.Permit%len(permits)],
			}
			if op.Forge {
				req.Epoch++
			}
			var s gate.Settlement
			s, err = b.Settle(ctx, req)
			cov.settlement(s)
			res = s
		case OpPeek:
			req := gate.PeekRequest{Scope: scope, Tenants: tr.Tenants}
			for _, i := range op.Sources {
				src := current[i]
				req.Sources = append(req.Sources, &src)
			}
			res, err = b.Peek(ctx, req)
		case OpOverride:
			src := current[op.Source]
			var o gate.OverrideResult
			o, err = b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: &src, Action: op.Action, Actor: "trace", Why: fmt.Sprint("op ", n)})
			cov.events(o.Events)
			res = o
		case OpReload:
			current[op.Source] = tr.Variants[op.Source][op.Variant]
			res = current[op.Source]
		}
		if err != nil {
			return lines, fmt.Errorf("op %d %v: %w", n, op.Kind, err)
		}
		lines = append(lines, fmt.Sprintf("%d %v %+v → %+v", n, op.Kind, opArgs(op), res))
	}
	return lines, nil
}

func opArgs(op Op) string {
	switch op.Kind {
	case OpAdvance:
		return op.Advance.String()
	case OpAdmit:
		return fmt.Sprintf("candidates %v cut %v tokens %d", op.Candidates, op.Cut, op.Tokens)
	case OpSettle:
		return fmt.Sprintf("permit #%d %v floor %v actual %d progress %v forged %v", op.Permit, op.Verdict, op.Floor, op.Actual, op.Progress, op.Forge)
	case OpPeek:
		return fmt.Sprint(op.Sources)
	case OpOverride:
		return fmt.Sprintf("source %d %v", op.Source, op.Action)
	case OpReload:
		return fmt.Sprintf("source %d variant %d", op.Source, op.Variant)
	}
	return ""
}

// Coverage counts what the answers of replayed traces contained, by a short
// name ("reason:rate_limited", "event:probe_expired", "effect:stale", ...).
type Coverage map[string]int

func (c Coverage) admission(a gate.Admission) {
	if c == nil {
		return
	}
	for _, r := range a.Rejections {
		c["reason:"+r.Reason.String()]++
		if (r.Reason == gate.ReasonRateLimited || r.Reason == gate.ReasonTenantBudget) && r.RetryAfter > 0 {
			c["reason:"+r.Reason.String()+"_with_wait"]++
		}
	}
	if a.Granted && a.Permit.Probe {
		c["grant:probe"]++
	}
	if a.Granted && len(a.Rejections) > 0 {
		c["grant:after_rejection"]++
	}
	c.events(a.Events)
}

func (c Coverage) settlement(s gate.Settlement) {
	if c == nil {
		return
	}
	c["effect:"+s.Effect.String()]++
	if !s.Released {
		c["settle:not_released"]++
	}
	c.events(s.Events)
}

func (c Coverage) events(evs []gate.Event) {
	if c == nil {
		return
	}
	for _, e := range evs {
		c["event:"+e.Kind.String()]++
		if e.Kind == gate.EventTransition {
			c["cause:"+e.Cause.String()]++
		}
	}
}

// WantCoverage is what a batch of traces must have reached for a
// differential run to mean something.
var WantCoverage = []string{
	"reason:circuit_open", "reason:probe_in_flight", "reason:forced_open", "reason:adaptive_paced",
	"reason:rate_limited", "reason:rate_limited_with_wait", "reason:tenant_limit", "reason:tenant_budget",
	"reason:tenant_budget_with_wait", "grant:probe", "grant:after_rejection",
	"effect:applied", "effect:no_verdict", "effect:stale", "effect:ignored", "settle:not_released",
	"event:transition", "event:probe_leased", "event:probe_expired", "event:probe_released",
	"event:stale_outcome", "event:override",
	"cause:consecutive_failures", "cause:failure_rate", "cause:source_dead", "cause:cooldown_elapsed",
	"cause:probe_succeeded", "cause:probe_failed", "cause:reset",
}

// Differential replays traces of seeds 1..seeds (ops operations each) on a
// backend of each factory, each with its own clock, and fails at the first
// operation whose answers differ. It also fails if the traces together did
// not reach every state of WantCoverage.
func Differential(t *testing.T, seeds, ops int, a, b Factory) {
	t.Helper()
	cov := Coverage{}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tr := NewTrace(seed, ops)
			ca, cb := NewClock(), NewClock()
			la, err := tr.Replay(ctx, a(t, ca), ca, t.Name(), cov)
			if err != nil {
				t.Fatalf("first backend: %v", err)
			}
			lb, err := tr.Replay(ctx, b(t, cb), cb, t.Name(), nil)
			if err != nil {
				t.Fatalf("second backend: %v", err)
			}
			for i := range min(len(la), len(lb)) {
				if la[i] != lb[i] {
					from := max(0, i-8)
					t.Fatalf("seed %d: the backends disagree at op %d.\nleading ops:\n%s\nfirst:  %s\nsecond: %s",
						seed, i, strings.Join(la[from:i], "\n"), la[i], lb[i])
				}
			}
			if len(la) != len(lb) {
				t.Fatalf("seed %d: %d answers vs %d", seed, len(la), len(lb))
			}
		})
	}
	var missing []string
	for _, k := range WantCoverage {
		if cov[k] == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		keys := make([]string, 0, len(cov))
		for k := range cov {
			keys = append(keys, fmt.Sprintf("%s=%d", k, cov[k]))
		}
		slices.Sort(keys)
		t.Errorf("the traces never reached %v (reached: %v)", missing, keys)
	}
}
