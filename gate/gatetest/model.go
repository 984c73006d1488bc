package gatetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/polygate/polygate/gate"
)

// The model test drives one source of a backend with random admissions,
// outcomes, peeks and clock steps, and compares every answer with a small
// independent model of the breaker of docs/design.md. After every step it checks the
// invariants: the state is the model's, the epoch grew exactly once per probe
// handed out, at most one probe is out, retry_after is the remaining wait, and
// every transition reported is an allowed one.

var modelPolicy = gate.BreakerPolicy{
	FailThreshold: 3, MinCalls: 4, FailRate: 0.5, Window: time.Second,
	Cooldown: 200 * time.Millisecond, MaxCooldown: 800 * time.Millisecond, ProbeTTL: 500 * time.Millisecond,
}

type sample struct {
	at   int64
	fail bool
}

type modelPermit struct {
	id      string
	epoch   uint64
	probe   bool
	settled bool
}

type breakerModel struct {
	state       gate.State
	epoch       uint64
	reopens     int
	openUntil   int64
	probe       string
	probeUntil  int64
	consecutive int
	samples     []sample // since the last reset of the round
	permits     []*modelPermit
}

// effective is the state a reader sees at now.
func (m *breakerModel) effective(now int64) gate.State {
	if m.state == gate.Open && now >= m.openUntil {
		return gate.HalfOpen
	}
	return m.state
}

// counts counts the samples in the window: the ten 100ms buckets up to now.
func (m *breakerModel) counts(now int64) (calls, fails int64) {
	for _, s := range m.samples {
		if s.at/100 > now/100-10 {
			calls++
			if s.fail {
				fails++
			}
		}
	}
	return
}

func (m *breakerModel) cooldown() int64 {
	d := int64(200)
	for i := 1; i < m.reopens && d < 800; i++ {
		d *= 2
	}
	return min(d, 800)
}

func (m *breakerModel) open(now int64) {
	m.reopens++
	m.state = gate.Open
	m.openUntil = now + m.cooldown()
	m.probe, m.samples, m.consecutive = "", nil, 0
}

var allowed = map[[2]gate.State]bool{
	{gate.Closed, gate.Open}: true, {gate.Open, gate.HalfOpen}: true, {gate.Open, gate.Open}: true,
	{gate.HalfOpen, gate.Closed}: true, {gate.HalfOpen, gate.Open}: true,
}

