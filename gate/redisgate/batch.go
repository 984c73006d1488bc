package redisgate

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/gate"
)

// Group commit. Most of what a script call costs Redis is paid per call, not
// per decision: the FCALL itself, TIME, the scope's marker and progress. So
// the Admits and Settles of one scope (one hash tag) go out together: at
// most one batch call (batch.lua) of a scope is in flight, the ops that
// arrive meanwhile gather, and they go out as the next call when it
// returns (after a linger: below). A lone op goes out at once, as a call of
// its own function (admit.lua, settle.lua: a batch of one would cost Redis
// more Lua work); under load an op waits for the call in flight and a
// linger, and never longer than the Backend's timeout in all. Each RPC is
// still one round trip, its op one of the batch's. A batch runs its
// settles first, then its admits, each kind in arrival order
// (settlesFirst), atomically: the same as separate calls back to back. All of a batch's ops were pending at once,
// so any order of them is a legal interleaving of concurrent requests; this
// one frees slots before the admits ask, and makes runs of one kind that
// batch.lua decides together (batch_ops).
//
// What a batch owes Redis when its reply is lost is settled per op, as a
// single call's would be: a failed or timed-out batch call sends each of
// its admits to lostAdmit (it may have granted) and each of its settles to
// the give-back queue; an op's own error (it raised in Lua) fails that op
// alone. A caller that gives up while its op gathers drops an admit (never
// sent, nothing owed) but not a settle, which is sent anyway; one that gives
// up (or reaches the Backend's timeout) after its op was sent stops
// waiting, with what the op owes queued first as if its reply were lost (a
// give-back of the permit, a repeated settle), and the batch, bounded by
// its own timeout and not by any caller's context, goes on.

// maxBatchOps and maxBatchKeys bound one batch call (each op is one
// argument: opArg); the ops beyond wait for the next. An op larger than the
// bounds goes alone.
const (
	maxBatchOps  = 64
	maxBatchKeys = 1024
)

// A batch numbers its sources in one byte (batchOpArgs's map): the key
// bound must keep them under 256.
func init() {
	if maxBatchKeys/len(batchSrcKeys.suffixes) > 255 {
		panic("redisgate: maxBatchKeys allows a batch more sources than one byte numbers")
	}
}

// maxQueuedOps bounds the ops of one scope waiting for its next batch (a
// Redis that answers slowly makes them pile up): an admit beyond it fails at
// once as unavailable; a settle beyond it goes to the give-back queue
// (bounded too) and fails the same way.
var maxQueuedOps = 10000 // a variable for tests

// opKind is what a batch op runs (batch.lua's BATCH_FNS).
type opKind int

const (
	opAdmit  opKind = 1
	opSettle opKind = 2
)

// batchOp is one Admit's or Settle's call, waiting for its batch.
type batchOp struct {
	kind opKind
	name string // the op, as errors name it
	// keys and args are a call of its own's; srcs names the sources whose
	// keys it takes, in order (a batch passes each source's keys once, and
	// kmap, written by runBatch, says where they are: batchOpArgs).
	keys []string
	arg  opArg
	srcs []string
	kmap string
	// conf is the op's CONF argument (confArgs: the scope's block, then a
	// SRC_CONF per source, in srcs' order), confEnds where each block
	// ends; a batch sends each distinct block once, and cmap, written by
	// runBatch, says which is the op's.
	conf     []byte
	confEnds []int
	cmap     string
	// pk is what its blocks are written from (a local's address would
	// escape through the layouts' functions: an allocation each).
	pk     packing
	admit  *gate.AdmitRequest  // an admit's request (areq), for lostAdmit
	settle *gate.SettleRequest // a settle's (sreq), for the give-back queue
	areq   gate.AdmitRequest
	sreq   gate.SettleRequest
	done   chan batchResult // one reply, buffered
	// sent: in a batch call; gone: its caller stopped waiting (under
	// batcher.mu).
	sent, gone bool
}

