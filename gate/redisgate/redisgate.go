package redisgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
)

// Options configure a Backend. The zero value is the production setting.
type Options struct {
	// Prefix starts every key and channel name; default "polygate:". It may
	// not contain '{' or '}': the scope's name in braces is the hash tag.
	Prefix string
	// IdleTTL is how long a CLOSED breaker without an override (with the
	// leases of its source), and a scope's progress, survive without a
	// write; default 24h. A source's state is given it again only once an
	// eighth of it has passed, so it lasts between 7/8 of it and all of it
	// after the last write. It should be far longer than any permit's
	// lease.
	IdleTTL time.Duration
	// Clock, when set, is the time of every decision in place of the Redis
	// server's TIME. Tests only: see the package documentation.
	Clock func() time.Time
	// Timeout, when set, bounds every round trip: a context deadline around
	// each script run and ping, which the client honours on its socket when
	// its ContextTimeoutEnabled is set (the sidecar sets it).
	Timeout time.Duration
	// BatchLinger is the most a scope's next batch waits for more ops after
	// a call that carried two or more, and never longer than that call took
	// (see batch.go, Lingering); zero: DefaultBatchLinger; negative: none.
	BatchLinger time.Duration
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
	// DefaultBatchLinger is the value of a zero Options.BatchLinger, and
	// MaxBatchLinger its most.
	DefaultBatchLinger = 2 * time.Millisecond
	MaxBatchLinger     = 100 * time.Millisecond
)

// Backend is a gate.Backend over Redis: a standalone server, a Sentinel
// master or a Cluster, whichever client it is given. Each method is one
// script run (EVALSHA, or EVAL once after a SCRIPT FLUSH or restart).
type Backend struct {
	client  redis.UniversalClient
	prefix  string
	idleTTL int64 // ms
	clock   func() time.Time
	scripts atomic.Bool // Functions refused: EVALSHA only
	timeout time.Duration
	orphans *orphans
	memory  memory
	batches batcher
	linger  time.Duration // Options.BatchLinger, 0 for none
	stats   batchStats
	// arrival: a batch runs its ops in arrival order, not settles first
	// (KeepArrivalOrder, tests only: see settlesFirst).
	arrival bool
	onLoss  func(scope string, restored int)
	replica string // this Backend among those sharing a line
	// peeks are the keys of each scope's peek (peekKeys), by scope; npeeks
	// counts them; peekMu orders their changes (a peek of new keys) and
	// those of names, each scope's names (namesOf), which nnames counts.
	peeks  sync.Map
	npeeks atomic.Int64
	peekMu sync.Mutex
	names  sync.Map
	nnames int
}

var _ gate.Backend = (*Backend)(nil)

// New returns a Backend that keeps its state in the Redis that client
// reaches. The Backend does not own the client; its owner closes it. The
// Backend reuses an admit's or a settle's argument bytes once its call
// returns: a hook of the client that keeps a command's arguments past the
// call must copy them (as redistest.Recorder does).
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
	b := &Backend{client: client, prefix: o.Prefix, idleTTL: o.IdleTTL.Milliseconds(), clock: o.Clock,
		timeout: o.Timeout, linger: max(o.BatchLinger, 0), orphans: newOrphans(o.GiveBackQueue, o.Log), onLoss: o.OnStateLoss, replica: newReplica()}
	b.memory.wake, b.memory.log = b.orphans.wake, b.orphans.log
	return b, nil
}

// scopeEscaper keeps braces out of the hash tag (and stays injective).
var scopeEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// tag is the part of every key of the scope up to the hash tag's end.
func (b *Backend) tag(scope string) string {
	return b.prefix + "{" + scopeEscaper.Replace(scope) + "}"
}

// channelSuffix follows the tag in the name of the scope's announcement
// channel.
const channelSuffix = ":events"

// appendSourceKeys appends the source's keys (sourceKeys) after the
// scope's tag.
func appendSourceKeys(keys []string, tag, source string) []string {
	return appendKeys(keys, tag+":src:"+source+":", sourceKeys.suffixes)
}

