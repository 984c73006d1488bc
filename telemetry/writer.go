package telemetry

import (
	"context"
	"time"
)

// run is the writer goroutine.
func (s *Sink) run() {
	defer close(s.done)
	batch := make([]record, 0, batchSize)
	every := min(max(s.retention/10, time.Second), time.Hour)
	prune := time.NewTicker(every)
	defer prune.Stop()
	warn := time.NewTicker(warnEvery)
	defer warn.Stop()
	wait := time.NewTimer(linger)
	wait.Stop()
	s.prune()
	for {
		select {
		case r := <-s.queue:
			batch = append(batch[:0], r)
			if r.kind != kindFlush {
				batch = s.collect(batch, wait)
			}
			s.write(batch)
		case <-prune.C:
			s.prune()
		case <-warn.C:
			s.check(true)
		case <-s.stop:
			for {
				batch = s.fill(batch[:0])
				if len(batch) == 0 {
					return
				}
				s.write(batch)
			}
		}
	}
}

// collect adds records to batch for up to linger, until the batch is full,
// a flush marker arrives or the sink stops.
func (s *Sink) collect(batch []record, wait *time.Timer) []record {
	wait.Reset(linger)
	defer wait.Stop()
	for len(batch) < batchSize {
		select {
		case r := <-s.queue:
			batch = append(batch, r)
			if r.kind == kindFlush {
				return batch
			}
		case <-wait.C:
			return batch
		case <-s.stop:
			return batch
		}
	}
	return batch
}

// fill adds what is queued to batch without waiting, up to batchSize.
func (s *Sink) fill(batch []record) []record {
	for len(batch) < batchSize {
		select {
		case r := <-s.queue:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// write writes a batch in one transaction, notes what that did to the
// sink's health, and answers the batch's flush markers.
func (s *Sink) write(batch []record) {
	var calls, attempts uint64
	for i := range batch {
		switch batch[i].kind {
		case kindCall:
			calls++
		case kindAttempt:
			attempts++
		}
	}
	ok := true
	if calls+attempts > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.st.write(ctx, batch)
		cancel()
		if err != nil {
			ok = false
			s.failedWrites.Add(1)
			s.writeDropped.Add(calls + attempts)
			s.health.err = err
		} else {
			s.calls.Add(calls)
			s.attempts.Add(attempts)
		}
	}
	if calls+attempts > 0 {
		s.health.lastWriteOK = ok
	}
	s.check(false)
	for i := range batch {
		if batch[i].kind == kindFlush {
			close(batch[i].flushed)
		}
		batch[i] = record{} // let go of the strings
	}
}

func (s *Sink) prune() {
	if s.retention <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := s.st.prune(ctx, s.now().Add(-s.retention).UnixNano())
	s.pruned.Add(uint64(n))
	if err != nil {
		s.log.Warn("telemetry: pruning old rows failed; it is retried at the next interval", "path", s.path, "err", err)
	}
}