// The batcher keeps ops between calls (ops), each with its reply channel
// and the capacity of its argument, keys and sources: an op goes back
// (free) once its caller has its reply, when no one else holds it (the
// batch is done with it before it sends the reply) and nothing can be sent
// on its channel again (deliver sends once). An op whose caller stopped
// waiting is left to the GC: its batch may still hold it. The pools are
// the Backend's, not the package's: a channel or timer made in a synctest
// bubble may not be used outside it.

// maxKeptArg bounds the argument buffer an op keeps in the pool.
const maxKeptArg = 4 << 10

func (c *batcher) newOp(kind opKind, name string) *batchOp {
	o, ok := c.ops.Get().(*batchOp)
	if !ok {
		o = &batchOp{done: make(chan batchResult, 1)}
	}
	o.kind, o.name = kind, name
	return o
}

// free returns o to the pool; its caller has had its reply.
func (c *batcher) free(o *batchOp) {
	keep := batchOp{done: o.done, keys: o.keys[:0], srcs: o.srcs[:0], confEnds: o.confEnds[:0]}
	if cap(o.arg.buf) <= maxKeptArg {
		keep.arg.buf = o.arg.buf[:0]
	}
	if cap(o.conf) <= maxKeptArg {
		keep.conf = o.conf[:0]
	}
	if cap(keep.confEnds) > maxBatchKeys {
		keep.confEnds = nil
	}
	clear(o.keys[:cap(o.keys)])
	clear(o.srcs[:cap(o.srcs)])
	if cap(keep.keys) > maxBatchKeys {
		keep.keys = nil
	}
	if o.kind == opSettle || cap(keep.srcs) > maxBatchKeys {
		keep.srcs = nil // a settle's are its pk.src
	}
	*o = keep
	c.ops.Put(o)
}

// startTimer is a timer of an op's wait, kept (stopTimer) for the next
// one: a wait's timer is garbage once it returns.
func (c *batcher) startTimer(d time.Duration) *time.Timer {
	if t, ok := c.timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

// stopTimer keeps t for the next wait: stopped, it sends nothing more
// (Go 1.23's timers), whether it fired or not. Under
// GODEBUG=asynctimerchan=1 a timer that fired while the reply won the
// select holds a value the next wait would read as its own timeout: it is
// drained first.
func (c *batcher) stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	c.timers.Put(t)
}

// packing is what an op's blocks are written from.
type packing struct {
	admit   call[gate.AdmitRequest]
	settle  call[gate.SettleRequest]
	line    lineArg
	handoff handoffArg
	place   string
	src     [1]string // a settle's srcs
}

// kmapRoom is a map's room: an op keeps room for its BATCH_OP block
// (headRoom) with a map of as many sources as its own.
var kmapRoom = string(make([]byte, 256))

// headRoom is the size of o's BATCH_OP block in a batch (0 if it has too
// many sources to go in one).
func (o *batchOp) headRoom() int {
	if len(o.srcs) >= len(kmapRoom) {
		return 0
	}
	o.kmap, o.cmap = kmapRoom[:len(o.srcs)], kmapRoom[:len(o.srcs)] // a map and a cmap: one byte per source
	defer func() { o.kmap, o.cmap = "", "" }()
	return batchOpArgs.size(o)
}

// permit is the op's permit: the admit's or the settle's.
func (o *batchOp) permit() string {
	if o.kind == opAdmit {
		return o.admit.PermitID
	}
	return o.settle.PermitID
}

// scope is the op's scope.
func (o *batchOp) scope() string {
	if o.kind == opAdmit {
		return o.admit.Scope
	}
	return o.settle.Scope
}

// script is the op's own function, for an op that goes alone.
func (o *batchOp) script() *op {
	if o.kind == opAdmit {
		return admitScript
	}
	return settleScript
}

type batchResult struct {
	v   any
	err error
}

