package gate

import (
	"testing"
	"time"
)

func TestCooldownForIsCappedWithoutOverflow(t *testing.T) {
	p := BreakerPolicy{Cooldown: 60 * time.Second, MaxCooldown: 300 * time.Second}
	for _, tc := range []struct {
		reopens int
		want    time.Duration
	}{
		{0, 60 * time.Second}, {1, 60 * time.Second}, {2, 120 * time.Second}, {3, 240 * time.Second},
		{4, 300 * time.Second}, {63, 300 * time.Second}, {64, 300 * time.Second}, {1 << 30, 300 * time.Second},
	} {
		if got := p.CooldownFor(tc.reopens); got != tc.want {
			t.Errorf("CooldownFor(%d) = %v, want %v", tc.reopens, got, tc.want)
		}
	}
	huge := BreakerPolicy{Cooldown: time.Duration(1<<40) * time.Millisecond, MaxCooldown: time.Duration(1<<62 - 1)}
	if got := huge.CooldownFor(40); got <= 0 || got > huge.MaxCooldown {
		t.Errorf("CooldownFor near overflow = %v", got)
	}
}

func TestApplyRejectsUnknownAction(t *testing.T) {
	var b Breaker
	if _, err := b.Apply(Action(99), "me", "why", 0); err == nil {
		t.Fatal("unknown action accepted")
	}
}
