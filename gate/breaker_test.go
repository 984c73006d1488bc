package gate

import (
	"math"
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

// TestStoredTimesFarAheadSaturate: a breaker read from a shared store may
// carry any time. An OPEN one whose cooldown ends 2^62 ms from now, or a
// HALF_OPEN one whose probe does, answers the longest wait a Duration
// holds, never a wrapped one (which would read as "retry now" or less).
func TestStoredTimesFarAheadSaturate(t *testing.T) {
	const now, far = 1_000, int64(1) << 62
	open := Breaker{State: Open, OpenUntil: far}
	if e, _ := open.Enter(BreakerPolicy{}, "p", now); e.Allowed || e.RetryAfter != Never {
		t.Errorf("Enter = %+v, want refused with RetryAfter %v", e, Never)
	}
	if v := open.View(BreakerPolicy{}, now); v.RetryAfter != Never {
		t.Errorf("View.RetryAfter = %v, want %v", v.RetryAfter, Never)
	}
	half := Breaker{State: HalfOpen, Probe: "p", ProbeUntil: far}
	if v := half.View(BreakerPolicy{}, now); v.ProbeLeft != Never {
		t.Errorf("View.ProbeLeft = %v, want %v", v.ProbeLeft, Never)
	}
	for _, tc := range []struct {
		in   int64
		want time.Duration
	}{{far, Never}, {-far, time.Duration(math.MinInt64)}, {1500, 1500 * time.Millisecond}, {0, 0}} {
		if got := Millis(tc.in); got != tc.want {
			t.Errorf("Millis(%d) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestCeilMillisRoundsUpAndSaturates: a time left in whole milliseconds
// is never early, and the longest Duration does not wrap.
func TestCeilMillisRoundsUpAndSaturates(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want int64
	}{{0, 0}, {1, 1}, {time.Millisecond, 1}, {time.Millisecond + 1, 2}, {math.MaxInt64, math.MaxInt64 / int64(time.Millisecond)}} {
		if got := CeilMillis(tc.in); got != tc.want {
			t.Errorf("CeilMillis(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestProgressAgeSaturates: a progress time read from a shared store may
// be anything; its age is Never when unset or when now - progress would
// overflow, never a wrapped age.
func TestProgressAgeSaturates(t *testing.T) {
	for _, tc := range []struct {
		progress, now int64
		want          time.Duration
	}{
		{0, 5_000, Never},
		{2_000, 5_000, 3 * time.Second},
		{5_000, 2_000, -3 * time.Second},
		{math.MinInt64 + 1, math.MaxInt64, Never},
		{math.MaxInt64, -2, Never},
	} {
		if got := ProgressAge(tc.progress, tc.now); got != tc.want {
			t.Errorf("ProgressAge(%d, %d) = %v, want %v", tc.progress, tc.now, got, tc.want)
		}
	}
}