// batcher is the Backend's combiner: the scopes with a batch in flight.
type batcher struct {
	mu sync.Mutex
	// scopes holds, by tag, the ops waiting for the scope's next batch; a
	// scope is in it while its drain runs.
	scopes map[string]*batchQueue
	// ops and timers keep ops (newOp, free) and their waits' timers.
	ops, timers sync.Pool
}

type batchQueue struct {
	ops []*batchOp
	// full, while the drain lingers, is closed (and set nil) by the op
	// that makes a full batch wait (nil: not lingering).
	full chan struct{}
}

// cut is how many of the ops waiting go in the next batch, and whether
// that batch is full: bounded by maxBatchOps or by maxBatchKeys with ops
// left over.
func (q *batchQueue) cut() (n int, full bool) {
	nk := 0
	for _, o := range q.ops {
		if n == maxBatchOps || n > 0 && nk+len(o.keys) > maxBatchKeys {
			return n, true
		}
		n, nk = n+1, nk+len(o.keys)
	}
	return n, n == maxBatchOps
}

// Lingering. Most of a batch call's cost to Redis does not depend on its
// size (~339 k instructions a call, besides ~47 k per attempt cycle: at the
// sidecars' ~9 cycles per call, close to half of Redis's work per attempt;
// docs/performance.md, twelfth session), and a batch holds the ops that
// arrived while the call before it was in flight. So after a call that
// carried two ops or more (the scope has company: more will come), the
// drain waits before the next one, as long as that call took and at most
// the Backend's linger (Options.BatchLinger), and less once a full batch
// waits (maxBatchOps ops, or maxBatchKeys keys: cut): an op's time in the
// backend at most doubles, and the next batch holds what arrives meanwhile
// too. After an op alone (a quiet scope), or with the linger off, the next
// goes at once. A caller's wait, linger included, stays bounded by its
// context and the Backend's timeout (do). BatchStats counts the calls,
// their ops and the time lingered.

// do runs o in the scope's next batch and waits for its reply, until ctx,
// the caller's, ends or until passes (the Backend's timeout from the
// call's start; zero: none): the wait for the call in flight before its
// own and its own call together, so that an answer is never later than
// one timeout, as a call of its own would be. A caller that stops waiting
// first leaves its op to the batch (gone), which settles what it owes
// (deliver); one that has its reply returns the op to the pool. (A pooled
// timer, not a context with a timeout per op: that one allocated its
// context, its timer and an entry among the caller's context's children.)
func (b *Backend) do(ctx context.Context, until time.Time, tag string, o *batchOp) (any, error) {
	if o.kind == opAdmit && (ctx.Err() != nil || !until.IsZero() && !time.Now().Before(until)) {
		// Ended before it was queued: never sent, nothing owed (a settle
		// is sent anyway, as below). Not queued at all, since a batch
		// that answered before the wait below looked could otherwise hand
		// the caller a grant instead of its context's end.
		err := b.gaveUp(ctx, o.name)
		b.batches.free(o)
		return nil, err
	}
	c := &b.batches
	c.mu.Lock()
	if c.scopes == nil {
		c.scopes = map[string]*batchQueue{}
	}
	q := c.scopes[tag]
	start := q == nil
	if start {
		q = &batchQueue{}
		c.scopes[tag] = q
	}
	if len(q.ops) >= maxQueuedOps {
		c.mu.Unlock()
		if o.kind == opSettle {
			b.orphans.add(*o.settle, 1)
		}
		err := fmt.Errorf("redisgate: %s: %w: %d requests of the scope already wait for redis", o.name, gate.ErrUnavailable, maxQueuedOps)
		c.free(o)
		return nil, err
	}
	q.ops = append(q.ops, o)
	if q.full != nil {
		if _, full := q.cut(); full {
			close(q.full)
			q.full = nil
		}
	}
	c.mu.Unlock()
	if start {
		go b.drain(tag, q)
	}
	var timeout <-chan time.Time
	if !until.IsZero() {
		t := c.startTimer(time.Until(until))
		defer c.stopTimer(t)
		timeout = t.C
	}
	select {
	case r := <-o.done:
		c.free(o)
		return r.v, r.err
	case <-ctx.Done():
	case <-timeout:
	}
	c.mu.Lock()
	select {
	case r := <-o.done:
		c.mu.Unlock()
		c.free(o)
		return r.v, r.err
	default:
	}
	o.gone = true
	sent := o.sent
	if !sent && o.kind == opAdmit {
		q.ops = slices.DeleteFunc(q.ops, func(x *batchOp) bool { return x == o })
	}
	c.mu.Unlock()
	if sent {
		// Its call may run yet, or may have run: what it owes is queued
		// before its caller hears (as for a call of its own whose reply is
		// lost); deliver's queuing later finds it there.
		b.owe(o)
	}
	return nil, b.gaveUp(ctx, o.name)
}