// appendScopeKeys appends the scope's own keys (scopeKeys) after its tag.
func appendScopeKeys(keys []string, tag string) []string {
	return appendKeys(keys, tag+":", scopeKeys.suffixes)
}

// appendKeys appends base followed by each suffix, the keys made as one
// string and sliced (one allocation per block of keys, not one per key: an
// admit's keys are garbage once it is sent, and 10 000 held calls' Picks
// make a heap that many GC cycles wide, docs/performance.md).
func appendKeys(keys []string, base string, suffixes []string) []string {
	n := len(base) * len(suffixes)
	for _, s := range suffixes {
		n += len(s)
	}
	var b strings.Builder
	b.Grow(n)
	for _, s := range suffixes {
		b.WriteString(base)
		b.WriteString(s)
	}
	all, at := b.String(), 0
	for _, s := range suffixes {
		end := at + len(base) + len(s)
		keys = append(keys, all[at:end])
		at = end
	}
	return keys
}

// names are the names of a scope's calls, made once per scope (namesOf)
// instead of per call (a Pick's keys are garbage once it is sent, and
// 10 000 held calls' Picks make a heap that many GC cycles wide,
// docs/performance.md): its tag, its channel, its own keys, its CONF_H
// block (the same for every call of the scope; never written: calls copy
// it), and each source's keys (source).
type names struct {
	tag, channel string
	scope        []string // scopeKeys
	conf         []byte   // confArgs
	mu           sync.Mutex
	srcs         map[string][]string // under mu
}

// maxNames bounds the scopes whose names are kept, and the sources of each
// (both come from the configuration): a new one past it clears them all.
const maxNames = 4096

// namesOf is scope's names: those kept, else made (and kept).
func (b *Backend) namesOf(scope string) *names {
	if v, ok := b.names.Load(scope); ok {
		return v.(*names)
	}
	n := &names{tag: b.tag(scope), srcs: map[string][]string{}}
	n.channel = n.tag + channelSuffix
	n.scope = appendScopeKeys(nil, n.tag)
	n.conf = confArgs.appendTo(nil, &scopeConf{b, n.tag, scope})
	b.peekMu.Lock()
	defer b.peekMu.Unlock()
	if v, ok := b.names.Load(scope); ok {
		return v.(*names)
	}
	if b.nnames >= maxNames {
		b.names.Clear() // past the bound (reloads that renamed scopes): start over
		b.nnames = 0
	}
	b.names.Store(scope, n)
	b.nnames++
	return n
}

// source is source's keys in the scope: its own (sourceKeys), then its
// line's (lineKeys), as batchSrcKeys. The caller may not write them.
func (n *names) source(source string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sourceLocked(source)
}

// appendKeys appends the keys of srcs as a call of its own takes them: each
// source's own keys, then each one's line's, under one lock.
func (n *names) appendKeys(keys, srcs []string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range srcs {
		keys = append(keys, n.sourceLocked(s)[:len(sourceKeys.suffixes)]...)
	}
	for _, s := range srcs {
		keys = append(keys, n.sourceLocked(s)[len(sourceKeys.suffixes):]...)
	}
	return keys
}

// sourceLocked is source, with mu held.
func (n *names) sourceLocked(source string) []string {
	k, ok := n.srcs[source]
	if !ok {
		if len(n.srcs) >= maxNames {
			clear(n.srcs)
		}
		k = appendLineKeys(appendSourceKeys(make([]string, 0, len(batchSrcKeys.suffixes)), n.tag, source), n.tag, source)
		n.srcs[source] = k
	}
	return k
}

