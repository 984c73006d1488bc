package redisgate

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
)

// Options configure a Backend. The zero value is the production setting.
type Options struct {
	// Prefix starts every key and channel name; default "polygate:", with
	// no '{' or '}' (the scope's name in braces is the hash tag).
	Prefix string
	// IdleTTL is how long a CLOSED breaker without an override, its
	// source's leases and a scope's progress survive without a write;
	// default 24h, far longer than any lease.
	IdleTTL time.Duration
	// Clock, when set, is the time of every decision in place of the Redis
	// server's TIME (tests only).
	Clock func() time.Time
	// Timeout, when set, bounds every operation, its wait for a call
	// included.
	Timeout time.Duration
	// BatchLinger is the most a scope's next call waits for more ops
	// (batch.go); zero: DefaultBatchLinger; negative: none.
	BatchLinger time.Duration
	// GiveBackQueue bounds the settles kept for Redis (giveback.go);
	// default DefaultGiveBackQueue.
	GiveBackQueue int
	// Log receives the give-back queue's and the loss checks' lines.
	Log *slog.Logger
	// OnStateLoss, when set, is told that Redis lost a scope's state, and
	// how many breakers this Backend re-asserted.
	OnStateLoss func(scope string, restored int)
}

// The values of a zero Options, and the most BatchLinger may be.
const (
	DefaultPrefix      = "polygate:"
	DefaultIdleTTL     = 24 * time.Hour
	DefaultBatchLinger = 2 * time.Millisecond
	MaxBatchLinger     = 100 * time.Millisecond
)

// Backend is a gate.Backend over Redis: a standalone server, a Sentinel
// master or a Cluster, whichever client it is given.
type Backend struct {
	client  redis.UniversalClient
	prefix  string
	idleTTL int64 // ms
	clock   func() time.Time
	timeout time.Duration
	linger  time.Duration // 0: none
	log     *slog.Logger
	replica string // this Backend's name in the lines
	batches batcher
	owed    *giveBacks
	loss    *lossWatch
}

var _ gate.Backend = (*Backend)(nil)

// New returns a Backend that keeps its state in the Redis that client
// reaches. The Backend does not own the client; its owner closes it.
func New(client redis.UniversalClient, o Options) (*Backend, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("redisgate: prefix %q: may not contain '{' or '}'", o.Prefix)
	}
	if o.IdleTTL == 0 {
		o.IdleTTL = DefaultIdleTTL
	}
	if o.IdleTTL < time.Millisecond {
		return nil, fmt.Errorf("redisgate: idle TTL %v: must be at least 1ms", o.IdleTTL)
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("redisgate: timeout %v: must not be negative", o.Timeout)
	}
	if o.BatchLinger == 0 {
		o.BatchLinger = DefaultBatchLinger
	}
	if o.BatchLinger > MaxBatchLinger {
		return nil, fmt.Errorf("redisgate: batch linger %v: must be at most %v (negative: none)", o.BatchLinger, MaxBatchLinger)
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{client: client, prefix: o.Prefix, idleTTL: o.IdleTTL.Milliseconds(), clock: o.Clock,
		timeout: o.Timeout, linger: max(o.BatchLinger, 0), log: log, replica: randomID()}
	b.batches.b = b
	b.owed = newGiveBacks(o.GiveBackQueue, log)
	b.loss = newLossWatch(log, o.OnStateLoss)
	return b, nil
}

// randomID is 120 random bits in base32.
func randomID() string {
	var buf [15]byte
	_, _ = rand.Read(buf[:])
	return base32.StdEncoding.EncodeToString(buf[:])
}

// nowArg is the header's now: 0 (the server's TIME) unless a test clock
// is set (tests need exact boundaries, which an offset added to a moving
// TIME cannot give).
func (b *Backend) nowArg() int64 {
	if b.clock == nil {
		return 0
	}
	return b.clock().UnixMilli()
}

// until is when the Backend's timeout from now passes (zero: none).
func (b *Backend) until() time.Time {
	if b.timeout <= 0 {
		return time.Time{}
	}
	return time.Now().Add(b.timeout)
}

// Admit implements gate.Backend. A scope whose marker is not the one seen
// grants nothing: the Backend re-asserts what it knows and admits again,
// within one timeout (loss.go).
func (b *Backend) Admit(ctx context.Context, req gate.AdmitRequest) (gate.Admission, error) {
	for i, c := range req.Candidates {
		if c.Source == nil {
			return gate.Admission{}, fmt.Errorf("redisgate: admit: candidate %d has no source", i)
		}
	}
	if len(req.PermitID) > gate.MaxText {
		return gate.Admission{}, fmt.Errorf("redisgate: admit: a permit id of %d bytes, at most %d", len(req.PermitID), gate.MaxText)
	}
	until := b.until()
	for round := 0; ; round++ {
		v, err := b.batches.do(ctx, until, &op{admit: &req})
		if err != nil {
			return gate.Admission{}, err
		}
		out, unmarked, err := b.admission(&req, v)
		if err != nil {
			b.owed.giveBack(&req) // it may have granted: nobody holds the permit
			return gate.Admission{}, err
		}
		if unmarked == nil {
			return out, nil
		}
		if round > 0 {
			return gate.Admission{}, fmt.Errorf("redisgate: admit: %w: redis lost the scope's state again during the re-assert", gate.ErrUnavailable)
		}
		if err := b.remark(ctx, until, req.Scope, *unmarked); err != nil {
			return gate.Admission{}, err
		}
	}
}

