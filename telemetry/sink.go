package telemetry

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/polygate/polygate/policy"
)

// Defaults of Options.
const (
	DefaultQueueSize = 8192
	// batchSize bounds the records one transaction writes.
	batchSize = 1024
	// linger is how long the writer waits, after a record arrives, for more
	// to share its transaction: a transaction costs far more than a row, and
	// a record a tenth of a second late in the database costs nothing.
	linger = 100 * time.Millisecond
	// warnEvery bounds the degradation log lines: one when records start
	// being lost, then at most one reminder per interval while they still
	// are, and one when the sink recovers (checked once per interval).
	warnEvery = time.Minute
)

// Options configure a Sink.
type Options struct {
	// Path of the SQLite database, created if missing.
	Path string
	// Retention: rows older than this are deleted, checked every
	// Retention/10 (at most hourly, at least every second).
	Retention time.Duration
	// QueueSize bounds the records waiting to be written; a record that finds
	// the queue full is dropped and counted (DefaultQueueSize if 0).
	QueueSize int
	Log       *slog.Logger
	// Now is the clock calls and attempts are timed with (time.Now if nil);
	// it must be the server's.
	Now func() time.Time
}

// Sink is a policy.Observer that records every call and every attempt. The
// observer side only copies a record into a bounded queue without blocking;
// one goroutine writes the queue in transactions. A full queue, a full disk
// or a broken database lose records — counted, exported as metrics and
// logged at most once a minute — and never fail or slow a decision.
type Sink struct {
	policy.NopObserver
	log       *slog.Logger
	now       func() time.Time
	path      string
	retention time.Duration
	st        store

	queue    chan record
	stop     chan struct{}
	done     chan struct{}
	closing  sync.Once
	closeErr error

	queueDropped atomic.Uint64
	writeDropped atomic.Uint64
	calls        atomic.Uint64
	attempts     atomic.Uint64
	failedWrites atomic.Uint64
	pruned       atomic.Uint64
	degraded     atomic.Bool

	// health belongs to the writer goroutine.
	health health
}

type kind uint8

const (
	kindCall kind = iota + 1
	kindAttempt
	kindFlush
)

// record is one row, or a flush marker.
type record struct {
	kind          kind
	callID, scope string
	tokens        int64
	failure       string // failure reason, "" if none
	// calls
	started, ended      int64
	result              string
	attempts, charged   int
	productive, waiting int64
	// attempts
	number     int
	source     string
	permit     string
	probe      bool
	epoch      uint64
	settled    int64
	latency    int64
	outcome    string
	httpStatus int
	actual     int64 // -1: not reported
	retryAfter int64
	effect     string
	state      string
	next       string
	backoff    int64 // -1: not a retry
	detail     string
	flushed    chan struct{}
}

// Open opens the database and starts the writer. It fails only if the
// database cannot be opened or its schema created; later failures degrade.
func Open(o Options) (*Sink, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := openSQLite(ctx, o.Path)
	if err != nil {
		return nil, err
	}
	return start(o, st), nil
}

