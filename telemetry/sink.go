package telemetry

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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