// nowArg is the now_ms argument: 0 (use TIME) unless a test clock is set.
func (b *Backend) nowArg() int64 {
	if b.clock == nil {
		return 0
	}
	return b.clock().UnixMilli()
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
	n := len(req.Candidates)
	for i := range req.Candidates {
		if req.Candidates[i].Source == nil {
			return gate.Admission{}, fmt.Errorf("redisgate: %s: candidate %d has no source", op, i)
		}
	}
	if len(req.PermitID) > gate.MaxText {
		return gate.Admission{}, fmt.Errorf("redisgate: %s: a permit id of %d bytes, at most %d", op, len(req.PermitID), gate.MaxText)
	}
	until := b.until()
	v, err := b.admit(ctx, until, &req)
	if unmarkedErr(err) {
		// Redis lost the scope since this Backend last looked (or it never
		// looked): nothing was granted. Re-assert what it knows, then admit,
		// all within the one timeout.
		b.memory.suspect(req.Scope)
		if err := b.restoreUntil(ctx, until, req.Scope); err != nil {
			return gate.Admission{}, err
		}
		if v, err = b.admit(ctx, until, &req); unmarkedErr(err) {
			return gate.Admission{}, fmt.Errorf("redisgate: %s: %w: redis lost the scope's state again during the re-assert", op, gate.ErrUnavailable)
		}
	}
	if err != nil {
		return gate.Admission{}, err // what it owes Redis is queued (batch.go)
	}
	p := &parser{op: op}
	r := admitReply.parse(p, v)
	name := func(i int64) string {
		if i < 1 || i > int64(n) {
			p.fail("candidate index %d outside 1..%d", i, n)
			return ""
		}
		return req.Candidates[i-1].Source.Name
	}
	var out gate.Admission
	out.Rejections = admitRejections(p, r.rejections, r.granted, name)
	out.Events = p.events(r.evs, name)
	out.ProgressAge = r.clock.age()
	if req.Line != nil {
		if len(r.line.places) != n && len(r.line.places) != 0 { // none: no place in any line
			p.fail("%d places for %d candidates", len(r.line.places), n)
		}
		for i, place := range r.line.places {
			if place != "" && i < n {
				if out.Places == nil {
					out.Places = map[string]string{}
				}
				out.Places[req.Candidates[i].Source.Name] = place
			}
		}
	}
	if r.granted != 0 {
		if name(r.granted); p.err == nil {
			c := req.Candidates[r.granted-1]
			out.Granted = true
			out.Permit = gate.Permit{
				ID: req.PermitID, Source: c.Source.Name, Probe: r.probe == 1, Epoch: r.epoch,
				Tokens: req.Tokens, Lease: c.Source.Limits.Lease,
			}
		}
	}
	if p.err != nil {
		b.lostAdmit(req) // it may have granted: nobody holds the permit
		return gate.Admission{}, p.err
	}
	b.memory.see(req.Scope, out.Events, time.Now(), true)
	return out, nil
}

// admit runs admit.lua once, in the scope's next batch, until ctx ends or
// until passes.
func (b *Backend) admit(ctx context.Context, until time.Time, r *gate.AdmitRequest) (any, error) {
	n := len(r.Candidates)
	o := b.batches.newOp(opAdmit, "admit")
	o.areq = *r
	req := &o.areq
	o.admit = req
	sn := b.namesOf(req.Scope)
	keys := append(slices.Grow(o.keys, len(scopeKeys.suffixes)+len(batchSrcKeys.suffixes)*n), sn.scope...)
	if cap(o.srcs) < n && n <= len(o.pk.src) {
		// One candidate: the op's own room (an op a settle used comes back
		// from the pool with no sources: see free).
		o.srcs = o.pk.src[:0]
	}
	o.srcs = slices.Grow(o.srcs, n)[:n]
	pk := &o.pk
	pk.admit, pk.line = call[gate.AdmitRequest]{b: b, req: req, tag: sn.tag, channel: sn.channel, seen: b.memory.marker(req.Scope)}, lineArg{b, req.Line}
	size := admitArgs.size(&pk.admit) + waiterArgs.size(&pk.line)
	for i := range req.Candidates {
		c := &req.Candidates[i]
		o.srcs[i] = c.Source.Name
		pk.place = placeOf(req.Line, c.Source.Name)
		size += candArgs.size(c) + placeArgs.size(&pk.place)
	}
	o.arg.start(o.headRoom(), 2*n+2, size) // ADMIT, the CANDs, WAITER, a PLACE per candidate
	admitArgs.put(&o.arg, &pk.admit)
	head := sn.conf
	conf, ends := append(o.conf[:0], head...), append(o.confEnds[:0], len(head))
	for i := range req.Candidates {
		c := &req.Candidates[i]
		candArgs.put(&o.arg, c)
		conf = srcConfArgs.appendTo(conf, c.Source)
		ends = append(ends, len(conf))
	}
	waiterArgs.put(&o.arg, &pk.line)
	for _, name := range o.srcs {
		pk.place = placeOf(req.Line, name) // "": a newcomer's, most Picks'
		placeArgs.put(&o.arg, &pk.place)
	}
	o.keys, o.conf, o.confEnds = sn.appendKeys(keys, o.srcs), conf, ends
	return b.do(ctx, until, sn.tag, o)
}

