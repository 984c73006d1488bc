package redisgate

import (
	"context"
	"encoding/binary"
	"math"
	"time"

	"github.com/polygate/polygate/gate"
)

// SourceKey is the key of a source's state hash (suffix "") or of its
// minute's log or data ("log", "data"), for tests that look at what is
// stored.
func (b *Backend) SourceKey(scope, source, suffix string) string {
	keys := appendLineKeys(appendSourceKeys(nil, b.tag(scope), source), b.tag(scope), source)
	for i, n := range batchSrcKeys.names {
		if n == suffix || (suffix == "" && n == "state") {
			return keys[i]
		}
	}
	panic("no source key " + suffix)
}

// StateField is the state hash's field of the breaker record.
const StateField = "b"

// DecodeBreaker reads the breaker record stored in StateField by name:
// int64 numbers and strings.
func DecodeBreaker(s string) (map[string]any, error) { return stateRecord.decode(s) }

var _ = func() bool {
	if stateRecord.field != StateField {
		panic("StateField is not the breaker record's field")
	}
	return true
}()

// HeadNow reads the now_ms field from the first argument of a call of the
// function or script fn (the head block of every operation starts with it;
// an admit's or a settle's one argument, opArg, starts with its position);
// ok is false if it is not such a block.
func HeadNow(fn, arg any) (now int64, ok bool) {
	b, isBlock := arg.([]byte)
	for _, o := range []*op{admitScript, settleScript} {
		if isBlock && (fn == o.fn || fn == o.eval.Hash()) && len(b) >= 4 {
			at := binary.LittleEndian.Uint32(b)
			if uint64(at) > uint64(len(b)) {
				return 0, false
			}
			b = b[at:]
		}
	}
	if !isBlock || len(b) < 8 {
		return 0, false
	}
	for _, names := range [][]string{batchArgs.lua().names, admitArgs.lua().names, settleArgs.lua().names, peekArgs.lua().names, overrideArgs.lua().names} {
		if names[0] != "now" {
			panic("a head block does not start with now")
		}
	}
	return int64(math.Float64frombits(binary.LittleEndian.Uint64(b))), true
}

// BatchOps reads how many ops a batch call carries from its first argument
// (the BATCH block); ok is false if it is not one.
func BatchOps(arg any) (n int, ok bool) {
	b, isBlock := arg.([]byte)
	if !isBlock || len(b) != 8*len(batchArgs.fields) || batchArgs.lua().names[1] != "n" {
		return 0, false
	}
	return int(math.Float64frombits(binary.LittleEndian.Uint64(b[8:]))), true
}

// Gathering is how many ops of the scope wait for its next batch.
func (b *Backend) Gathering(scope string) int {
	b.batches.mu.Lock()
	defer b.batches.mu.Unlock()
	if q := b.batches.scopes[b.tag(scope)]; q != nil {
		return len(q.ops)
	}
	return 0
}

// MaxBatchOps is the bound on a batch's ops.
const MaxBatchOps = maxBatchOps

// MaxRemembered bounds the scopes and the records a Backend remembers.
const MaxRemembered = maxRemembered

// LossCheckEvery is how many RunGiveBacks ticks pass between two checks of
// a scope with nothing to re-assert.
const LossCheckEvery = lossCheckEvery

// SetMaxQueuedOps sets the bound on the ops waiting for a scope's next
// batch until the test ends.
func SetMaxQueuedOps(t interface{ Cleanup(func()) }, n int) {
	old := maxQueuedOps
	maxQueuedOps = n
	t.Cleanup(func() { maxQueuedOps = old })
}

// TicksToWork is RunGiveBacks's ticksToWork.
func (b *Backend) TicksToWork(tick, recordTicks uint64) uint64 {
	return b.ticksToWork(tick, recordTicks)
}

// Hear takes e as another replica's announcement on scope.
func (b *Backend) Hear(scope string, e gate.Event) { b.hear(scope, e) }

// LoseAdmit queues req's give-back, as an Admit whose reply was lost does.
func (b *Backend) LoseAdmit(req gate.AdmitRequest) { b.lostAdmit(req) }

// KeepArrivalOrder has b's batches run their ops in arrival order, not
// settles first: for the tests that compare a batch with the same ops one
// at a time in the order they joined it (the Lua's answers for any order of
// a batch's ops), among them a settle of a permit an admit of the same
// batch granted, which production never batches (a settle follows its
// admit's reply).
func (b *Backend) KeepArrivalOrder() { b.arrival = true }

// SetArrivalOrder sets whether b's batches run in arrival order (on) or as
// production does, settles first (off); between batches only.
func (b *Backend) SetArrivalOrder(on bool) { b.arrival = on }

// Reassert runs one pass of the background loss check, as RunGiveBacks's
// tick number tick does.
func (b *Backend) Reassert(ctx context.Context, tick, recordTicks uint64) error {
	return b.reassert(ctx, tick, recordTicks)
}

// ExpireRemembered ends the OPEN of every record b remembers, as time
// passing would.
func (b *Backend) ExpireRemembered() {
	b.memory.mu.Lock()
	defer b.memory.mu.Unlock()
	for _, sm := range b.memory.scopes {
		for _, r := range sm.sources {
			r.openUntil = time.Now().Add(-time.Millisecond)
		}
	}
}

// Remembered is how many scopes and records b remembers.
func (b *Backend) Remembered() (scopes, records int) {
	b.memory.mu.Lock()
	defer b.memory.mu.Unlock()
	return len(b.memory.scopes), b.memory.n
}
