package redisgate_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// A batch's ops run as runs (batch.lua's batch_ops, admit_run,
// settle_run): an op and those after it of the same kind, map and cmap take
// the early exit with what they share looked up once. These tests stand
// where a run must end: a source change, a configuration change, a kind
// change, an op that walks (a lease not held, a failure that trips the
// breaker), an op that raises.

// runsSource is a source of one slot count, lease and window, which trips
// at its first failure.
func runsSource(name string, lease, window time.Duration) *gate.Source {
	return gatetest.Src(name, func(s *gate.Source) {
		s.Limits = gate.Limits{MaxConcurrency: 16, Lease: lease}
		s.Breaker.FailThreshold, s.Breaker.Cooldown, s.Breaker.Window = 1, time.Minute, window
	})
}

// TestBatchRunsEndWhereTheyShould: a batch of settles and admits whose
// runs end at each of a run's edges answers and stores as the same ops one
// at a time, in the order they joined (KeepArrivalOrder: the kinds
// interleaved). Fails with a run that does not end at a configuration
// change (x2's window and lease taken for x's; a source change is one too:
// a source's SRC_CONF names it, so the map's own test in the runs guards a
// hostile head only, and dropping it passes), at a kind change, or that
// takes a failure's settle (the breaker trips: the success after it in an
// OPEN breaker walks); with a settle answering the next op's reply across
// a time step or a progress set, or without the call fewer (batch.go's
// laterReplies).
func TestBatchRunsEndWhereTheyShould(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched", "sequential")
	b.KeepArrivalOrder() // the kinds interleaved, as they joined
	x, x2, y := runsSource("x", 10*time.Second, 10*time.Second), runsSource("x", 20*time.Second, 20*time.Second),
		runsSource("y", 10*time.Second, 10*time.Second)
	run := func(scope string, batched bool) []string {
		ps := map[string]gate.Permit{}
		for _, p := range []struct {
			id  string
			src *gate.Source
		}{{"h1", x}, {"h2", x}, {"h3", y}, {"h4", x2}, {"h5", x}, {"h6", x}, {"h7", x}, {"h8", y}, {"h9", x}, {"h10", x}, {"h11", x}} {
			ps[p.id] = admit(t, ctx, b, scope, p.id, p.src).Permit
		}
		for _, src := range []*gate.Source{x, y} { // each source's window stored: its first settle can take the exit
			settle(t, ctx, b, scope, src, admit(t, ctx, b, scope, "w0"+src.Name, src).Permit, gate.VerdictSuccess)
		}
		clock.Advance(1500 * time.Millisecond) // the window's next bucket
		type op struct {
			admit bool
			id    string
			src   *gate.Source
			v     gate.Verdict
			adv   time.Duration // the clock moved on before it
			prog  bool          // a settle that sets the scope's progress
		}
		ops := []op{
			// a run whose replies are the next op's where their SETTLE_R is the same (settle_run): not
			// across a time step, nor a progress set by one and not the other
			{false, "h1", x, gate.VerdictSuccess, 0, false}, {false, "h2", x, gate.VerdictSuccess, 0, false},
			{false, "h9", x, gate.VerdictSuccess, time.Second, false}, // another bucket of x's window (1 s)
			{false, "h10", x, gate.VerdictSuccess, 0, true}, {false, "h11", x, gate.VerdictSuccess, 0, false},
			{false, "h4", x2, gate.VerdictSuccess, 0, false},           // x's other configuration: the same map, another cmap
			{false, "h3", y, gate.VerdictSuccess, 0, false},            // another source
			{true, "a1", x, 0, 0, false}, {true, "a2", x, 0, 0, false}, // a run
			{true, "a3", x2, 0, 0, false}, {true, "a4", y, 0, 0, false},
			{false, "h8", y, gate.VerdictSuccess, 0, false}, // a kind change, the same map and cmap
			{true, "a6", y, 0, 0, false},
			{false, "ghost", x, gate.VerdictSuccess, 0, false}, // no lease held: walks (stale)
			{false, "h5", x, gate.VerdictSuccess, 0, false},
			{false, "h6", x, gate.VerdictFailure, 0, false}, // trips x
			{false, "h7", x, gate.VerdictSuccess, 0, false}, // x OPEN: walks
			{true, "a5", x, 0, 0, false},                    // refused
		}
		out := make([]string, len(ops))
		fs := make([]func(), len(ops))
		for i, o := range ops {
			fs[i] = func() { // (ProgressAge kept: the op's own now and progress, under the test clock)
				clock.Advance(o.adv)
				if o.admit {
					a, err := b.Admit(ctx, admitReq(scope, o.id, o.src))
					out[i] = fmt.Sprintf("%+v %v", a, err)
					return
				}
				p, ok := ps[o.id]
				if !ok {
					p = gate.Permit{ID: o.id}
				}
				req := settleReq(scope, o.src, p, o.v)
				req.Progress = o.prog
				s, err := b.Settle(ctx, req)
				out[i] = fmt.Sprintf("%+v %v", s, err)
			}
		}
		runOps(t, b, h, scope, batched, fs)
		return out
	}
	t0 := clock.Now()
	seq := run("sequential", false)
	clock.Set(t0)
	bat := run("batched", true)
	for i := range seq {
		if seq[i] != bat[i] {
			t.Errorf("op %d:\n batched    %s\n one at a time %s", i, bat[i], seq[i])
		}
	}
	sb, ss := storedScope(t, ctx, b, c, "batched", []string{"x", "y"}), storedScope(t, ctx, b, c, "sequential", []string{"x", "y"})
	for k, v := range ss {
		if sb[k] != v {
			t.Errorf("%s: batched %s, one at a time %s", k, sb[k], v)
		}
	}
}

