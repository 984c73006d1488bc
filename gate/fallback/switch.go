package fallback

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/polygate/polygate/gate"
)

// call runs shared unless the Backend is degraded in Local mode, and falls
// back to local when shared is unavailable and the mode allows it.
func call[T any](b *Backend, ctx context.Context, shared, local func() (T, error)) (T, error) {
	if b.o.Mode == Local && b.degraded.Load() && !b.recovered(ctx) {
		return local()
	}
	seen := b.changes.Load()
	v, err := shared()
	b.observe(err, seen)
	if err != nil && b.o.Mode == Local && errors.Is(err, gate.ErrUnavailable) {
		return local()
	}
	return v, err
}

// observe updates the mode after a call to the shared backend that began
// when the mode had changed seen times. A success that began before the
// latest change (a call that was on its way when another one failed) does
// not end a degradation: only a call or a check begun since may.
func (b *Backend) observe(err error, seen uint64) {
	switch {
	case err == nil:
		if b.changes.Load() == seen {
			b.set(false, nil)
		}
	case errors.Is(err, gate.ErrUnavailable):
		b.set(true, err)
	}
}

// recovered checks the shared backend, at most once per PingEvery over all
// callers, and reports whether it answers again.
func (b *Backend) recovered(ctx context.Context) bool {
	now := b.o.Now().UnixNano()
	next := b.nextPing.Load()
	if now < next || !b.nextPing.CompareAndSwap(next, now+int64(b.o.PingEvery)) {
		return false
	}
	seen := b.changes.Load()
	err := b.shared.Ping(ctx)
	b.observe(err, seen)
	return err == nil
}

func (b *Backend) set(degraded bool, cause error) {
	if b.degraded.Load() == degraded {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.degraded.Load() == degraded {
		return
	}
	if degraded {
		b.nextPing.Store(b.o.Now().UnixNano() + int64(b.o.PingEvery))
		if b.o.Mode == Local {
			// Before any call is served locally.
			b.kept.Store(int64(b.local.Adopt(b.records())))
		}
	}
	// The count of changes goes up before and after the mode (odd while it
	// changes), so that a decision whose read of the count and of the mode
	// straddle the change is seen by Admit's check.
	b.changes.Add(1)
	b.degraded.Store(degraded)
	b.changes.Add(1)
	if b.o.OnChange != nil {
		b.o.OnChange(degraded, cause)
	}
}

// localReplica names this degradation's waiters in the local lines, a new
// name each time the mode changes: waiters of an earlier outage, granted or
// gone through the shared backend since, are then not kept alive by this
// one's reads, and leave the local lines with their lease.
func (b *Backend) localReplica() string {
	return "local-" + strconv.FormatUint((b.changes.Load()+1)/2, 10) // the change under way's number while it is under way
}

func (b *Backend) localAdmit(req gate.AdmitRequest) gate.AdmitRequest {
	r := b.localReplica()
	req.Line = withCopy(req.Line, func(w *gate.Waiter) { w.Replica = r })
	return req
}

func (b *Backend) localPeek(req gate.PeekRequest) gate.PeekRequest {
	r := b.localReplica()
	req.Line = withCopy(req.Line, func(l *gate.LineRead) {
		l.Replica = r
		l.Join = withCopy(l.Join, func(w *gate.Waiter) { w.Replica = r })
	})
	return req
}

func (b *Backend) localSettle(req gate.SettleRequest) gate.SettleRequest {
	r := b.localReplica()
	req.Line = withCopy(req.Line, func(h *gate.LineHandoff) { h.Replica = r })
	return req
}

// withCopy is a changed copy of *p (the caller's request is not touched);
// nil stays nil.
func withCopy[T any](p *T, change func(*T)) *T {
	if p == nil {
		return nil
	}
	c := *p
	change(&c)
	return &c
}

// records is what the local backend starts an outage from: the shared
// backend's records (a Recorder's), the HALF_OPEN probes the shared
// backend granted this replica that are still out, so that their outcomes
// decide the local breakers, and the admissions it made for this replica
// over the last minute, so that RPM and TPM hold across the switch.
func (b *Backend) records() []gate.Record {
	var recs []gate.Record
	if r, ok := b.shared.(Recorder); ok {
		recs = r.Records()
	}
	now := b.o.Now().UnixNano()
	b.out.mu.Lock()
	defer b.out.mu.Unlock()
	for k, s := range b.out.by {
		probe := s.probe != "" && s.probeEnd > now
		if !probe && len(s.minute) == 0 {
			continue
		}
		i := slices.IndexFunc(recs, func(r gate.Record) bool { return r.Scope == k.scope && r.Source == k.source })
		if i < 0 {
			recs = append(recs, gate.Record{Scope: k.scope, Source: k.source})
			i = len(recs) - 1
		}
		if probe {
			recs[i].Probe, recs[i].Epoch, recs[i].ProbeLeft = s.probe, s.epoch, time.Duration(s.probeEnd-now)
		}
		// Handed over: the next switch counts only what Redis admits since.
		recs[i].Minute, s.minute = s.minute, nil
	}
	return recs
}