// restoreUntil is restore within ctx bounded by until (zero: none).
func (b *Backend) restoreUntil(ctx context.Context, until time.Time, scope string) error {
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if !until.IsZero() {
		rctx, cancel = context.WithDeadline(ctx, until)
	}
	defer cancel()
	return b.restore(ctx, rctx, scope)
}

// placeOf is the waiter's place in source's line ("" none).
func placeOf(w *gate.Waiter, source string) string {
	if w == nil {
		return ""
	}
	return w.Places[source]
}

// unmarkedErr reports whether admit.lua refused to run because the
// scope's marker is not the one this Backend saw (see reassert.go).
// (nil at once: HasErrorPrefix allocates its errors.As target every call.)
func unmarkedErr(err error) bool { return err != nil && redis.HasErrorPrefix(err, "UNMARKED") }

// Settle implements gate.Backend. A settle that fails is also kept for
// RunGiveBacks, which repeats it until Redis confirms; one whose caller
// gives up is sent all the same (batch.go).
func (b *Backend) Settle(ctx context.Context, req gate.SettleRequest) (gate.Settlement, error) {
	if req.Source == nil {
		return gate.Settlement{}, fmt.Errorf("redisgate: settle: no source")
	}
	if len(req.PermitID) > gate.MaxText {
		// No lease is held under it (Admit refuses it), and the reply would
		// echo it (a stale outcome's event): refused before the round trip,
		// nothing queued for a give-back.
		return gate.Settlement{}, fmt.Errorf("redisgate: settle: a permit id of %d bytes, at most %d", len(req.PermitID), gate.MaxText)
	}
	return b.settle(ctx, req)
}

func (b *Backend) settle(ctx context.Context, req gate.SettleRequest) (gate.Settlement, error) {
	const op = "settle"
	sn := b.namesOf(req.Scope)
	o := b.batches.newOp(opSettle, op)
	o.sreq = req
	o.settle = &o.sreq
	pk := &o.pk
	pk.settle, pk.handoff, pk.src = call[gate.SettleRequest]{b: b, req: o.settle, tag: sn.tag, channel: sn.channel}, handoffArg{b, req.Line}, [1]string{req.Source.Name}
	o.srcs = pk.src[:]
	o.keys = sn.appendKeys(append(o.keys, sn.scope...), o.srcs)
	o.arg.start(o.headRoom(), 2, settleArgs.size(&pk.settle)+handoffArgs.size(&pk.handoff)) // SETTLE, HANDOFF
	settleArgs.put(&o.arg, &pk.settle)
	handoffArgs.put(&o.arg, &pk.handoff)
	head := sn.conf
	o.conf = srcConfArgs.appendTo(append(o.conf[:0], head...), req.Source)
	o.confEnds = append(o.confEnds[:0], len(head), len(o.conf))
	v, err := b.do(ctx, b.until(), sn.tag, o)
	if err != nil {
		return gate.Settlement{}, err // queued for the give-back if it failed (batch.go)
	}
	p := &parser{op: op}
	out := settlementOf(p, v, req)
	if p.err != nil {
		b.orphans.add(req, 1)
		return gate.Settlement{}, p.err
	}
	b.memory.see(req.Scope, out.Events, time.Now(), true)
	return out, nil
}