// batchOpCutHook cuts, once, the argument of the k-th op of an n-op batch
// call to its head (BATCH_OP), its position table and four bytes: its first
// block does not read, and the op raises where it reads it, before it
// changes anything.
type batchOpCutHook struct {
	redistest.PassThrough
	on      atomic.Bool
	k, n    int
	rewrite func(op []byte, p0 int) []byte // instead of the cut: the op, its argument from p0
}

func (h *batchOpCutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) >= 4 && strings.EqualFold(fmt.Sprint(a[0]), "fcall") && strings.HasSuffix(fmt.Sprint(a[1]), "_batch") &&
			h.on.CompareAndSwap(true, false) {
			i := len(a) - h.n + h.k
			op := slices.Clone(a[i].([]byte))
			// BATCH_OP: kind (8 bytes), map and cmap (each a length in 4 bytes, then its bytes)
			at := 8
			for range 2 {
				at += 4 + int(binary.LittleEndian.Uint32(op[at:]))
			}
			if h.rewrite != nil {
				a[i] = h.rewrite(op, at)
			} else {
				a[i] = op[:at+int(binary.LittleEndian.Uint32(op[at:]))+4]
			}
		}
		return next(ctx, cmd)
	}
}

// TestBatchRunOpRaisesAlone: an op in the middle of a run whose argument
// raises (cut short) fails alone; the ops before it in its run keep what
// they did and the ops after it answer, as the same ops one at a time
// without it, and store the same.
// A settle's run and an admit's. (Fails with an admit run that keeps,
// b_keep, only at its end: the ops before the raise lose their slots.)
// A settle run records its successes into the window once where a full
// reply needs it (settle_run): "settle" raises with ops counted and not
// recorded, "settle-progress" after a full reply mid-run (the third op
// sets progress: the second's count recorded then, the third's pending;
// the fourth raises).
// (Fails with batch_run's BATCH_RUNS.flush dropped: counts lost and the op
// before's reply without its window; with a count doubled; or with the
// window b_keep saved not set again after the mid-run record.)
func TestBatchRunOpRaisesAlone(t *testing.T) {
	for _, kind := range []string{"settle", "settle-progress", "admit"} {
		t.Run(kind, func(t *testing.T) {
			ctx := testCtx(t)
			clock := gatetest.NewClock()
			b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched", "sequential")
			x := runsSource("x", 10*time.Second, 10*time.Second)
			cutAt := 2 // the third op of five
			if kind == "settle-progress" {
				cutAt = 3 // (the first settle walks: its breaker's width not yet set; the run is the second's on)
			}
			cut := &batchOpCutHook{k: cutAt, n: 5}
			c.AddHook(cut)
			t0 := clock.Now()
			run := func(scope string, batched bool) []string {
				clock.Set(t0)
				ps := map[string]gate.Permit{}
				for _, id := range []string{"h1", "h2", "h3", "h4", "h5"} {
					ps[id] = admit(t, ctx, b, scope, id, x).Permit
				}
				clock.Set(t0.Add(time.Millisecond)) // (the progress the second op sets is not the admits')
				out := make([]string, 5)
				var fs []func()
				for i, id := range []string{"o1", "o2", "o3", "o4", "o5"} {
					if !batched && i == cutAt {
						continue // the op that raises in the batch
					}
					fs = append(fs, func() {
						if kind == "admit" {
							a, err := b.Admit(ctx, admitReq(scope, id, x))
							a.ProgressAge = 0
							out[i] = fmt.Sprintf("%+v %v", a, err)
							return
						}
						req := settleReq(scope, x, ps[fmt.Sprint("h", i+1)], gate.VerdictSuccess)
						req.Progress = kind == "settle-progress" && i == 2
						s, err := b.Settle(ctx, req)
						s.ProgressAge = 0
						out[i] = fmt.Sprintf("%+v %v", s, err)
					})
				}
				if batched {
					cut.on.Store(true)
				}
				runOps(t, b, h, scope, batched, fs)
				return out
			}
			seq, bat := run("sequential", false), run("batched", true)
			sameButTheCut(t, ctx, b, c, cut, seq, bat)
		})
	}
}

