package gate

import (
	"slices"
	"testing"
	"time"
)

// AddMinute merges admissions made elsewhere into the minute in time
// order: a later settle of the quota's own permit still finds its entry,
// and the charges leave the minute at their own time.
func TestAddMinuteMergesInTimeOrder(t *testing.T) {
	l := Limits{MaxConcurrency: 10, RPM: 100, TPM: 10_000, Lease: time.Hour}
	var q Quota
	q.take(l, "a", 100, 0)
	q.take(l, "b", 200, 20_000)
	q.AddMinute([]Charge{{At: 30_000, Tokens: 30}, {At: 10_000, Tokens: 10}, {At: -70_000, Tokens: 999}}, 35_000)
	want := []Charge{{0, 100}, {10_000, 10}, {20_000, 200}, {30_000, 30}}
	if got := q.Minute(35_000); !slices.Equal(got, want) {
		t.Fatalf("minute %v, want %v", got, want)
	}
	if !q.release("b", 250, 36_000) { // settles b's tokens where b is
		t.Fatal("b's slot not held")
	}
	want[2].Tokens = 250
	if got := q.Minute(36_000); !slices.Equal(got, want) {
		t.Fatalf("after b's settle: minute %v, want %v", got, want)
	}
	for _, step := range []struct {
		now            int64
		requests, toks int64
	}{
		{59_999, 4, 390}, {60_000, 3, 290}, {70_000, 2, 280}, {80_000, 1, 30}, {90_000, 0, 0},
	} {
		q.expire(step.now)
		if v := q.view(step.now); v.Requests != step.requests || q.tokens != step.toks {
			t.Fatalf("at %d: %d requests, %d tokens (view %+v), want %d, %d", step.now, v.Requests, q.tokens, v, step.requests, step.toks)
		}
	}
}