// Settle implements gate.Backend. A settle that fails is repeated until
// Redis confirms it (giveback.go).
func (b *Backend) Settle(ctx context.Context, req gate.SettleRequest) (gate.Settlement, error) {
	if req.Source == nil {
		return gate.Settlement{}, errors.New("redisgate: settle: no source")
	}
	if len(req.PermitID) > gate.MaxText {
		// No lease is held under it (Admit refuses it): nothing to repeat.
		return gate.Settlement{}, fmt.Errorf("redisgate: settle: a permit id of %d bytes, at most %d", len(req.PermitID), gate.MaxText)
	}
	v, err := b.batches.do(ctx, b.until(), &op{settle: &req})
	if err != nil {
		return gate.Settlement{}, err
	}
	out, err := b.settlement(&req, v)
	if err != nil {
		b.owed.add(&op{settle: &req})
		return gate.Settlement{}, err
	}
	return out, nil
}

// Peek implements gate.Backend.
func (b *Backend) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	for i, s := range req.Sources {
		if s == nil {
			return gate.Snapshot{}, fmt.Errorf("redisgate: peek: source %d is nil", i)
		}
	}
	c := newCall(b, req.Scope, b.loss.seen(req.Scope))
	c.peek(&req)
	v, err := b.single(ctx, c)
	if err != nil {
		return gate.Snapshot{}, err
	}
	return b.snapshot(&req, v)
}

// Override implements gate.Backend.
func (b *Backend) Override(ctx context.Context, req gate.OverrideRequest) (gate.OverrideResult, error) {
	if req.Source == nil {
		return gate.OverrideResult{}, errors.New("redisgate: override: no source")
	}
	if err := gate.CheckOverride(req.Action, req.Actor, req.Why); err != nil {
		return gate.OverrideResult{}, err
	}
	c := newCall(b, req.Scope, b.loss.seen(req.Scope))
	c.override(&req)
	v, err := b.single(ctx, c)
	if err != nil {
		return gate.OverrideResult{}, err
	}
	return b.overridden(&req, v)
}

// Leave implements gate.Backend.
func (b *Backend) Leave(ctx context.Context, req gate.LeaveRequest) error {
	if len(req.Sources) == 0 {
		return nil
	}
	c := newCall(b, req.Scope, "")
	c.leave(&req)
	_, err := b.single(ctx, c)
	return err
}

// single runs c, one op, as a call of its own, and returns its reply.
func (b *Backend) single(ctx context.Context, c *call) (any, error) {
	rctx, cancel := b.bound(ctx, time.Time{})
	defer cancel()
	replies, err := b.run(rctx, c)
	if err != nil {
		return nil, b.wrap(ctx, "call", err)
	}
	return replies[0], opError(replies[0])
}

// run makes call c and returns its replies: each op's values, or error.
func (b *Backend) run(ctx context.Context, c *call) ([]any, error) {
	keys, argv := c.args()
	v, err := b.fcall(ctx, keys, argv)
	if err != nil {
		return nil, err
	}
	replies, err := split(v, c.n)
	if err != nil {
		return nil, err
	}
	b.owed.poke()
	return replies, nil
}

// opError is the error an op raised in Lua, if it did.
func opError(v any) error {
	err, _ := v.(error)
	return err
}

// bound puts the Backend's timeout (or until, when set) on ctx.
func (b *Backend) bound(ctx context.Context, until time.Time) (context.Context, context.CancelFunc) {
	if until.IsZero() {
		until = b.until()
	}
	if until.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, until)
}

// Ping checks that Redis answers; an error wraps gate.ErrUnavailable.
func (b *Backend) Ping(ctx context.Context) error {
	rctx, cancel := b.bound(ctx, time.Time{})
	defer cancel()
	if err := b.client.Ping(rctx).Err(); err != nil {
		return b.wrap(ctx, "ping", err)
	}
	b.owed.poke()
	return nil
}

// wrap names what failed and sorts the error: the caller's context ending
// passes through; Redis that cannot be reached or serve now (the Backend's
// own timeout included: not context.DeadlineExceeded, which is the
// caller's) wraps gate.ErrUnavailable; anything else is a bug.
func (b *Backend) wrap(ctx context.Context, what string, err error) error {
	cerr := ctx.Err()
	if d, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(d) {
		// The caller's deadline fired on the socket before ctx's timer.
		cerr = context.DeadlineExceeded
	}
	switch {
	case cerr != nil:
		return fmt.Errorf("redisgate: %s: %w (%v)", what, cerr, err)
	case unavailable(err):
		return fmt.Errorf("redisgate: %s: %w: %v", what, gate.ErrUnavailable, err)
	}
	return fmt.Errorf("redisgate: %s: %w", what, err)
}

// unavailable reports whether err means Redis cannot be reached or serve
// now (not a script or protocol error).
func unavailable(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // network errors, timeouts, a full or closed pool
	}
	if redis.IsClusterDownError(err) || redis.IsLoadingError(err) || redis.IsReadOnlyError(err) ||
		redis.IsMasterDownError(err) || redis.IsTryAgainError(err) || redis.IsMaxClientsError(err) ||
		redis.IsNoReplicasError(err) || redis.IsOOMError(err) {
		return true
	}
	return redis.HasErrorPrefix(err, "BUSY") || redis.HasErrorPrefix(err, "MISCONF")
}