// gaveUp is the error of a caller that stopped waiting: its context's end,
// else the Backend's timeout (which wrap calls unavailable).
func (b *Backend) gaveUp(ctx context.Context, name string) error {
	err := ctx.Err()
	if err == nil {
		err = context.DeadlineExceeded
	}
	return b.wrap(ctx, name, err)
}

// drain sends the scope's batches, one at a time, until none is waiting,
// lingering before each after a call of two ops or more.
func (b *Backend) drain(tag string, q *batchQueue) {
	c := &b.batches
	var last time.Duration // the last call's time, if it was a batch
	for {
		c.mu.Lock()
		if d := min(last, b.linger); d > 0 && len(q.ops) > 0 {
			if _, full := q.cut(); !full {
				b.lingerFor(q, d)
			}
		}
		if len(q.ops) == 0 {
			delete(c.scopes, tag)
			c.mu.Unlock()
			return
		}
		n, _ := q.cut()
		ops := q.ops[:n:n]
		for _, o := range ops {
			o.sent = true
		}
		q.ops = q.ops[n:]
		c.mu.Unlock()
		// (counted before its callers have their replies: a caller that
		// has one sees its call counted)
		b.stats.calls.Add(1)
		b.stats.ops.Add(uint64(n))
		start := time.Now()
		b.runBatch(ops)
		last = 0
		if n > 1 {
			last = time.Since(start)
		}
	}
}

// lingerFor waits, with c.mu held on entry and on return (not meanwhile),
// until d has passed or a full batch waits in q (do closes full).
func (b *Backend) lingerFor(q *batchQueue, d time.Duration) {
	c := &b.batches
	full := make(chan struct{})
	q.full = full
	c.mu.Unlock()
	start := time.Now()
	t := c.startTimer(d)
	select {
	case <-full:
	case <-t.C:
	}
	c.stopTimer(t)
	b.stats.lingered.Add(uint64(time.Since(start)))
	c.mu.Lock()
	q.full = nil // (closed already, or never to be)
}

// batchStats counts the drains' calls (BatchStats).
type batchStats struct {
	calls, ops, lingered atomic.Uint64
}

// BatchStats counts the calls that carried Admits and Settles.
type BatchStats struct {
	// Calls counts the script calls of Admits and Settles (a batch, or an
	// op alone), Ops the ops they carried: Ops/Calls is the mean batch.
	Calls, Ops uint64
	// Lingered is the drains' time spent lingering (Options.BatchLinger).
	Lingered time.Duration
}

// BatchStats reports the batch counters.
func (b *Backend) BatchStats() BatchStats {
	return BatchStats{Calls: b.stats.calls.Load(), Ops: b.stats.ops.Load(), Lingered: time.Duration(b.stats.lingered.Load())}
}

