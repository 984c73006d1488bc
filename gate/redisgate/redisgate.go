package redisgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
)

// Options configure a Backend. The zero value is the production setting.
type Options struct {
	// Prefix starts every key and channel name; default "polygate:". It may
	// not contain '{' or '}': the scope's name in braces is the hash tag.
	Prefix string
	// IdleTTL is how long a CLOSED breaker without an override, and a
	// scope's progress, survive without a write; default 24h. It should be
	// far longer than any permit's lease.
	IdleTTL time.Duration
	// Clock, when set, is the time of every decision in place of the Redis
	// server's TIME. Tests only: see the package documentation.
	Clock func() time.Time
	// Timeout, when set, bounds every round trip: a context deadline around
	// each script run and ping, which the client honours on its socket when
	// its ContextTimeoutEnabled is set (the sidecar sets it).
	Timeout time.Duration
	// GiveBackQueue bounds the settles kept for Redis while it does not
	// answer (see RunGiveBacks); default DefaultGiveBackQueue.
	GiveBackQueue int
	// Log receives the give-back queue's and the state checks' lines;
	// default none.
	Log *slog.Logger
	// OnStateLoss, when set, is told (from RunGiveBacks) that Redis lost a
	// scope's state, and how many breakers were re-asserted.
	OnStateLoss func(scope string, restored int)
}

// DefaultPrefix and DefaultIdleTTL are the values of a zero Options.
const (
	DefaultPrefix  = "polygate:"
	DefaultIdleTTL = 24 * time.Hour
)

// Backend is a gate.Backend over Redis: a standalone server, a Sentinel
// master or a Cluster, whichever client it is given. Each method is one
// script run (EVALSHA, or EVAL once after a SCRIPT FLUSH or restart).
type Backend struct {
	client  redis.UniversalClient
	prefix  string
	idleTTL int64 // ms
	clock   func() time.Time
	timeout time.Duration
	orphans *orphans
	memory  memory
	onLoss  func(scope string, restored int)
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
	return &Backend{client: client, prefix: o.Prefix, idleTTL: o.IdleTTL.Milliseconds(), clock: o.Clock,
		timeout: o.Timeout, orphans: newOrphans(o.GiveBackQueue, o.Log), onLoss: o.OnStateLoss}, nil
}

// scopeEscaper keeps braces out of the hash tag (and stays injective).
var scopeEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// tag is the part of every key of the scope up to the hash tag's end.
func (b *Backend) tag(scope string) string {
	return b.prefix + "{" + scopeEscaper.Replace(scope) + "}"
}

func (b *Backend) progressKey(scope string) string { return b.tag(scope) + ":progress" }

// channel is the name of the scope's announcement channel.
func (b *Backend) channel(scope string) string { return b.tag(scope) + ":events" }

// sourceKeys appends the source's breaker, leases, log and data keys.
func (b *Backend) sourceKeys(keys []string, scope, source string) []string {
	base := b.tag(scope) + ":src:" + source + ":"
	return append(keys, base+"brk", base+"leases", base+"log", base+"data")
}

// nowArg is the now_ms argument: 0 (use TIME) unless a test clock is set.
func (b *Backend) nowArg() int64 {
	if b.clock == nil {
		return 0
	}
	return b.clock().UnixMilli()
}

func policyArgs(args []any, p gate.BreakerPolicy) []any {
	return append(args, p.FailThreshold, p.MinCalls, strconv.FormatFloat(p.FailRate, 'g', -1, 64),
		p.Window.Milliseconds(), p.Cooldown.Milliseconds(), p.MaxCooldown.Milliseconds(), p.ProbeTTL.Milliseconds())
}

func flag(v bool) int {
	if v {
		return 1
	}
	return 0
}