// TestBatchRunAdmitOfTwoCandidatesByItsHead: an admit in the middle of an
// admit run whose ADMIT says two candidates but whose position table has
// one candidate's (a hostile head) is not granted by the run: it walks and
// fails alone with op_check's error, the admits around it granted. (Fails
// with admit_run's test of one candidate, nc, left out.)
func TestBatchRunAdmitOfTwoCandidatesByItsHead(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batched"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	x := runsSource("x", 10*time.Second, 10*time.Second)
	settle(t, ctx, b, scope, x, admit(t, ctx, b, scope, "w0", x).Permit, gate.VerdictSuccess)
	hook := &batchOpCutHook{k: 1, n: 3, rewrite: func(op []byte, p0 int) []byte {
		// ADMIT (at its position, the table's first): now, permit (a length, its bytes), tokens, n
		at := p0 + int(binary.LittleEndian.Uint32(op[p0:]))
		at += 8
		at += 4 + int(binary.LittleEndian.Uint32(op[at:]))
		at += 8
		binary.LittleEndian.PutUint64(op[at:], math.Float64bits(2))
		return op
	}}
	hook.on.Store(true)
	c.AddHook(hook)
	out := make([]string, 3)
	var fs []func()
	for i, id := range []string{"o1", "o2", "o3"} {
		fs = append(fs, func() {
			a, err := b.Admit(ctx, admitReq(scope, id, x))
			out[i] = fmt.Sprint(a.Granted, " ", err)
		})
	}
	runOps(t, b, h, scope, true, fs)
	if hook.on.Load() {
		t.Fatal("no op rewritten")
	}
	if out[0] != "true <nil>" || out[2] != "true <nil>" || !strings.Contains(out[1], "blocks") {
		t.Errorf("%q, want o1 and o3 granted, o2 op_check's error", out)
	}
}

// TestBatchSettleRunHandoff (from review run11r): a settle run whose third
// op hands its slot off to a waiter in line and whose fourth finds nobody
// left: each answers its own handoff, as one at a time (h2 Handoff w1, h3
// none). Fails with a settle's reply shared with a next op that hands off,
// or after one that did.
func TestBatchSettleRunHandoff(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, _ := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched", "sequential")
	x := runsSource("x", 10*time.Second, 10*time.Second)
	run := func(scope string, batched bool) []string {
		ps := map[string]gate.Permit{}
		for _, id := range []string{"h0", "h1", "h2", "h3"} {
			ps[id] = admit(t, ctx, b, scope, id, x).Permit
		}
		w := &gate.Waiter{ID: "w1", Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute}
		must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{x},
			Line: &gate.LineRead{Lease: time.Minute, Join: w, Joins: []string{"x"}}}))(t)
		out := make([]string, 4)
		var fs []func()
		for i, id := range []string{"h0", "h1", "h2", "h3"} {
			fs = append(fs, func() {
				req := settleReq(scope, x, ps[id], gate.VerdictSuccess)
				if id == "h2" || id == "h3" {
					req.Line = &gate.LineHandoff{Lease: time.Minute}
				}
				s, err := b.Settle(ctx, req)
				out[i] = fmt.Sprintf("%+v %v", s, err)
			})
		}
		runOps(t, b, h, scope, batched, fs)
		return out
	}
	t0 := clock.Now()
	seq := run("sequential", false)
	clock.Set(t0)
	bat := run("batched", true)
	if !strings.Contains(seq[2], "Handoff:w1") || !strings.Contains(seq[3], "Handoff:}") {
		t.Errorf("one at a time: %q, want h2 handing off to w1, h3 to nobody", seq)
	}
	for i := range seq {
		if seq[i] != bat[i] {
			t.Errorf("op %d:\n batched       %s\n one at a time %s", i, bat[i], seq[i])
		}
	}
}