// runBatch makes one batch call of ops, all of one scope, and hands each
// op its reply. The Backend's timeout bounds the call, not any caller's
// context; wrap sees none either, so that a deadline passing means
// unavailable.
func (b *Backend) runBatch(ops []*batchOp) {
	ctx, cancel := b.bound(context.Background())
	defer cancel()
	if len(ops) == 1 {
		// An op alone calls its own function, which costs Redis less Lua
		// work than a batch of one; its errors are its own either way.
		o := ops[0]
		v, err := b.call(ctx, o.script(), o.keys, []any{o.arg.bytes(), o.conf})
		r := batchResult{v: v}
		if err != nil {
			r.v, r.err = nil, b.wrap(context.Background(), o.name, err)
		} else {
			b.orphans.poke()
		}
		b.deliver(o, r)
		return
	}
	if !b.arrival {
		settlesFirst(ops)
	}
	sn := b.namesOf(ops[0].scope())
	// The scope's keys, then each source's (room for one: most batches
	// have one source).
	keys := append(make([]string, 0, len(scopeKeys.suffixes)+len(batchSrcKeys.suffixes)), sn.scope...)
	index := map[string]byte{} // each source's number among the batch's
	var pre []batchPre         // by number - 1
	// nl counts the lease fields in pre: one per op and source of the op,
	// kept small by maxBatchKeys, which counts each op's own keys (six per
	// source: SRC_KEYS and LINE_KEYS), so at most maxBatchKeys/6 of them.
	nl := 0
	for _, o := range ops {
		m := make([]byte, len(o.srcs))
		for i, src := range o.srcs {
			j, ok := index[src]
			if !ok {
				j = byte(len(index) + 1) // < 256: see batchOpArgs
				index[src] = j
				keys = append(keys, sn.source(src)...)
				pre = append(pre, batchPre{})
			}
			m[i] = j
			p := &pre[j-1]
			p.leases = append(p.leases, leaseField+o.permit())
			p.window = p.window || o.kind == opSettle
			nl++
		}
		o.kmap = string(m)
	}
	// The ops' CONF blocks, each distinct one once: the scope's (the same
	// for every op of the scope) and the sources' (fewer than 256, as the
	// sources of the ops: see batchOpArgs).
	conf := slices.Clone(ops[0].conf[:ops[0].confEnds[0]])
	confIndex := map[string]byte{}
	for _, o := range ops {
		m := make([]byte, len(o.confEnds)-1)
		for i := range m {
			blk := o.conf[o.confEnds[i]:o.confEnds[i+1]]
			j, ok := confIndex[string(blk)]
			if !ok {
				conf = append(conf, blk...)
				j = byte(len(confIndex) + 1)
				confIndex[string(blk)] = j
			}
			m[i] = j
		}
		o.cmap = string(m)
	}
	args := make([]any, 0, batchArgs.width()+1+batchPreArgs.width()*len(pre)+nl+len(ops))
	args = batchArgs.pack(args, &batchCall{b, len(ops), len(pre)})
	args = append(args, conf)
	for i := range pre {
		args = batchPreArgs.pack(args, &pre[i])
		for _, f := range pre[i].leases {
			args = append(args, f)
		}
	}
	for _, o := range ops {
		// One argument per op: its BATCH_OP block, then its own (opArg),
		// written in the room the op left for it, else in a copy.
		if h := batchOpArgs.size(o); h == o.arg.head {
			batchOpArgs.appendTo(o.arg.buf[:0], o)
			args = append(args, o.arg.buf)
		} else {
			args = append(args, append(batchOpArgs.appendTo(make([]byte, 0, h+len(o.arg.bytes())), o), o.arg.bytes()...))
		}
	}
	v, err := b.call(ctx, batchScript, keys, args)
	replies, ok := v.([]any)
	var bad error // a reply that is not one per op: a bug
	if err == nil {
		b.orphans.poke()
		if !ok || len(replies) != len(ops) {
			bad = fmt.Errorf("want an array of %d replies, got %T of %d", len(ops), v, len(replies))
		}
	}
	var later []laterReply
	if err == nil && bad == nil {
		later = laterReplies(ops, replies)
	}
	for i, o := range ops {
		var r batchResult
		switch {
		case err != nil:
			r.err = b.wrap(context.Background(), o.name, err)
		case bad != nil:
			r.err = fmt.Errorf("redisgate: %s: batch reply: %w", o.name, bad)
		case later != nil && later[i].err != nil:
			r.err = fmt.Errorf("redisgate: %s: batch reply: %w", o.name, later[i].err)
		case later != nil && later[i].fewer > 0:
			r.v = later[i]
		default:
			if e, isErr := replies[i].(error); isErr {
				r.err = b.wrap(context.Background(), o.name, e)
			} else {
				r.v = replies[i]
			}
		}
		b.deliver(o, r)
	}
}