// Admit implements gate.Backend.
func (b *Backend) Admit(ctx context.Context, req gate.AdmitRequest) (gate.Admission, error) {
	const op = "admit"
	keys := make([]string, 0, 1+4*len(req.Candidates))
	keys = append(keys, b.progressKey(req.Scope))
	args := make([]any, 0, 7+13*len(req.Candidates))
	args = append(args, b.nowArg(), b.idleTTL, b.channel(req.Scope), req.Scope, req.PermitID, req.Tokens, len(req.Candidates))
	for i, c := range req.Candidates {
		if c.Source == nil {
			return gate.Admission{}, fmt.Errorf("redisgate: %s: candidate %d has no source", op, i)
		}
		keys = b.sourceKeys(keys, req.Scope, c.Source.Name)
		l := c.Source.Limits
		args = append(args, c.Source.Name, c.Ceiling, l.MaxConcurrency, l.RPM, l.TPM, l.Lease.Milliseconds())
		args = policyArgs(args, c.Source.Breaker)
	}
	v, err := b.run(ctx, op, admitScript, keys, args)
	if err != nil {
		b.lostAdmit(req) // the script may have run: nobody would own its permit
		return gate.Admission{}, err
	}
	p := &parser{op: op}
	r := p.array(v, 7)
	n := int64(len(req.Candidates))
	name := func(i int64) string {
		if i < 1 || i > n {
			p.fail("candidate index %d outside 1..%d", i, n)
			return ""
		}
		return req.Candidates[i-1].Source.Name
	}
	var out gate.Admission
	for _, rv := range p.array(r[3], 0) {
		rj := p.array(rv, 3)
		out.Rejections = append(out.Rejections, gate.Rejection{
			Source: name(p.int(rj[0])), Reason: gate.Reason(p.int(rj[1])), RetryAfter: ms(p.int(rj[2])),
		})
	}
	out.Events = p.events(r[4], name)
	out.ProgressAge = progressAge(p.int(r[5]), p.int(r[6]))
	if g := p.int(r[0]); g != 0 {
		if name(g); p.err == nil {
			c := req.Candidates[g-1]
			out.Granted = true
			out.Permit = gate.Permit{
				ID: req.PermitID, Source: c.Source.Name, Probe: p.int(r[1]) == 1, Epoch: p.uint(r[2]),
				Tokens: req.Tokens, Lease: c.Source.Limits.Lease,
			}
		}
	}
	if p.err != nil {
		return gate.Admission{}, p.err
	}
	b.memory.see(req.Scope, out.Events, time.Now())
	return out, nil
}

// Settle implements gate.Backend. A settle that fails is also kept for
// RunGiveBacks, which repeats it until Redis confirms.
func (b *Backend) Settle(ctx context.Context, req gate.SettleRequest) (gate.Settlement, error) {
	if req.Source == nil {
		return gate.Settlement{}, fmt.Errorf("redisgate: settle: no source")
	}
	st, err := b.settle(ctx, req)
	if err != nil {
		b.orphans.add(req, 1)
	}
	return st, err
}

func (b *Backend) settle(ctx context.Context, req gate.SettleRequest) (gate.Settlement, error) {
	const op = "settle"
	keys := b.sourceKeys([]string{b.progressKey(req.Scope)}, req.Scope, req.Source.Name)
	args := []any{
		b.nowArg(), b.idleTTL, b.channel(req.Scope), req.Scope, req.Source.Name, req.PermitID,
		strconv.FormatUint(req.Epoch, 10), flag(req.Probe), int(req.Verdict), req.Floor.Milliseconds(),
		req.ActualTokens, flag(req.Progress),
	}
	args = policyArgs(args, req.Source.Breaker)
	v, err := b.run(ctx, op, settleScript, keys, args)
	if err != nil {
		return gate.Settlement{}, err
	}
	p := &parser{op: op}
	r := p.array(v, 6)
	out := gate.Settlement{
		Released: p.int(r[0]) == 1,
		Effect:   gate.Effect(p.int(r[1])),
		Events:   p.events(r[2], p.single(req.Source.Name)),
		Breaker:  p.breakerView(r[3]),
	}
	out.ProgressAge = progressAge(p.int(r[4]), p.int(r[5]))
	if p.err != nil {
		return gate.Settlement{}, p.err
	}
	b.memory.see(req.Scope, out.Events, time.Now())
	return out, nil
}

// Peek implements gate.Backend.
func (b *Backend) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	const op = "peek"
	keys := make([]string, 0, 1+4*len(req.Sources))
	keys = append(keys, b.progressKey(req.Scope))
	args := make([]any, 0, 3+6*len(req.Sources))
	args = append(args, b.nowArg(), len(req.Sources), req.Tokens)
	for i, s := range req.Sources {
		if s == nil {
			return gate.Snapshot{}, fmt.Errorf("redisgate: %s: source %d is nil", op, i)
		}
		keys = b.sourceKeys(keys, req.Scope, s.Name)
		l := s.Limits
		args = append(args, s.Breaker.Window.Milliseconds(), req.Candidate(i).Ceiling, l.MaxConcurrency, l.RPM, l.TPM, l.Lease.Milliseconds())
	}
	v, err := b.run(ctx, op, peekScript, keys, args)
	if err != nil {
		return gate.Snapshot{}, err
	}
	p := &parser{op: op}
	r := p.array(v, 3)
	views := p.array(r[2], len(req.Sources))
	out := gate.Snapshot{Sources: make([]gate.SourceView, 0, len(req.Sources)), ProgressAge: progressAge(p.int(r[0]), p.int(r[1]))}
	for i, s := range req.Sources {
		if p.err != nil {
			break
		}
		sv := p.array(views[i], 3)
		vd := p.array(sv[2], 2)
		out.Sources = append(out.Sources, gate.SourceView{
			Source: s.Name, Breaker: p.breakerView(sv[0]), Quota: p.quotaView(sv[1]),
			Verdict: gate.Rejection{Source: s.Name, Reason: gate.Reason(p.int(vd[0])), RetryAfter: ms(p.int(vd[1]))},
		})
	}
	if p.err != nil {
		return gate.Snapshot{}, p.err
	}
	return out, nil
}

