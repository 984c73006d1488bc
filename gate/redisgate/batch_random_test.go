package redisgate_test

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// storedScope is everything a scope's sources store, for comparing a
// batched run with a sequential one (a window of zeros reads as none).
func storedScope(t *testing.T, ctx context.Context, b *redisgate.Backend, c *redis.Client, scope string, names []string) map[string]string {
	out := map[string]string{}
	for _, name := range names {
		for _, suffix := range []string{"", "data", "log", "line", "line_w", "line_s"} {
			key := b.SourceKey(scope, name, suffix)
			typ := must(c.Type(ctx, key).Result())(t)
			var v string
			switch typ {
			case "hash":
				m := must(c.HGetAll(ctx, key).Result())(t)
				if w, ok := m["w"]; ok && suffix == "" && strings.Trim(w, "\x00") == "" {
					delete(m, "w")
				}
				if suffix == "" && len(m) == 0 {
					v = "none"
					break
				}
				if bs, ok := m[redisgate.StateField]; ok && suffix == "" {
					if rec, err := redisgate.DecodeBreaker(bs); err == nil {
						m[redisgate.StateField] = fmt.Sprint(rec)
					}
				}
				v = fmt.Sprintf("%q", m)
			case "zset":
				v = fmt.Sprint(must(c.ZRangeWithScores(ctx, key, 0, -1).Result())(t))
			default:
				v = typ
			}
			ttl := must(c.PTTL(ctx, key).Result())(t)
			switch {
			case ttl > 0:
				v += " ttl>0"
			default:
				v += fmt.Sprint(" ttl=", ttl)
			}
			out[name+":"+suffix] = v
		}
	}
	return out
}

// TestBatchRandomSameAsSequential: random mixes of admits (with and
// without waiters, places in some lines and not others) and settles (with
// and without handoffs, of permits held before the batch or granted in it)
// answer and store the same in one batch as one at a time: time steps
// within the batch (buckets move on, cooldowns end, leases and waiters
// expire), per-minute limits, a broken data key (ops that raise
// mid-batch), members without their record in a line. (From the review of
// the batch's caches: it catches a line's emptiness kept past an l_enter,
// a wrong carry of the window counts' memo, a sweep that leaves swept
// leases in the cache.) BATCH_RANDOM_SEEDS=n runs n seeds (40 by default,
// 10 with -short), BATCH_RANDOM_LONG=1 longer batches.
func TestBatchRandomSameAsSequential(t *testing.T) {
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "warm-b")
	randomSameAsSequential(t, b, h, c, clock, false)
}

// TestBatchRandomScripts: the same where Functions are refused (every op
// and every batch a script of its own, EVALSHA).
func TestBatchRandomScripts(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	must(srv.Client(t).Do(ctx, "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function").Result())(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nofn", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	h := &batchHook{}
	c.AddHook(h)
	clock := gatetest.NewClock()
	b := newBackend(t, c, redisgate.Options{Clock: clock.Now})
	warm := gatetest.Src("warm")
	for _, id := range []string{"w1", "w2"} { // the scripts loaded (EVAL once)
		settle(t, ctx, b, "warm-s", warm, admit(t, ctx, b, "warm-s", id, warm).Permit, gate.VerdictSuccess)
	}
	release, wait := gather(t, b, h, "warm-s", 2,
		func() { _, _ = b.Admit(ctx, admitReq("warm-s", "x1", warm)) },
		func() { _, _ = b.Admit(ctx, admitReq("warm-s", "x2", warm)) })
	release()
	wait()
	h.takeSizes()
	randomSameAsSequential(t, b, h, c, clock, false)
}

// TestBatchRandomReloads: as TestBatchRandomSameAsSequential, with each
// op's sources in one of two configurations (a reload between ops queued
// in one batch): every op is decided with its own source's limits and
// policy, batched as one at a time.
func TestBatchRandomReloads(t *testing.T) {
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "warm-b")
	randomSameAsSequential(t, b, h, c, clock, true)
}