// laterReply is a settle's reply given as a later op's (settle_run): the
// settle d ops later, of the same source and configuration, answered with
// the same SETTLE_R at the same time, its breaker's record and window
// fewer calls later (fewer: a chain's sum).
type laterReply struct {
	v     any // that op's reply: an array
	fewer int64
	err   error
}

// laterReplies resolves a batch's settles that answered 1 (settle_run:
// "the next op's reply, with one call fewer"), from the last op back: the
// next op must be in the batch, a settle of the same source and
// configuration whose reply is an array or resolves to one (a chain: d
// calls fewer for the op d later). A number other than 1 is refused, the
// narrowest a hostile reply can claim. It is nil where no op answered a number; an op that answered one
// badly gets its error alone.
func laterReplies(ops []*batchOp, replies []any) []laterReply {
	var later []laterReply
	for i := len(ops) - 1; i >= 0; i-- {
		d, ok := replies[i].(int64)
		if !ok {
			continue
		}
		if later == nil {
			later = make([]laterReply, len(ops))
		}
		j := i + int(d)
		switch {
		case ops[i].kind != opSettle || d != 1 || d >= int64(len(ops)-i):
			later[i].err = fmt.Errorf("reply %d: %d, not the next op of the batch", i+1, d)
		case ops[j].kind != opSettle || ops[j].kmap != ops[i].kmap || ops[j].cmap != ops[i].cmap:
			later[i].err = fmt.Errorf("reply %d: %d: op %d is not a settle of its source and configuration", i+1, d, j+1)
		case later[j].err != nil || later[j].fewer > 0:
			later[i] = later[j]
			if later[i].err == nil {
				later[i].fewer += d
			}
		default:
			if _, isArr := replies[j].([]any); !isArr {
				later[i].err = fmt.Errorf("reply %d: %d: op %d's reply is %T, not a settle's", i+1, d, j+1, replies[j])
			} else {
				later[i] = laterReply{v: replies[j], fewer: d}
			}
		}
	}
	return later
}

// settlesFirst orders ops, in place, settles first and then admits, each
// kind in arrival order (a stable partition; ops are at most maxBatchOps).
func settlesFirst(ops []*batchOp) {
	n := 0 // the settles moved to the front so far
	for i, o := range ops {
		if o.kind == opSettle {
			copy(ops[n+1:i+1], ops[n:i])
			ops[n] = o
			n++
		}
	}
}

// deliver hands o its reply, after queuing what it owes Redis if the reply
// is an error; a grant whose caller is gone goes to lostAdmit.
func (b *Backend) deliver(o *batchOp, r batchResult) {
	if r.err != nil && !unmarkedErr(r.err) { // UNMARKED granted nothing
		b.owe(o)
	}
	c := &b.batches
	c.mu.Lock()
	gone := o.gone
	if !gone {
		o.done <- r
	}
	c.mu.Unlock()
	if gone && r.err == nil && o.kind == opAdmit && grants(r.v) {
		b.lostAdmit(*o.admit)
	}
}

// owe queues what o owes Redis when its reply is lost: an admit's
// give-back on each candidate, a settle's repetition. The queue keeps one
// entry per permit and source, so owing twice is owing once.
func (b *Backend) owe(o *batchOp) {
	if o.kind == opSettle {
		b.orphans.add(*o.settle, 1)
	} else {
		b.lostAdmit(*o.admit)
	}
}

// grants reports whether an admit's reply granted a permit (or cannot be
// read: then it may have).
func grants(v any) bool {
	p := &parser{op: "admit"}
	r := admitReply.parse(p, v)
	return p.err != nil || r.granted != 0
}
