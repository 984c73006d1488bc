package policy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

// The tests of this package run inside testing/synctest bubbles: time.Now
// and every timer (the server-side waits of OnNoRunnable included) follow the
// bubble's fake clock, which advances only when every goroutine is blocked.
// time.Sleep in a test is therefore the clock step of a fake clock.

// half is the fixed random number of the tests: jitter = 0.75 × poll_interval.
func half() float64 { return 0.5 }

// newScope builds scope "s" from a YAML body of scopes.s on a memory backend.
func newScope(t *testing.T, body string) (*policy.Scope, *inmem.Backend) {
	t.Helper()
	cfg, err := config.Parse([]byte("scopes:\n  s:\n"+indent(body)), nil)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	b := inmem.New(time.Now)
	s := policy.NewScope(cfg.Scopes["s"], b, policy.Options{Rand: half})
	t.Cleanup(s.Close)
	return s, b
}

func indent(s string) string {
	out := ""
	for _, line := range splitLines(s) {
		out += "    " + line + "\n"
	}
	return out
}

func splitLines(s string) []string {
	var lines []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			lines = append(lines, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		lines = append(lines, s[start:])
	}
	return lines
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	return c
}

func newCall(s *policy.Scope) *policy.Call {
	return policy.NewCall(policy.NewID("c"), s.Name(), 0, time.Time{}, time.Now())
}

func pick(t *testing.T, s *policy.Scope, c *policy.Call) policy.Pick {
	t.Helper()
	p, err := s.Pick(ctx(t), c)
	if err != nil {
		t.Fatalf("Pick: %v", err)
	}
	return p
}

func grant(t *testing.T, s *policy.Scope, c *policy.Call) *policy.Grant {
	t.Helper()
	p := pick(t, s, c)
	if p.Grant == nil {
		t.Fatalf("Pick refused: %+v", p.NoRunnable)
	}
	return p.Grant
}

func record(t *testing.T, s *policy.Scope, c *policy.Call, g *policy.Grant, o policy.Outcome) policy.Recorded {
	t.Helper()
	r, err := s.RecordOutcome(ctx(t), c, policy.Attempt{PermitID: g.Permit.ID, Outcome: o, ActualTokens: -1})
	if err != nil {
		t.Fatalf("RecordOutcome: %v", err)
	}
	return r
}

// fail makes one call whose single attempt fails with o.
func fail(t *testing.T, s *policy.Scope, o policy.Outcome) {
	t.Helper()
	c := newCall(s)
	record(t, s, c, grant(t, s, c), o)
}

// reply is what a fake upstream answers to one attempt.
type reply struct {
	outcome    policy.Outcome
	latency    time.Duration
	retryAfter time.Duration
}

// result is how a driven call ended.
type result struct {
	action   policy.Action
	attempts []string // source of each attempt, in order
	retries  []time.Duration
	elapsed  time.Duration
}

// drive runs the thin SDK loop of docs/design.md for one call against a fake upstream,
// sleeping on the bubble's clock.
func drive(t *testing.T, s *policy.Scope, c *policy.Call, upstream func(g *policy.Grant) reply) result {
	t.Helper()
	start := time.Now()
	var res result
	for i := 0; ; i++ {
		if i > 100000 {
			t.Fatal("the call never ended")
		}
		p := pick(t, s, c)
		switch {
		case p.Failure != nil:
			res.action = policy.Action{Failure: p.Failure}
		case p.Grant != nil:
			res.attempts = append(res.attempts, p.Grant.Source.Name)
			r := upstream(p.Grant)
			time.Sleep(r.latency)
			rec, err := s.RecordOutcome(ctx(t), c, policy.Attempt{PermitID: p.Grant.Permit.ID, Outcome: r.outcome, RetryAfter: r.retryAfter, ActualTokens: -1})
			if err != nil {
				t.Fatalf("RecordOutcome: %v", err)
			}
			if rec.Next.Retry != nil {
				res.retries = append(res.retries, *rec.Next.Retry)
				time.Sleep(*rec.Next.Retry)
				continue
			}
			res.action = rec.Next
		default:
			d, err := s.OnNoRunnable(ctx(t), c)
			if err != nil {
				t.Fatalf("OnNoRunnable: %v", err)
			}
			if d.Failure == nil {
				time.Sleep(d.Sleep)
				continue
			}
			res.action = policy.Action{Failure: d.Failure}
		}
		res.elapsed = time.Since(start)
		return res
	}
}

func always(o policy.Outcome) func(*policy.Grant) reply {
	return func(*policy.Grant) reply { return reply{outcome: o} }
}

func reasons(rs []gate.Rejection) string {
	s := ""
	for _, r := range rs {
		s += fmt.Sprintf("%s:%s:%v ", r.Source, r.Reason, r.RetryAfter)
	}
	return s
}

func wantFailure(t *testing.T, a policy.Action, reason policy.FailureReason) *policy.Failure {
	t.Helper()
	if a.Failure == nil || a.Failure.Reason != reason {
		t.Fatalf("call ended with %v, want failure %v", a, reason)
	}
	return a.Failure
}
