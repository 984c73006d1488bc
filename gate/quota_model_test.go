package gate

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The quota's "earliest lease" shortcut frees exactly the leases a scan of
// every lease on every decision frees, at the same moment: random takes
// (leases of several lengths, so ends out of order, renewals of a held
// permit with a shorter or longer lease), releases, checks and views, with
// the clock stepping forward, standing still and going backwards.
func TestQuotaLeasesMatchBruteForce(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		var q Quota
		model := map[string]int64{} // permit → end, expired by a full scan
		expire := func(now int64) {
			for id, end := range model {
				if now >= end {
					delete(model, id)
				}
			}
		}
		now := int64(r.IntN(1000))
		var log []string
		for step := range 400 {
			switch r.IntN(10) {
			case 0, 1:
				now += int64(r.IntN(3000))
			case 2:
				now -= int64(r.IntN(3000)) // the clock goes back
			}
			permit := fmt.Sprint("p", r.IntN(12))
			l := Limits{MaxConcurrency: 1000, Lease: time.Duration(r.IntN(5000)) * time.Millisecond}
			switch r.IntN(4) {
			case 0, 1:
				log = append(log, fmt.Sprintf("%d take %s lease %v at %d", step, permit, l.Lease, now))
				q.take(l, permit, 0, now)
				model[permit] = now + l.Lease.Milliseconds()
			case 2:
				log = append(log, fmt.Sprintf("%d release %s at %d", step, permit, now))
				expire(now)
				_, want := model[permit]
				delete(model, permit)
				if got := q.release(permit, -1, now); got != want {
					t.Fatalf("seed %d: release says held %v, model %v\n%s", seed, got, want, log)
				}
			case 3:
				log = append(log, fmt.Sprintf("%d check at %d", step, now))
				q.check(l, 1000, 0, now)
				expire(now)
			}
			inFlight := 0
			for _, end := range model {
				if now < end {
					inFlight++
				}
			}
			if v := q.view(now); v.InFlight != inFlight {
				t.Fatalf("seed %d: view in flight %d, model %v\n%s", seed, v.InFlight, model, log)
			}
			if got, want := slices.Sorted(maps.Keys(q.Leases)), slices.Sorted(maps.Keys(model)); !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: leases %v, model %v\n%s", seed, step, q.Leases, model, log[max(0, len(log)-20):])
			}
		}
	}
}