func runModel(t *testing.T, factory Factory) {
	clock := NewClock()
	b := factory(t, clock)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	src := &gate.Source{Name: "s", Limits: gate.Limits{MaxConcurrency: 1000, Lease: time.Hour}, Breaker: modelPolicy}
	run := 0

	rapid.Check(t, func(rt *rapid.T) {
		run++
		scope := fmt.Sprintf("%s/%d", t.Name(), run)
		m := &breakerModel{}
		ids := 0
		now := func() int64 { return clock.Now().UnixMilli() }
		checkEvents := func(events []gate.Event) {
			for _, ev := range events {
				if ev.Kind == gate.EventTransition && !allowed[[2]gate.State{ev.From, ev.To}] {
					rt.Fatalf("transition %v → %v is not allowed", ev.From, ev.To)
				}
			}
		}

		rt.Repeat(map[string]func(*rapid.T){
			"advance": func(rt *rapid.T) {
				clock.Advance(time.Duration(rapid.SampledFrom([]int64{1, 50, 99, 100, 199, 200, 500, 1000}).Draw(rt, "ms")) * time.Millisecond)
			},
			"admit": func(rt *rapid.T) {
				ids++
				id := fmt.Sprintf("p%d", ids)
				a, err := b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: id, Candidates: []gate.Candidate{{Source: src, Ceiling: 1000}}})
				if err != nil {
					rt.Fatal(err)
				}
				checkEvents(a.Events)
				n := now()
				var want gate.Rejection
				switch {
				case m.state == gate.Open && n < m.openUntil:
					want = gate.Rejection{Source: "s", Reason: gate.ReasonCircuitOpen, RetryAfter: time.Duration(m.openUntil-n) * time.Millisecond}
				case m.state != gate.Closed && m.probe != "" && n < m.probeUntil:
					want = gate.Rejection{Source: "s", Reason: gate.ReasonProbeInFlight}
				}
				if want.Reason != gate.ReasonNone {
					if a.Granted || len(a.Rejections) != 1 || a.Rejections[0] != want {
						rt.Fatalf("admit: got %+v, model refuses with %+v", a, want)
					}
					return
				}
				p := &modelPermit{id: id}
				if m.state != gate.Closed {
					m.state = gate.HalfOpen
					m.epoch++
					m.probe, m.probeUntil = id, n+500
					p.probe = true
				}
				p.epoch = m.epoch
				if !a.Granted || a.Permit.Probe != p.probe || a.Permit.Epoch != p.epoch {
					rt.Fatalf("admit: got %+v, model grants probe=%v epoch=%d", a, p.probe, p.epoch)
				}
				m.permits = append(m.permits, p)
			},
			"settle": func(rt *rapid.T) {
				if len(m.permits) == 0 {
					rt.Skip("no permit")
				}
				p := rapid.SampledFrom(m.permits).Draw(rt, "permit")
				v := rapid.SampledFrom([]gate.Verdict{gate.VerdictSuccess, gate.VerdictFailure, gate.VerdictFailure, gate.VerdictNone, gate.VerdictForceOpen}).Draw(rt, "verdict")
				s, err := b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: p.id, Epoch: p.epoch, Probe: p.probe, Verdict: v, ActualTokens: -1})
				if err != nil {
					rt.Fatal(err)
				}
				checkEvents(s.Events)
				want := m.settle(p, v, now())
				if s.Effect != want {
					rt.Fatalf("settle %+v %v: effect %v, model %v", *p, v, s.Effect, want)
				}
			},
			"": func(rt *rapid.T) {
				snap, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src}})
				if err != nil {
					rt.Fatal(err)
				}
				v, n := snap.Sources[0].Breaker, now()
				calls, fails := m.counts(n)
				probeOut := m.state == gate.HalfOpen && m.probe != "" && n < m.probeUntil
				var wait time.Duration
				if m.state == gate.Open && n < m.openUntil {
					wait = time.Duration(m.openUntil-n) * time.Millisecond
				}
				if v.State != m.effective(n) || v.Epoch != m.epoch || v.Reopens != m.reopens || v.ProbeOut != probeOut ||
					v.RetryAfter != wait || v.Calls != calls || v.Fails != fails || v.Consecutive != m.consecutive {
					rt.Fatalf("peek %+v; model state %v epoch %d reopens %d probe out %v retry_after %v calls %d fails %d consecutive %d",
						v, m.effective(n), m.epoch, m.reopens, probeOut, wait, calls, fails, m.consecutive)
				}
			},
		})
	})
}

// settle applies an outcome to the model and returns the effect it predicts.
func (m *breakerModel) settle(p *modelPermit, v gate.Verdict, now int64) gate.Effect {
	settledBefore := p.settled
	p.settled = true
	if p.epoch != m.epoch || (settledBefore && !p.probe) {
		return gate.EffectStale
	}
	if p.probe {
		if m.state != gate.HalfOpen || m.probe != p.id {
			return gate.EffectStale
		}
		switch v {
		case gate.VerdictSuccess:
			m.state, m.reopens, m.probe, m.samples, m.consecutive = gate.Closed, 0, "", nil, 0
			return gate.EffectApplied
		case gate.VerdictFailure, gate.VerdictForceOpen:
			m.open(now)
			return gate.EffectApplied
		}
		m.probe = ""
		return gate.EffectNoVerdict
	}
	switch m.state {
	case gate.Closed:
		switch v {
		case gate.VerdictSuccess:
			m.samples = append(m.samples, sample{at: now})
			m.consecutive = 0
		case gate.VerdictFailure:
			m.samples = append(m.samples, sample{at: now, fail: true})
			m.consecutive++
			calls, fails := m.counts(now)
			if m.consecutive >= 3 || (calls >= 4 && 2*fails >= calls) {
				m.open(now)
			}
		case gate.VerdictForceOpen:
			m.open(now)
		default:
			return gate.EffectNoVerdict
		}
		return gate.EffectApplied
	case gate.Open:
		if v == gate.VerdictForceOpen {
			m.openUntil = max(m.openUntil, now+m.cooldown())
			return gate.EffectApplied
		}
	}
	return gate.EffectStale
}