// Override implements gate.Backend.
func (b *Backend) Override(ctx context.Context, req gate.OverrideRequest) (gate.OverrideResult, error) {
	const op = "override"
	if req.Source == nil {
		return gate.OverrideResult{}, fmt.Errorf("redisgate: %s: no source", op)
	}
	if req.Action < gate.ActionForceOpen || req.Action > gate.ActionReset {
		return gate.OverrideResult{}, fmt.Errorf("%w: %d", gate.ErrUnknownAction, req.Action)
	}
	keys := b.sourceKeys(nil, req.Scope, req.Source.Name)
	args := []any{
		b.nowArg(), b.idleTTL, b.channel(req.Scope), req.Scope, req.Source.Name, int(req.Action), req.Actor, req.Why,
		req.Source.Breaker.Window.Milliseconds(),
	}
	v, err := b.run(ctx, op, overrideScript, keys, args)
	if err != nil {
		return gate.OverrideResult{}, err
	}
	p := &parser{op: op}
	r := p.array(v, 4)
	out := gate.OverrideResult{
		Events: p.events(r[0], p.single(req.Source.Name)),
		View:   gate.SourceView{Source: req.Source.Name, Breaker: p.breakerView(r[1]), Quota: p.quotaView(r[2])},
	}
	if p.err != nil {
		return gate.OverrideResult{}, p.err
	}
	b.memory.see(req.Scope, out.Events, time.Now())
	return out, nil
}

// Ping checks that Redis answers; an error wraps gate.ErrUnavailable.
func (b *Backend) Ping(ctx context.Context) error {
	rctx, cancel := b.bound(ctx)
	defer cancel()
	if err := b.client.Ping(rctx).Err(); err != nil {
		return b.wrap(ctx, "ping", err)
	}
	b.orphans.poke()
	return nil
}

// bound puts the Backend's timeout on ctx.
func (b *Backend) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if b.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.timeout)
}

// run runs one script: EVALSHA, and EVAL if the server lacks the script.
func (b *Backend) run(ctx context.Context, op string, s *redis.Script, keys []string, args []any) (any, error) {
	rctx, cancel := b.bound(ctx)
	defer cancel()
	v, err := s.Run(rctx, b.client, keys, args...).Result()
	if err != nil {
		// wrap sees the caller's ctx: the Backend's own deadline passing
		// means Redis did not answer in time (unavailable), not that the
		// caller gave up.
		return nil, b.wrap(ctx, op, err)
	}
	b.orphans.poke()
	return v, nil
}

// wrap names what failed and sorts the error: the caller's context ending
// passes through; Redis that cannot be reached or cannot serve now wraps
// gate.ErrUnavailable; anything else (a script error) is a bug and does not.
func (b *Backend) wrap(ctx context.Context, op string, err error) error {
	switch {
	case ctx.Err() != nil:
		if errors.Is(err, ctx.Err()) {
			return fmt.Errorf("redisgate: %s: %w", op, err)
		}
		return fmt.Errorf("redisgate: %s: %w (%v)", op, ctx.Err(), err)
	case unavailable(err):
		return fmt.Errorf("redisgate: %s: %w: %w", op, gate.ErrUnavailable, err)
	}
	return fmt.Errorf("redisgate: %s script: %w", op, err)
}

// unavailable reports whether err means Redis cannot be reached or cannot
// serve right now (as opposed to a script or protocol error).
func unavailable(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		// Network errors, timeouts, a full or closed pool: no answer at all.
		return true
	}
	if redis.IsClusterDownError(err) || redis.IsLoadingError(err) || redis.IsReadOnlyError(err) ||
		redis.IsMasterDownError(err) || redis.IsTryAgainError(err) || redis.IsMaxClientsError(err) ||
		redis.IsNoReplicasError(err) || redis.IsOOMError(err) {
		return true
	}
	for _, prefix := range []string{"BUSY", "MISCONF"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

// progressAge mirrors the memory backend: 0 is "never".
func progressAge(progress, now int64) time.Duration {
	if progress == 0 {
		return gate.Never
	}
	return ms(now - progress)
}
