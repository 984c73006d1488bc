package redisgate

import (
	"container/list"
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
	// IdleTTL is how long a CLOSED breaker without an override, its leases
	// and a scope's progress outlive their last write; default 24h.
	IdleTTL time.Duration
	// Clock, when set, is the time of every decision in place of the Redis
	// server's TIME (tests only: an offset on a moving TIME cannot give them
	// exact boundaries).
	Clock func() time.Time
	// Timeout, when set, bounds every operation, its wait for a call too.
	Timeout time.Duration
	// BatchLinger is the most a scope's next call waits for more ops
	// (batch.go); zero: DefaultBatchLinger; negative: none.
	BatchLinger time.Duration
	// GiveBackQueue bounds the settles kept for Redis; 0: DefaultGiveBackQueue.
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
	if o.GiveBackQueue <= 0 {
		o.GiveBackQueue = DefaultGiveBackQueue
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{client: client, prefix: o.Prefix, idleTTL: o.IdleTTL.Milliseconds(), clock: o.Clock,
		timeout: o.Timeout, linger: max(o.BatchLinger, 0), log: log, replica: randomID(),
		owed: &giveBacks{items: map[owedKey]*op{}, max: o.GiveBackQueue, log: log, kick: make(chan struct{}, 1)},
		loss: &lossWatch{scopes: map[string]*scopeWatch{}, records: list.New(), log: log, onLoss: o.OnStateLoss}}
	b.batches.b, b.batches.scopes = b, map[string]*queue{}
	return b, nil
}

// randomID is 120 random bits in base32.
func randomID() string {
	var buf [15]byte
	_, _ = rand.Read(buf[:])
	return base32.StdEncoding.EncodeToString(buf[:])
}

// until is when the Backend's timeout from now passes (zero: none).
func (b *Backend) until() time.Time {
	if b.timeout <= 0 {
		return time.Time{}
	}
	return time.Now().Add(b.timeout)
}

// Admit implements gate.Backend, re-asserting first after a loss (loss.go).
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

// Settle implements gate.Backend; one that fails is repeated (giveback.go).
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
	return b.snapshot(&req, b.single(ctx, c))
}

// Override implements gate.Backend.
func (b *Backend) Override(ctx context.Context, req gate.OverrideRequest) (gate.OverrideResult, error) {
	if req.Source == nil {
		return gate.OverrideResult{}, errors.New("redisgate: override: no source")
	}
	if err := gate.CheckOverride(req.Action, req.Actor, req.Why); err != nil {
		return gate.OverrideResult{}, err
	}
	for round := 0; ; round++ {
		c := newCall(b, req.Scope, b.loss.seen(req.Scope))
		c.override(&req)
		out, unmarked, err := b.overridden(&req, b.single(ctx, c))
		switch {
		case err != nil || unmarked == nil:
			return out, err
		case round > 0:
			return out, fmt.Errorf("redisgate: override: %w: redis lost the scope's state again during the re-assert", gate.ErrUnavailable)
		}
		if err := b.remark(ctx, b.until(), req.Scope, *unmarked); err != nil {
			return out, err
		}
	}
}

// Leave implements gate.Backend.
func (b *Backend) Leave(ctx context.Context, req gate.LeaveRequest) error {
	if len(req.Sources) == 0 {
		return nil
	}
	c := newCall(b, req.Scope, "")
	c.leave(&req)
	err, _ := b.single(ctx, c).(error)
	return err
}

// single runs c, one op, as a call of its own, and returns its reply: its
// values, or the error it or the call raised.
func (b *Backend) single(ctx context.Context, c *call) any {
	replies, err := b.exec(ctx, c)
	if err != nil {
		return err
	}
	return replies[0]
}

// exec makes call c within the Backend's timeout and returns its replies.
func (b *Backend) exec(ctx context.Context, c *call) ([]any, error) {
	rctx, cancel := b.bound(ctx, time.Time{})
	defer cancel()
	keys, argv := c.args()
	v, err := b.fcall(rctx, keys, argv)
	var replies []any
	if err == nil {
		replies, err = split(v, c.n)
	}
	if err != nil {
		return nil, b.wrap(ctx, "call", err)
	}
	b.owed.poke()
	return replies, nil
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
// passes through; Redis that cannot serve now (the Backend's own timeout
// included: context.DeadlineExceeded is the caller's) wraps
// gate.ErrUnavailable; anything else is a bug.
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
	return redis.IsClusterDownError(err) || redis.IsLoadingError(err) || redis.IsReadOnlyError(err) ||
		redis.IsMasterDownError(err) || redis.IsTryAgainError(err) || redis.IsMaxClientsError(err) ||
		redis.IsNoReplicasError(err) || redis.IsOOMError(err) || redis.HasErrorPrefix(err, "BUSY") || redis.HasErrorPrefix(err, "MISCONF")
}