func start(o Options, st store) *Sink {
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	s := &Sink{
		log: o.Log, now: o.Now, path: o.Path, retention: o.Retention, st: st,
		queue: make(chan record, o.QueueSize), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go s.run()
	return s
}

// Close writes what is queued, stops the writer and closes the database.
// Records that arrive later are dropped.
func (s *Sink) Close() error {
	s.closing.Do(func() {
		close(s.stop)
		<-s.done
		s.closeErr = s.st.close()
	})
	return s.closeErr
}

// Flush returns once every record queued before it has been written (or
// dropped by a failed write).
func (s *Sink) Flush(ctx context.Context) error {
	ch := make(chan struct{})
	select {
	case s.queue <- record{kind: kindFlush, flushed: ch}:
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// enqueue never blocks: a record that finds the queue full is counted and dropped.
func (s *Sink) enqueue(r record) {
	select {
	case s.queue <- r:
	default:
		s.queueDropped.Add(1)
	}
}

// Settled implements policy.Observer: the attempt's row, and the call's when
// the outcome ended it.
func (s *Sink) Settled(c *policy.Call, a policy.Attempt, r policy.Recorded) {
	now := s.now()
	rec := record{
		kind: kindAttempt, callID: c.ID, scope: c.Scope, tokens: c.Tokens,
		number: a.Number, source: a.Source, permit: a.PermitID, probe: a.Probe, epoch: a.Epoch,
		settled: now.UnixNano(), latency: int64(a.Latency), outcome: a.Outcome.String(), httpStatus: a.HTTPStatus,
		actual: a.ActualTokens, retryAfter: int64(a.RetryAfter), effect: r.Effect.String(),
		state: r.Breaker.State.String(), backoff: -1, detail: a.Detail,
	}
	if rec.actual < 0 {
		rec.actual = -1
	}
	switch {
	case r.Next.Done:
		rec.next = "done"
	case r.Next.Retry != nil:
		rec.next, rec.backoff = "retry", int64(*r.Next.Retry)
	default:
		rec.next, rec.failure = "failure", r.Next.Failure.Reason.String()
	}
	s.enqueue(rec)
	switch {
	case r.Next.Done:
		s.ended(c, now, "done", "")
	case r.Next.Failure != nil:
		s.ended(c, now, "failure", rec.failure)
	}
}

// Picked implements policy.Observer: a Pick past the call's deadline ends it.
func (s *Sink) Picked(c *policy.Call, p policy.Pick) {
	if p.Failure != nil {
		s.ended(c, s.now(), "failure", p.Failure.Reason.String())
	}
}

// Decided implements policy.Observer: an OnNoRunnable Failure ends the call.
func (s *Sink) Decided(c *policy.Call, d policy.Decision) {
	if d.Failure != nil {
		s.ended(c, s.now(), "failure", d.Failure.Reason.String())
	}
}

// Abandoned records a call that ended without a decision: result is why
// ("expired", "interrupted"). A call its caller cancelled between attempts
// ("cancelled") is written as one cancelled while it held a permit is:
// result failure, failure_reason cancelled — one encoding for a cancelled
// call, whichever moment the caller gave up.
func (s *Sink) Abandoned(c *policy.Call, why string) {
	if why == cancelled {
		s.ended(c, s.now(), "failure", cancelled)
		return
	}
	s.ended(c, s.now(), why, "")
}

// cancelled is the failure reason of a call its caller gave up on.
var cancelled = policy.FailCancelled.String()

// ended queues the call's row, its accounting read at now.
func (s *Sink) ended(c *policy.Call, now time.Time, result, reason string) {
	st := c.Stats(now)
	started := c.Started.UnixNano()
	s.enqueue(record{
		kind: kindCall, callID: c.ID, scope: c.Scope, tokens: c.Tokens, failure: reason,
		started: started, ended: started + int64(now.Sub(c.Started)), result: result,
		attempts: st.Attempts, charged: st.Charged, productive: int64(st.Productive), waiting: int64(st.Waiting),
	})
}

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

// health is the degradation state the writer logs: one line when records
// start being lost, at most one reminder per warnEvery while losses go on,
// and one line when a whole interval passed without a loss.
type health struct {
	degraded            bool
	since, lastLine     time.Time
	seenQueue, seenDrop uint64 // losses already accounted for
	lineQueue, lineDrop uint64 // losses at the last line
	startQueue          uint64 // losses when the degradation began
	startDrop           uint64
	lostThisTick        bool  // a loss was seen since the last tick
	lastWriteOK         bool  // the last transaction committed
	err                 error // the last write error
}

// check looks at the loss counters after a write (tick false) or at each
// warnEvery tick (tick true), and logs the changes of state.
func (s *Sink) check(tick bool) {
	h := &s.health
	q, d := s.queueDropped.Load(), s.writeDropped.Load()
	now := s.now()
	lost := q > h.seenQueue || d > h.seenDrop
	switch {
	case lost && !h.degraded:
		h.degraded, h.since, h.lastLine = true, now, now
		h.startQueue, h.startDrop = h.seenQueue, h.seenDrop
		s.degraded.Store(true)
		s.log.Warn("telemetry degraded: records are being dropped; decisions are not affected", s.lossAttrs(q-h.seenQueue, d-h.seenDrop)...)
		h.lineQueue, h.lineDrop = q, d
	case lost && now.Sub(h.lastLine) >= warnEvery:
		h.lastLine = now
		s.log.Warn("telemetry still degraded: records are being dropped", s.lossAttrs(q-h.lineQueue, d-h.lineDrop)...)
		h.lineQueue, h.lineDrop = q, d
	case tick && h.degraded && !lost && !h.lostThisTick && h.lastWriteOK:
		h.degraded = false
		s.degraded.Store(false)
		s.log.Info("telemetry recovered: records are written again", "path", s.path,
			"dropped_queue_full", q-h.startQueue, "dropped_write_failed", d-h.startDrop, "degraded_for", now.Sub(h.since))
		h.err = nil
	}
	if tick {
		h.lostThisTick = false
	} else if lost {
		h.lostThisTick = true
	}
	h.seenQueue, h.seenDrop = q, d
}

func (s *Sink) lossAttrs(queue, write uint64) []any {
	attrs := []any{"path", s.path, "dropped_queue_full", queue, "dropped_write_failed", write, "queue_size", cap(s.queue)}
	if s.health.err != nil {
		attrs = append(attrs, "err", s.health.err)
	}
	return attrs
}

// Counts are what the sink did so far.
type Counts struct {
	// Rows written.
	Calls, Attempts uint64
	// Records lost to a full queue, and to failed transactions.
	DroppedQueueFull, DroppedWriteFailed uint64
	FailedWrites                         uint64
	Pruned                               uint64
	Degraded                             bool
}

// Counts reads the sink's counters.
func (s *Sink) Counts() Counts {
	return Counts{
		Calls: s.calls.Load(), Attempts: s.attempts.Load(),
		DroppedQueueFull: s.queueDropped.Load(), DroppedWriteFailed: s.writeDropped.Load(),
		FailedWrites: s.failedWrites.Load(), Pruned: s.pruned.Load(), Degraded: s.degraded.Load(),
	}
}

var (
	recordsDesc  = prometheus.NewDesc("polygate_telemetry_records_total", "Rows written to the telemetry database, by table.", []string{"table"}, nil)
	droppedDesc  = prometheus.NewDesc("polygate_telemetry_dropped_records_total", "Records lost, by reason (queue_full, write_failed).", []string{"reason"}, nil)
	failedDesc   = prometheus.NewDesc("polygate_telemetry_failed_writes_total", "Transactions that failed (their records are counted as dropped).", nil, nil)
	degradedDesc = prometheus.NewDesc("polygate_telemetry_degraded", "1 while telemetry records are being lost.", nil, nil)
	queueDesc    = prometheus.NewDesc("polygate_telemetry_queue_length", "Records waiting to be written.", nil, nil)
	capDesc      = prometheus.NewDesc("polygate_telemetry_queue_capacity", "Records the queue holds before it drops.", nil, nil)
	prunedDesc   = prometheus.NewDesc("polygate_telemetry_pruned_rows_total", "Rows deleted for being older than telemetry.retention.", nil, nil)
)

// Describe implements prometheus.Collector.
func (s *Sink) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{recordsDesc, droppedDesc, failedDesc, degradedDesc, queueDesc, capDesc, prunedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Sink) Collect(ch chan<- prometheus.Metric) {
	c := func(d *prometheus.Desc, t prometheus.ValueType, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, float64(v), labels...)
	}
	c(recordsDesc, prometheus.CounterValue, s.calls.Load(), "calls")
	c(recordsDesc, prometheus.CounterValue, s.attempts.Load(), "attempts")
	c(droppedDesc, prometheus.CounterValue, s.queueDropped.Load(), "queue_full")
	c(droppedDesc, prometheus.CounterValue, s.writeDropped.Load(), "write_failed")
	c(failedDesc, prometheus.CounterValue, s.failedWrites.Load())
	degraded := uint64(0)
	if s.degraded.Load() {
		degraded = 1
	}
	c(degradedDesc, prometheus.GaugeValue, degraded)
	c(queueDesc, prometheus.GaugeValue, uint64(len(s.queue)))
	c(capDesc, prometheus.GaugeValue, uint64(cap(s.queue)))
	c(prunedDesc, prometheus.CounterValue, s.pruned.Load())
}
