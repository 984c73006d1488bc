package policy_test

import (
	"math"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/policy"
)

// firsts returns the source granted to n successive one-attempt calls.
func firsts(t *testing.T, s *policy.Scope, n int) string {
	t.Helper()
	var out []string
	for range n {
		c := newCall(s)
		g := grant(t, s, c)
		out = append(out, g.Source.Name)
		record(t, s, c, g, policy.Success)
	}
	return strings.Join(out, "")
}

func TestSelector(t *testing.T) {
	for _, tc := range []struct {
		name, sources, want string
	}{
		{"PriorityFirst", `[{name: b, priority: 1}, {name: a, priority: 0}]`, "aaaa"},
		{"EqualWeightsRoundRobin", `[{name: a}, {name: b}, {name: c}]`, "abcabc"},
		{"SmoothWeights", `[{name: a, weight: 3}, {name: b, weight: 1}]`, "aabaaaba"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, _ := newScope(t, "sources: "+tc.sources)
				if got := firsts(t, s, len(tc.want)); got != tc.want {
					t.Fatalf("granted %s, want %s", got, tc.want)
				}
			})
		})
	}

	t.Run("FailedInThisCallMovesBack", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
backoff: {base: 1ms, max: 1ms}
sources: [{name: a, priority: 0}, {name: b, priority: 1}]
`)
			res := drive(t, s, newCall(s), func(g *policy.Grant) reply {
				if g.Source.Name == "a" {
					return reply{outcome: policy.Transient}
				}
				return reply{outcome: policy.Success}
			})
			if !res.action.Done || strings.Join(res.attempts, "") != "ab" {
				t.Fatalf("attempts %v, want a then b", res.attempts)
			}
		})
	})

	t.Run("RecentFailureDemotesWithinPriority", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
breaker: {window: 10s, fail_threshold: 100}
sources: [{name: a}, {name: b}]
`)
			fail(t, s, policy.Transient) // a (first in round robin) failed
			if got := firsts(t, s, 4); got != "bbbb" {
				t.Fatalf("granted %s while a failed recently, want bbbb", got)
			}
			time.Sleep(10 * time.Second)
			if got := firsts(t, s, 2); !strings.Contains(got, "a") {
				t.Fatalf("granted %s after the window, want a back in rotation", got)
			}
		})
	})
}

func TestPacer(t *testing.T) {
	p := policy.NewPacer(8)
	if p.Ceiling() != 8 {
		t.Fatalf("initial ceiling %d", p.Ceiling())
	}
	for _, want := range []int{4, 2, 1, 1} {
		p.RateLimited()
		if p.Ceiling() != want {
			t.Fatalf("after a 429 ceiling = %d, want %d", p.Ceiling(), want)
		}
	}
	for range 2 {
		p.Success() // 1 → 2: one success at ceiling 1 adds a whole slot
	}
	if p.Ceiling() != 2 {
		t.Fatalf("after 2 successes ceiling = %d, want 2", p.Ceiling())
	}
	for range 1000 {
		p.Success()
	}
	if p.Ceiling() != 8 {
		t.Fatalf("ceiling grew to %d past max_concurrency 8", p.Ceiling())
	}
}

func TestPacerThrottlesAdmissions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
quota_full: fail_fast
sources: [{name: only, max_concurrency: 4}]
`)
		c := newCall(s)
		record(t, s, c, grant(t, s, c), policy.RateLimited) // ceiling 4 → 2
		grant(t, s, newCall(s))
		grant(t, s, newCall(s))
		nr := pick(t, s, newCall(s)).NoRunnable
		if nr == nil || nr.Sources[0].Reason.String() != "adaptive_paced" {
			t.Fatalf("third attempt under ceiling 2: %+v", nr)
		}
	})
}

// M10: over many samples the backoff medians follow base·2^n, nothing piles up
// at the cap, every value lies in [cap/2, cap], and a Retry-After is a floor.
func TestBackoffDistribution(t *testing.T) {
	const base, maxDelay = 100 * time.Millisecond, 10 * time.Second
	rng := rand(42)
	for n := 1; n <= 10; n++ {
		d := min(maxDelay, base<<(n-1))
		var xs []float64
		for range 2000 {
			b := policy.Backoff(base, maxDelay, n, 0, rng)
			if b < d/2 || b > d {
				t.Fatalf("n=%d: backoff %v outside [%v, %v]", n, b, d/2, d)
			}
			xs = append(xs, float64(b))
		}
		sort.Float64s(xs)
		median := xs[len(xs)/2]
		if want := float64(d) * 0.75; math.Abs(median-want) > float64(d)*0.05 {
			t.Fatalf("n=%d: median %v, want about %v", n, time.Duration(median), time.Duration(want))
		}
		atCap := 0
		for _, x := range xs {
			if time.Duration(x) == maxDelay {
				atCap++
			}
		}
		if atCap > len(xs)/100 {
			t.Fatalf("n=%d: %d of %d samples piled up at the cap", n, atCap, len(xs))
		}
	}
	if b := policy.Backoff(base, maxDelay, 1, 7*time.Second, rng); b != 7*time.Second {
		t.Fatalf("Retry-After 7s floor gave %v", b)
	}
	if b := policy.Backoff(base, maxDelay, 1000, 0, rng); b < maxDelay/2 || b > maxDelay {
		t.Fatalf("huge failure count gave %v", b)
	}
}

// rand is a small deterministic generator for tests.
func rand(seed uint64) func() float64 {
	x := seed
	return func() float64 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return float64(x>>11) / (1 << 53)
	}
}