// settlementOf reads a settle's reply v: its own, or a later settle's of
// the same run (laterReply, batch.go), whose breaker counts fewer calls
// before it; an error is p's.
func settlementOf(p *parser, v any, req gate.SettleRequest) gate.Settlement {
	fewer := int64(0)
	if l, ok := v.(laterReply); ok {
		v, fewer = l.v, l.fewer
	}
	r := settleReply.parse(p, v)
	out := gate.Settlement{
		Released:    r.released == 1,
		Effect:      gate.Effect(r.effect),
		Events:      p.events(r.evs, p.single(req.Source.Name)),
		Breaker:     breakerAt(p, r.breaker, r.window, req.Source.Breaker, r.clock.now),
		ProgressAge: r.clock.age(),
		Handoff:     r.handoff,
	}
	if out.Breaker.Calls < fewer {
		p.fail("a later settle's reply with %d calls, want at least %d", out.Breaker.Calls, fewer)
	}
	out.Breaker.Calls -= fewer
	return out
}

// Peek implements gate.Backend.
func (b *Backend) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	const op = "peek"
	if req.Line == nil {
		growStack(0)
	}
	n := len(req.Sources)
	for i, s := range req.Sources {
		if s == nil {
			return gate.Snapshot{}, fmt.Errorf("redisgate: %s: source %d is nil", op, i)
		}
	}
	pk := b.peekKeysOf(req.Scope, req.Sources)
	tag, keys := pk.tag, pk.keys
	words := append(make([]any, 0, len(pk.words)+peekArgs.width()+(peekSourceArgs.width()+joinArgs.width())*n+lineReadArgs.width()+waiterArgs.width()), pk.words...)
	args := peekArgs.pack(words, &call[gate.PeekRequest]{b: b, req: &req, tag: tag})
	for i := range req.Sources {
		c := req.Candidate(i)
		args = peekSourceArgs.pack(args, &c)
	}
	var join *gate.Waiter
	if req.Line == nil {
		args = append(args, absentLineRead)
	} else {
		args = lineReadArgs.pack(args, &lineRead{b, req.Line})
		join = req.Line.Join
	}
	if join == nil {
		args = append(args, absentWaiter)
	} else {
		args = waiterArgs.pack(args, &lineArg{b, join})
	}
	for _, s := range req.Sources {
		if join != nil && slices.Contains(req.Line.Joins, s.Name) {
			args = joinArgs.pack(args, &joinArg{on: true, place: join.Places[s.Name]})
		} else {
			args = append(args, absentJoin)
		}
	}
	v, err := b.runFCall(ctx, op, peekScript, keys, args, args[len(pk.words):])
	if err != nil {
		return gate.Snapshot{}, err
	}
	p := &parser{op: op}
	r := peekReply.parse(p, v)
	views := p.array(r.sources, n)
	out := gate.Snapshot{Sources: make([]gate.SourceView, 0, n), ProgressAge: r.clock.age()}
	for i, s := range req.Sources {
		if p.err != nil {
			break
		}
		ps := peekSource.parse(p, views[i])
		sv := ps.v
		sv.Breaker = breakerAt(p, ps.breaker, ps.window, s.Breaker, r.clock.now)
		sv.Source, sv.Verdict.Source = s.Name, s.Name
		out.Sources = append(out.Sources, sv)
	}
	if p.err != nil {
		return gate.Snapshot{}, p.err
	}
	return out, nil
}

// readStack is about how deep a peek goes below Peek: go-redis's round trip
// (to the socket's write and read) under this package's frames, 3.3 KB
// measured, and its reply's parsing.
const readStack = 5 << 10

