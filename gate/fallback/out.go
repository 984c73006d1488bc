package fallback

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/gate"
)

// out is the permits the shared backend granted this replica (in Local
// mode) that are neither settled nor past their leases, by scope and
// source: their holders still use the upstream's slots, so the local
// backend leaves them room while the shared one is away. It costs one
// atomic load per Settle while empty.
type out struct {
	n  atomic.Int64 // len(of)
	mu sync.Mutex
	by map[lentKey]*outSource
	of map[string]lentKey // permit → its source
}

type outSource struct {
	ends map[string]int64 // permit → end of its lease (UnixNano)
	// soonest is at most the earliest of ends: expire looks through them
	// only once it has passed (as gate.Quota does).
	soonest int64
	// probe is the permit of ends that holds the breaker's HALF_OPEN
	// probe ("" none), of epoch, until probeEnd (UnixNano).
	probe    string
	epoch    uint64
	probeEnd int64
	// prune is the size at which ends is next rid of its ended leases, so
	// that permits whose holders never report cost amortized O(1) each.
	prune int
	// minute is the admissions of the last minute (local clock, ms), of a
	// source with an RPM or TPM, for the local backend to count at the
	// switch; at most maxMinute, the oldest dropped first.
	minute []gate.Charge
}

// maxMinute bounds the admissions of one source kept for the switch.
const maxMinute = 1 << 16

// add keeps p, which the shared backend granted for req at now.
func (o *out) add(req gate.AdmitRequest, p gate.Permit, now time.Time) {
	scope, source, id := req.Scope, p.Source, p.ID
	end := now.Add(p.Lease).UnixNano()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by == nil {
		o.by, o.of = map[lentKey]*outSource{}, map[string]lentKey{}
	}
	k := lentKey{scope, source}
	s := o.by[k]
	if s == nil {
		s = &outSource{ends: map[string]int64{}, prune: 16}
		o.by[k] = s
	}
	if len(s.ends) >= s.prune {
		o.expire(s, now.UnixNano())
		s.prune = max(16, 2*len(s.ends))
	}
	if len(s.ends) == 0 || end < s.soonest {
		s.soonest = end
	}
	s.ends[id] = end
	o.of[id] = k
	src := grantedSource(req, p)
	if p.Probe {
		s.probe, s.epoch, s.probeEnd = id, p.Epoch, now.Add(src.Breaker.ProbeTTL).UnixNano()
	}
	if src.Limits.RPM > 0 || src.Limits.TPM > 0 {
		ms := now.UnixMilli()
		i := 0
		for i < len(s.minute) && (s.minute[i].At+gate.Minute <= ms || len(s.minute)-i >= maxMinute) {
			i++
		}
		s.minute = append(s.minute[i:], gate.Charge{At: ms, Tokens: p.Tokens})
	}
	o.n.Store(int64(len(o.of)))
}

// remove forgets a permit and reports whether it was kept.
func (o *out) remove(scope, source, id string) bool {
	if o.n.Load() == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	k, ok := o.of[id]
	if !ok || k != (lentKey{scope, source}) {
		return false
	}
	delete(o.of, id)
	if s := o.by[k]; s != nil { // kept when empty: the next grant reuses it
		delete(s.ends, id)
		if s.probe == id {
			s.probe = ""
		}
	}
	o.n.Store(int64(len(o.of)))
	return true
}

// count is the permits of the source still out at now (UnixNano).
func (o *out) count(scope, source string, now int64) int {
	if o.n.Load() == 0 {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	k := lentKey{scope, source}
	s := o.by[k]
	if s == nil {
		return 0
	}
	o.expire(s, now)
	return len(s.ends)
}

// expire forgets the permits of s whose leases ended by now. The caller
// holds o.mu.
func (o *out) expire(s *outSource, now int64) {
	if len(s.ends) > 0 && now >= s.soonest {
		s.soonest = math.MaxInt64
		for id, end := range s.ends {
			if end <= now {
				delete(s.ends, id)
				delete(o.of, id)
			} else {
				s.soonest = min(s.soonest, end)
			}
		}
	}
	if _, ok := s.ends[s.probe]; !ok || s.probeEnd <= now {
		s.probe = ""
	}
	o.n.Store(int64(len(o.of)))
}

// outOf is the shared backend's permits still out of each of srcs (nil
// when none is).
func (b *Backend) outOf(scope string, srcs []*gate.Source) []int {
	if b.out.n.Load() == 0 {
		return nil
	}
	now := b.o.Now().UnixNano()
	var n []int
	for i, src := range srcs {
		if k := b.out.count(scope, src.Name, now); k > 0 {
			if n == nil {
				n = make([]int, len(srcs))
			}
			n[i] = k
		}
	}
	return n
}

// leaveOut is req (already the local share) with room left for the shared
// backend's permits still out.
func (b *Backend) leaveOut(req gate.AdmitRequest) gate.AdmitRequest {
	if b.out.n.Load() == 0 {
		return req
	}
	srcs := make([]*gate.Source, len(req.Candidates))
	for i, c := range req.Candidates {
		srcs[i] = c.Source
	}
	return lessAdmit(req, b.outOf(req.Scope, srcs))
}