// randomSameAsSequential runs the random batches; with variants, each
// op's sources take one of two configurations, at random.
func randomSameAsSequential(t *testing.T, b *redisgate.Backend, h *batchHook, c *redis.Client, clock *gatetest.Clock, variants bool) {
	defer b.SetArrivalOrder(false)
	ctx := testCtx(t)
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	if n, err := strconv.Atoi(os.Getenv("BATCH_RANDOM_SEEDS")); err == nil {
		seeds = n
	}
	for seed := 1; seed <= seeds; seed++ {
		rng := rand.New(rand.NewSource(int64(seed)))
		names := []string{"a", "b", "c"}
		srcs := map[string]*gate.Source{}
		for _, n := range names {
			mc := 1 + rng.Intn(2)
			lease := time.Hour
			if rng.Intn(2) == 0 {
				lease = time.Duration(500+rng.Intn(2500)) * time.Millisecond
			}
			rpm, tpm := int64(0), int64(0)
			if rng.Intn(3) == 0 {
				rpm = 1000
			}
			if rng.Intn(4) == 0 {
				tpm = 100
			}
			srcs[n] = gatetest.Src(n, func(s *gate.Source) {
				s.Limits.MaxConcurrency = mc
				s.Limits.RPM = rpm
				s.Limits.TPM = tpm
				s.Limits.Lease = lease
				s.Breaker.FailThreshold = 2 + rng.Intn(2)
				s.Breaker.MinCalls = 2
				s.Breaker.FailRate = 0.5
				s.Breaker.Cooldown = time.Second
				s.Breaker.MaxCooldown = time.Second
			})
		}
		// alt is each source's other configuration (with variants).
		alt := map[string]*gate.Source{}
		for _, n := range names {
			if !variants {
				break // (the other tests' seeds draw as before)
			}
			a := *srcs[n]
			a.Limits.MaxConcurrency = 1 + rng.Intn(3)
			a.Limits.RPM = []int64{0, 2, 1000}[rng.Intn(3)]
			a.Limits.TPM = []int64{0, 30, 100}[rng.Intn(3)]
			a.Limits.Lease = time.Duration(500+rng.Intn(2500)) * time.Millisecond
			a.Breaker.FailThreshold = 1 + rng.Intn(3)
			a.Breaker.MinCalls = 1 + rng.Intn(3)
			a.Breaker.FailRate = []float64{0.2, 0.5, 1}[rng.Intn(3)]
			a.Breaker.Cooldown = time.Duration(1+rng.Intn(3)) * time.Second
			a.Breaker.MaxCooldown = 4 * time.Second
			a.Breaker.Window = time.Duration(10+rng.Intn(50)) * time.Second
			alt[n] = &a
		}
		// altOf[i] says which of op i's sources take their alt (a bit per
		// source: a candidate's by its name's index, a settle's bit 0).
		altOf := make([]int, 32)
		if variants {
			for i := range altOf {
				altOf[i] = rng.Intn(8)
			}
		}
		conf := func(i int, n string) *gate.Source {
			k := slices.Index(names, n)
			if altOf[i]>>k&1 == 1 {
				return alt[n]
			}
			return srcs[n]
		}
		wlease := map[string]time.Duration{}
		for i := range 4 {
			wlease[fmt.Sprint("w", i)] = time.Minute
			if rng.Intn(2) == 0 {
				wlease[fmt.Sprint("w", i)] = time.Duration(1+rng.Intn(3)) * time.Second
			}
		}
		waiter := func(id string) *gate.Waiter {
			return &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: wlease[id]}
		}
		seqScope, batScope := fmt.Sprint("seq", seed), fmt.Sprint("bat", seed)
		// Setup, the same on both scopes.
		type held struct {
			src string
			p   gate.Permit
		}
		type setupT struct {
			held   []held
			places map[string]map[string]string // waiter -> source -> place
		}
		openSome := map[string]bool{}
		for _, n := range names {
			openSome[n] = rng.Intn(4) == 0
		}
		nHeld := rng.Intn(4)
		heldSrc := make([]string, nHeld)
		for i := range heldSrc {
			heldSrc[i] = names[rng.Intn(3)]
		}
		type join struct {
			w     string
			joins []string
		}
		var joins []join
		leaves := map[string][]string{} // waiter -> lines it leaves after joining (its places stale)
		for i := range 3 {
			var js []string
			for _, n := range names {
				if rng.Intn(2) == 0 {
					js = append(js, n)
				}
			}
			if len(js) > 0 {
				joins = append(joins, join{fmt.Sprint("w", i), js})
				for _, n := range js {
					if rng.Intn(3) == 0 {
						leaves[fmt.Sprint("w", i)] = append(leaves[fmt.Sprint("w", i)], n)
					}
				}
			}
		}
		setup := func(scope string) setupT {
			warm := gatetest.Src("warm")
			settle(t, ctx, b, scope, warm, admit(t, ctx, b, scope, "warm", warm).Permit, gate.VerdictSuccess)
			s := setupT{places: map[string]map[string]string{}}
			for _, n := range names {
				if openSome[n] {
					for i := 0; peek(t, ctx, b, scope, srcs[n]).Breaker.State != gate.Open; i++ {
						a := admit(t, ctx, b, scope, fmt.Sprint("fail", i), srcs[n])
						settle(t, ctx, b, scope, srcs[n], a.Permit, gate.VerdictFailure)
					}
				}
			}
			for i, n := range heldSrc {
				a := admit(t, ctx, b, scope, fmt.Sprint("h", i), srcs[n])
				s.held = append(s.held, held{n, a.Permit})
			}
			for _, j := range joins {
				var ss []*gate.Source
				for _, n := range j.joins {
					ss = append(ss, srcs[n])
				}
				v := must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: ss,
					Line: &gate.LineRead{Lease: time.Minute, Join: waiter(j.w), Joins: j.joins}}))(t)
				s.places[j.w] = map[string]string{}
				for i, n := range j.joins {
					s.places[j.w][n] = v.Sources[i].Line.Place
				}
			}
			for w, ls := range leaves {
				if err := b.Leave(ctx, gate.LeaveRequest{Scope: scope, Waiter: w, Sources: ls}); err != nil {
					t.Fatal(err)
				}
			}
			return s
		}
		t0 := clock.Now()
		ss := setup(seqScope)
		clock.Set(t0)
		sb := setup(batScope)
		// A broken data key (a string): ops that write the minute's data
		// raise (q_take of a grant, q_release of a logged lease).
		broken := ""
		if rng.Intn(3) == 0 {
			for _, n := range names {
				if srcs[n].Limits.RPM > 0 {
					broken = n
					for _, sc := range []string{seqScope, batScope} {
						must(c.Set(ctx, b.SourceKey(sc, n, "data"), "not a hash", 0).Result())(t)
					}
					break
				}
			}
		}
		// A member without its record in some lines (the front walk, l_front, drops it).
		for _, n := range names {
			if rng.Intn(4) == 0 {
				for _, sc := range []string{seqScope, batScope} {
					must(c.ZAdd(ctx, b.SourceKey(sc, n, "line"), redis.Z{Score: 0, Member: strings.Repeat("0", 48) + "ghost"}).Result())(t)
				}
			}
		}
		t1 := clock.Now()
		if fmt.Sprint(ss.places) != fmt.Sprint(sb.places) {
			t.Fatalf("seed %d: setups differ: %v %v", seed, ss.places, sb.places)
		}
		if rng.Intn(2) == 0 {
			t1 = t1.Add(2 * time.Second) // cooldowns over: probes
		}
		// Each op's time: the same, or later (the window's bucket moves on).
		steps := make([]time.Duration, 16)
		for i := range steps {
			if rng.Intn(3) == 0 {
				steps[i] = time.Duration(rng.Intn(2500)) * time.Millisecond
			}
		}
		// The ops.
		type opT struct {
			admit   bool
			id      string
			cands   []string
			waiter  string // "" none
			places  bool
			settleK int // settle: >= 0 the k-th op's permit, < 0 held[-k-1]
			src     string
			verdict gate.Verdict
			handoff bool
			tokens  int64
			actual  int64
			hlease  time.Duration
		}
		nOps := 4 + rng.Intn(8)
		if os.Getenv("BATCH_RANDOM_LONG") != "" {
			nOps = 10 + rng.Intn(6)
		}
		ops := make([]opT, nOps)
		for i := range ops {
			o := opT{}
			if rng.Intn(2) == 0 || i == 0 && nHeld == 0 {
				o.admit = true
				o.id = fmt.Sprint("q", i)
				o.tokens = int64(rng.Intn(40))
				perm := rng.Perm(3)
				for _, k := range perm[:1+rng.Intn(3)] {
					o.cands = append(o.cands, names[k])
				}
				if rng.Intn(3) != 0 {
					o.waiter = fmt.Sprint("w", rng.Intn(4))
					o.places = rng.Intn(3) != 0
				}
			} else {
				var choices []int
				for k := range i {
					if ops[k].admit {
						choices = append(choices, k)
					}
				}
				for k := range nHeld {
					choices = append(choices, -k-1)
				}
				if len(choices) == 0 {
					o.admit, o.id, o.cands = true, fmt.Sprint("q", i), []string{names[rng.Intn(3)]}
					ops[i] = o
					continue
				}
				o.settleK = choices[rng.Intn(len(choices))]
				o.src = names[rng.Intn(3)]
				o.verdict = []gate.Verdict{gate.VerdictSuccess, gate.VerdictFailure, gate.VerdictFailure, gate.VerdictNone}[rng.Intn(4)]
				o.handoff = rng.Intn(3) != 0
				o.actual = int64(rng.Intn(60) - 10)
				o.hlease = time.Duration(1+rng.Intn(3)) * time.Second
			}
			ops[i] = o
		}
		var seqPermits []gate.Permit = make([]gate.Permit, nOps)
		var seqGranted = make([]bool, nOps)
		// Even seeds run the batch as production does, settles first (and
		// the ops one at a time in that order: a settle of a permit granted
		// in the same batch then runs before its admit, stale in both); odd
		// seeds in arrival order. Each op's time is its own whatever runs it
		// first (t1 and the steps up to it), and a batched settle settles the
		// permit its sequential twin did.
		prod := seed%2 == 0
		b.SetArrivalOrder(!prod)
		at := make([]time.Time, nOps)
		for i := range at {
			at[i] = t1
			for _, d := range steps[:i+1] {
				at[i] = at[i].Add(d)
			}
		}
		usedPermit := make([]gate.Permit, nOps)
		run := func(scope string, st setupT, batched bool) []string {
			out := make([]string, nOps)
			clock.Set(t1)
			var fs []func()
			var settles, admits []int
			for i, o := range ops {
				if o.admit {
					req := admitReq(scope, o.id)
					req.Tokens = o.tokens
					for _, n := range o.cands {
						src := conf(i, n)
						req.Candidates = append(req.Candidates, gate.Candidate{Source: src, Ceiling: src.Limits.MaxConcurrency})
					}
					if o.waiter != "" {
						w := waiter(o.waiter)
						if o.places {
							w.Places = st.places[o.waiter]
						}
						req.Line = w
					}
					admits = append(admits, len(fs))
					fs = append(fs, func() {
						clock.Set(at[i])
						a, err := b.Admit(ctx, req)
						out[i] = fmt.Sprint(a, err)
						if !batched {
							seqPermits[i], seqGranted[i] = a.Permit, a.Granted
						}
					})
					continue
				}
				settles = append(settles, len(fs))
				fs = append(fs, func() {
					clock.Set(at[i])
					var p gate.Permit
					src := srcs[o.src]
					if o.settleK < 0 {
						hd := st.held[-o.settleK-1]
						p, src = hd.p, srcs[hd.src]
					} else if batched {
						p = usedPermit[i]
						if p.Source != "" {
							src = srcs[p.Source]
						}
					} else if seqGranted[o.settleK] {
						p = seqPermits[o.settleK]
						src = srcs[p.Source]
					} else {
						p = gate.Permit{ID: ops[o.settleK].id}
					}
					if !batched {
						usedPermit[i] = p
					}
					src = conf(i, src.Name)
					req := settleReq(scope, src, p, o.verdict)
					req.Progress = o.verdict == gate.VerdictSuccess
					req.ActualTokens = o.actual
					if o.handoff {
						req.Line = &gate.LineHandoff{Lease: o.hlease}
					}
					s, err := b.Settle(ctx, req)
					out[i] = fmt.Sprint(s, err)
				})
			}
			if prod && !batched { // one at a time in the order the batch runs them
				var in []func()
				for _, k := range append(settles, admits...) {
					in = append(in, fs[k])
				}
				fs = in
			}
			runOps(t, b, h, scope, batched, fs)
			return out
		}
		seq := run(seqScope, ss, false)
		if testing.Verbose() {
			for i := range seq {
				t.Logf("seed %d op %d %+v: %s", seed, i, ops[i], seq[i])
			}
		}
		bat := run(batScope, sb, true)
		desc := func() string {
			var s []string
			for i, o := range ops {
				s = append(s, fmt.Sprintf("  %d: %+v", i, o))
			}
			return strings.Join(s, "\n")
		}
		bad := false
		for i := range seq {
			if k := strings.LastIndex(seq[i], " script: "); k >= 0 && strings.Contains(seq[i][k:], ", on @user_") {
				seq[i] = seq[i][:k]
			}
			if seq[i] != bat[i] {
				bad = true
				t.Errorf("seed %d op %d:\n batched    %s\n one a time %s", seed, i, bat[i], seq[i])
			}
		}
		gs, gb := storedScope(t, ctx, b, c, seqScope, names), storedScope(t, ctx, b, c, batScope, names)
		var keys []string
		for k := range gs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if gs[k] != gb[k] {
				bad = true
				t.Errorf("seed %d %s:\n batched    %s\n one a time %s", seed, k, gb[k], gs[k])
			}
		}
		if bad {
			t.Fatalf("seed %d (settles first %v): setup held %v joins %+v leaves %v open %v broken %q steps %v alt %v\nops:\n%s", seed, prod, heldSrc, joins, leaves, openSome, broken, steps[:nOps], altOf[:nOps], desc())
		}
	}
}