// growStack grows the goroutine's stack, when it is smaller, to hold
// readStack more bytes, before the round trip of a peek without a line (a
// shared read: RetryAfter's, OnNoRunnable's, or RecordOutcome's dead check).
// Such a read runs on a fresh goroutine (policy's, for the reads gathered
// behind another and those run apart) or below the frames of a gRPC handler
// that answers right after (whose stack the GC shrinks again), and the
// runtime starts a stack at the average goroutine's size: go-redis's round
// trip outgrew it on most reads, and the runtime copied the stack where it
// did, adjusting every frame of the read's; here there are fewer. A peek
// with a line (OnNoRunnable's caller joining a line, DescribeScope, the
// poller) is left alone: it is no shared read, and the one a held call
// makes on its own goroutine is grown by go-redis all the same and shrunk
// by the GC once the call parks (the stacks of held calls measured the same
// with and without; docs/performance.md, "Shared reads on Redis,
// 2026-12-01 (seventh session)").
//
//go:noinline
func growStack(i int) byte {
	var pad [readStack]byte
	pad[i] = 1
	return pad[readStack-1-i]
}

// peekKeys are a peek's keys (the scope's, each source's, then each
// source's line's) and the scope's tag: the same strings read after read,
// made once per scope and list of sources instead of per read; and FCALL's
// first words with them, boxed (see fcall).
type peekKeys struct {
	tag   string
	names []string
	keys  []string
	words []any // FCALL's first words, boxed (see fcall)
}

// maxPeekKeys bounds the scopes whose peek keys are kept (scopes come from
// the configuration); a new scope past it clears them all.
const maxPeekKeys = 4096

// peekKeysOf is the keys of a peek of srcs (none nil) in scope: those kept
// when they are of the same sources, else made (and kept).
func (b *Backend) peekKeysOf(scope string, srcs []*gate.Source) *peekKeys {
	if v, ok := b.peeks.Load(scope); ok {
		if pk := v.(*peekKeys); slices.EqualFunc(pk.names, srcs, func(n string, s *gate.Source) bool { return n == s.Name }) {
			return pk
		}
	}
	pk := &peekKeys{tag: b.tag(scope), names: make([]string, len(srcs)),
		keys: make([]string, 0, len(scopeKeys.suffixes)+(len(sourceKeys.suffixes)+len(lineKeys.suffixes))*len(srcs))}
	pk.keys = appendScopeKeys(pk.keys, pk.tag)
	for i, s := range srcs {
		pk.names[i] = s.Name
		pk.keys = appendSourceKeys(pk.keys, pk.tag, s.Name)
	}
	for _, s := range srcs {
		pk.keys = appendLineKeys(pk.keys, pk.tag, s.Name)
	}
	pk.words = append(make([]any, 0, 3+len(pk.keys)), "fcall", peekScript.fn, len(pk.keys))
	for _, k := range pk.keys {
		pk.words = append(pk.words, k)
	}
	b.peekMu.Lock()
	defer b.peekMu.Unlock()
	if _, kept := b.peeks.Load(scope); !kept && b.npeeks.Load() >= maxPeekKeys {
		b.peeks.Clear() // past the bound (reloads that renamed scopes): start over
		b.npeeks.Store(0)
	}
	if _, loaded := b.peeks.Swap(scope, pk); !loaded {
		b.npeeks.Add(1)
	}
	return pk
}

// A peek without a line (RetryAfter's, OnNoRunnable's shared reads) sends
// the same absent line, waiter and join blocks every time: packed once, as
// arguments (a block boxed once).
var (
	absentLineRead = lineReadArgs.pack(nil, &lineRead{})[0]
	absentWaiter   = waiterArgs.pack(nil, &lineArg{})[0]
	absentJoin     = joinArgs.pack(nil, &joinArg{})[0]
)