// TestBatchSettleRunRaisesInItsHandoff: a settle in the middle of a settle
// run whose handoff block does not read (cut after its flag, a waiter in
// the line) raises after its settle was kept (b_keep), as a call of its
// own raises after b_save: its release and its count stay, with the count
// the run had not yet recorded (BATCH_RUNS.flush's op that raised,
// recorded after the op before's reply's window). Answers and stored
// state against the same ops one at a time with that op handing nothing
// off. (Fails with the raising op's own count dropped or recorded into the
// op before's reply.)
func TestBatchSettleRunRaisesInItsHandoff(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched", "sequential")
	x := runsSource("x", 10*time.Second, 10*time.Second)
	ids := []string{"h0", "h1", "h2", "h3", "h4"}
	const cutAt = 3 // the first settle walks (its breaker's width not yet set), the run is h1 on
	cut := &batchOpCutHook{k: cutAt, n: len(ids), rewrite: func(op []byte, p0 int) []byte {
		// SETTLE at p0 + 8: now, permit (a length, its bytes), six numbers; then HANDOFF: its flag
		at := p0 + 8 + 8
		at += 4 + int(binary.LittleEndian.Uint32(op[at:]))
		at += 6 * 8
		return op[:at+8]
	}}
	c.AddHook(cut)
	t0 := clock.Now()
	run := func(scope string, batched bool) []string {
		clock.Set(t0)
		ps := map[string]gate.Permit{}
		for _, id := range ids {
			ps[id] = admit(t, ctx, b, scope, id, x).Permit
		}
		w := &gate.Waiter{ID: "w1", Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute}
		must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{x},
			Line: &gate.LineRead{Lease: time.Minute, Join: w, Joins: []string{"x"}}}))(t)
		out := make([]string, len(ids))
		var fs []func()
		for i, id := range ids {
			fs = append(fs, func() {
				req := settleReq(scope, x, ps[id], gate.VerdictSuccess)
				if batched && i == cutAt {
					req.Line = &gate.LineHandoff{Lease: time.Minute} // (its block cut by the hook)
				}
				s, err := b.Settle(ctx, req)
				s.ProgressAge = 0
				out[i] = fmt.Sprintf("%+v %v", s, err)
			})
		}
		if batched {
			cut.on.Store(true)
		}
		runOps(t, b, h, scope, batched, fs)
		return out
	}
	seq, bat := run("sequential", false), run("batched", true)
	sameButTheCut(t, ctx, b, c, cut, seq, bat)
}

// sameButTheCut checks a batch ("batched") whose op cut.k was cut short
// against the same ops one at a time ("sequential"): the cut op fails with
// its own error, every other op answers the same, and source x's stored
// state is the same right after the batch (what the op that raised owes
// stays in the give-back queue: no test Backend runs its loop), so what
// the ops before it did is kept.
func sameButTheCut(t *testing.T, ctx context.Context, b *redisgate.Backend, c *redis.Client, cut *batchOpCutHook, seq, bat []string) {
	t.Helper()
	if cut.on.Load() {
		t.Fatal("no op cut")
	}
	if !strings.Contains(bat[cut.k], "bad argument") {
		t.Errorf("the cut op: %s, want its own error", bat[cut.k])
	}
	for i := range seq {
		if i != cut.k && seq[i] != bat[i] {
			t.Errorf("op %d:\n batched       %s\n one at a time %s", i, bat[i], seq[i])
		}
	}
	sb, ss := storedScope(t, ctx, b, c, "batched", []string{"x"}), storedScope(t, ctx, b, c, "sequential", []string{"x"})
	for k, v := range ss {
		if sb[k] != v {
			t.Errorf("%s: batched %s, one at a time %s", k, sb[k], v)
		}
	}
}
