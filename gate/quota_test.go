package gate

import (
	"testing"
	"time"
)

// A slot is freed exactly when its lease ends, whatever order the leases
// were taken in (a reload may shorten the lease of later permits) and
// whatever was released in between: expire looks through the leases only
// once the earliest end may have passed, and must not miss one.
func TestLeasesExpireAtTheirEndInAnyOrder(t *testing.T) {
	long := Limits{MaxConcurrency: 10, Lease: 10 * time.Second}
	short := Limits{MaxConcurrency: 10, Lease: 2 * time.Second}
	var q Quota
	q.take(long, "a", 0, 0)     // ends at 10 000
	q.take(short, "b", 0, 1000) // ends at 3 000
	q.take(long, "c", 0, 1000)  // ends at 11 000
	q.take(short, "d", 0, 1500) // ends at 3 500
	if !q.release("d", -1, 2000) {
		t.Fatal("release of d: slot not held")
	}
	q.take(short, "e", 0, 2500) // ends at 4 500
	for _, step := range []struct {
		now  int64
		want int
	}{
		{2999, 4}, {3000, 3}, {3499, 3}, {4499, 3}, {4500, 2}, {9999, 2}, {10000, 1}, {10999, 1}, {11000, 0},
	} {
		if reason, _ := q.check(long, 10, 0, step.now); reason != ReasonNone {
			t.Fatalf("at %d: refused (%v) with %d of 10 slots held", step.now, reason, len(q.Leases))
		}
		if got := len(q.Leases); got != step.want {
			t.Fatalf("at %d: %d slots held, want %d (%v)", step.now, got, step.want, q.Leases)
		}
	}
	if q.release("c", -1, 11000) {
		t.Fatal("release of c after its lease ended: slot still held")
	}
	q.take(short, "f", 0, 20000) // an empty quota takes the next end afresh
	if q.check(long, 10, 0, 21999); len(q.Leases) != 1 {
		t.Fatalf("at 21 999: %d slots held, want 1", len(q.Leases))
	}
	if q.check(long, 10, 0, 22000); len(q.Leases) != 0 {
		t.Fatalf("at 22 000: %d slots held, want 0", len(q.Leases))
	}
}