// Override implements gate.Backend.
func (b *Backend) Override(ctx context.Context, req gate.OverrideRequest) (gate.OverrideResult, error) {
	const op = "override"
	if req.Source == nil {
		return gate.OverrideResult{}, fmt.Errorf("redisgate: %s: no source", op)
	}
	if err := gate.CheckOverride(req.Action, req.Actor, req.Why); err != nil {
		return gate.OverrideResult{}, err
	}
	tag := b.tag(req.Scope)
	keys := appendSourceKeys(make([]string, 0, len(sourceKeys.suffixes)), tag, req.Source.Name)
	args := overrideArgs.pack(make([]any, 0, overrideArgs.width()), &call[gate.OverrideRequest]{b: b, req: &req, tag: tag, channel: tag + channelSuffix})
	v, err := b.run(ctx, op, overrideScript, keys, args)
	if err != nil {
		return gate.OverrideResult{}, err
	}
	p := &parser{op: op}
	r := overrideReply.parse(p, v)
	out := gate.OverrideResult{
		Events: p.events(r.evs, p.single(req.Source.Name)),
		View:   gate.SourceView{Source: req.Source.Name, Breaker: breakerAt(p, r.breaker, r.window, req.Source.Breaker, r.now), Quota: quotaView.parse(p, r.quota)},
	}
	if p.err != nil {
		return gate.OverrideResult{}, p.err
	}
	b.memory.see(req.Scope, out.Events, time.Now(), true)
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

// until is when the Backend's timeout from now passes (zero: none).
func (b *Backend) until() time.Time {
	if b.timeout <= 0 {
		return time.Time{}
	}
	return time.Now().Add(b.timeout)
}

// bound puts the Backend's timeout on ctx.
func (b *Backend) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if b.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.timeout)
}

// run runs one operation in one round trip: FCALL of the loaded library,
// or EVALSHA where Functions are unavailable. When the server lacks the
// library (first use, a restart, FUNCTION FLUSH) it loads it and calls
// again; when it refuses FUNCTION LOAD (Redis < 7, ACL) the Backend uses
// scripts from then on. The Backend's timeout bounds the whole run (the
// calls and the load); wrap sees the caller's ctx, so that the Backend's own
// deadline passing means Redis did not answer in time (unavailable), not
// that the caller gave up.
func (b *Backend) run(ctx context.Context, opName string, o *op, keys []string, args []any) (any, error) {
	return b.runFCall(ctx, opName, o, keys, nil, args)
}

// runFCall is run with FCALL's whole command already made (words: see fcall).
func (b *Backend) runFCall(ctx context.Context, opName string, o *op, keys []string, words, args []any) (any, error) {
	rctx, cancel := b.bound(ctx)
	defer cancel()
	return b.runIn(ctx, rctx, opName, o, keys, words, args)
}

// runIn is runFCall within rctx, ctx with the Backend's timeout already put
// on it: an Admit that re-asserts first keeps its round trips within one
// timeout.
func (b *Backend) runIn(ctx, rctx context.Context, opName string, o *op, keys []string, words, args []any) (any, error) {
	v, err := b.callFCall(rctx, o, keys, words, args)
	if err != nil {
		return nil, b.wrap(ctx, opName, err)
	}
	b.orphans.poke()
	return v, nil
}

func (b *Backend) call(ctx context.Context, o *op, keys []string, args []any) (any, error) {
	return b.callFCall(ctx, o, keys, nil, args)
}

// callFCall is call with FCALL's whole command already made (words: see fcall).
func (b *Backend) callFCall(ctx context.Context, o *op, keys []string, words, args []any) (any, error) {
	if !b.scripts.Load() {
		v, err := b.fcall(ctx, o, keys, words, args)
		switch {
		case err == nil || errors.Is(err, redis.Nil):
			return v, nil
		case !noFunction(err):
			return nil, err
		}
		lerr := b.load(ctx)
		if lerr == nil {
			return b.fcall(ctx, o, keys, words, args)
		}
		if !refused(lerr) {
			return nil, lerr
		}
		b.scripts.Store(true) // scripts from now on
	}
	return o.eval.Run(ctx, b.client, keys, args...).Result()
}

