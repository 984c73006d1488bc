package policy_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

// settledLog keeps the attempts an observer was told of.
type settledLog struct {
	policy.NopObserver
	attempts []policy.Attempt
}

func (l *settledLog) Settled(_ *policy.Call, a policy.Attempt, _ policy.Recorded) {
	l.attempts = append(l.attempts, a)
}

// The attempt an observer is told of carries its number in the call, its
// latency, and its permit's probe flag and epoch.
func TestSettledAttemptCarriesNumberProbeAndEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := config.Parse([]byte("scopes:\n  s:\n    breaker: {fail_threshold: 1, cooldown: 1s, max_cooldown: 1s}\n    sources: [{name: a}]\n"), nil)
		if err != nil {
			t.Fatal(err)
		}
		log := &settledLog{}
		s := policy.NewScope(cfg.Scopes["s"], inmem.New(time.Now), policy.Options{Rand: half, Observer: log})
		c := newCall(s)
		g := grant(t, s, c)
		time.Sleep(300 * time.Millisecond)
		record(t, s, c, g, policy.Transient) // opens the breaker
		time.Sleep(time.Second)
		g = grant(t, s, c) // the probe
		record(t, s, c, g, policy.Success)
		want := []policy.Attempt{
			{Source: "a", Outcome: policy.Transient, Latency: 300 * time.Millisecond, Number: 1, Probe: false, Epoch: 0},
			{Source: "a", Outcome: policy.Success, Latency: 0, Number: 2, Probe: true, Epoch: 1},
		}
		if len(log.attempts) != len(want) {
			t.Fatalf("observed %d attempts, want %d", len(log.attempts), len(want))
		}
		for i, w := range want {
			a := log.attempts[i]
			if a.Source != w.Source || a.Outcome != w.Outcome || a.Latency != w.Latency || a.Number != w.Number || a.Probe != w.Probe || a.Epoch != w.Epoch {
				t.Errorf("attempt %d: %+v, want %+v", i, a, w)
			}
		}
	})
}