// fcall calls o's function with keys and args. words, when not nil, is the
// whole command go-redis sends: "fcall", the function, the number of keys,
// the keys, then args (its tail); a peek keeps those first words, boxed,
// with its keys (peekKeys), where FCall boxed each key anew on every call.
func (b *Backend) fcall(ctx context.Context, o *op, keys []string, words, args []any) (any, error) {
	if words == nil {
		return b.client.FCall(ctx, o.fn, keys, args...).Result()
	}
	cmd := redis.NewCmd(ctx, words...)
	cmd.SetFirstKeyPos(3) // as FCall's: the first key, for a Cluster's slot
	_ = b.client.Process(ctx, cmd)
	return cmd.Result()
}

// load loads the library on the server (every master of a Cluster).
func (b *Backend) load(ctx context.Context) error {
	if c, ok := b.client.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.FunctionLoadReplace(ctx, library()).Err()
		})
	}
	return b.client.FunctionLoadReplace(ctx, library()).Err()
}

// refused reports whether FUNCTION LOAD failed for want of the command
// (Redis < 7) or of the permission, rather than for an error in the library
// (a bug, which scripts would only hide).
func refused(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	m := strings.ToLower(err.Error())
	return strings.Contains(m, "unknown command") || strings.Contains(m, "unknown subcommand") || redis.HasErrorPrefix(err, "NOPERM")
}

// noFunction reports whether err says the function or the FCALL command is
// unknown to the server.
func noFunction(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	m := strings.ToLower(err.Error())
	return strings.Contains(m, "function not found") || strings.Contains(m, "unknown command")
}

// wrap names what failed and sorts the error: the caller's context ending
// passes through; Redis that cannot be reached or cannot serve now wraps
// gate.ErrUnavailable; anything else (a script error) is a bug and does not.
func (b *Backend) wrap(ctx context.Context, op string, err error) error {
	cerr := ctx.Err()
	if d, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(d) {
		// The caller's deadline, put on the socket by the client, fired
		// before the context's own timer cancelled it: the caller's end,
		// not Redis's.
		cerr = context.DeadlineExceeded
	}
	switch {
	case cerr != nil:
		if errors.Is(err, cerr) {
			return fmt.Errorf("redisgate: %s: %w", op, err)
		}
		return fmt.Errorf("redisgate: %s: %w (%v)", op, cerr, err)
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

// admitRejections reads an Admit's rejections as admit.lua answers them: at
// most one per candidate, in the candidates' order, none at or after the
// one granted (granted 0: none was). A reply that breaks this is a bug in
// the script or a Redis not to be trusted, and is refused rather than
// answered to the caller. Each is read into one record (rejection.list
// would allocate each and a list of them); a grant, most admits, has none.
func admitRejections(p *parser, v any, granted int64, name func(int64) string) []gate.Rejection {
	var out []gate.Rejection
	var rj *indexed[gate.Rejection]
	last := int64(0)
	for s := p.str(v); s != "" && p.err == nil; {
		if rj == nil {
			rj = new(indexed[gate.Rejection])
		}
		*rj = indexed[gate.Rejection]{}
		if s = rejection.unpackInto(p, s, rj); p.err != nil {
			break
		}
		switch {
		case rj.src <= last:
			p.fail("a rejection of candidate %d after one of candidate %d", rj.src, last)
		case granted != 0 && rj.src >= granted:
			p.fail("a rejection of candidate %d, at or after candidate %d granted", rj.src, granted)
		}
		last = rj.src
		rj.v.Source = name(rj.src)
		out = append(out, rj.v)
	}
	return out
}

// ms reads a count of milliseconds from Redis as a Duration, saturating.
func ms(v int64) time.Duration { return gate.Millis(v) }

// progressAge mirrors the memory backend: 0 is "never". Both times come
// from Redis, so the difference saturates instead of wrapping.
func progressAge(progress, now int64) time.Duration {
	if progress == 0 {
		return gate.Never
	}
	d := now - progress
	switch {
	case progress > 0 && d > now:
		return math.MinInt64
	case progress < 0 && d < now:
		return math.MaxInt64
	}
	return ms(d)
}
