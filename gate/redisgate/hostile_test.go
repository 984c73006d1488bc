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

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// opArgHook rewrites the one argument (opArg) of every call of fn alone
// ("_admit", "_settle"): it keeps the first keep blocks only, as a caller
// that lies about them would.
type opArgHook struct {
	redistest.PassThrough
	fn   string
	keep int
}

func (h *opArgHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) >= 4 && strings.EqualFold(fmt.Sprint(a[0]), "fcall") && strings.HasSuffix(fmt.Sprint(a[1]), h.fn) {
			nkeys, _ := a[2].(int)
			arg := a[3+nkeys].([]byte)
			nb := int(binary.LittleEndian.Uint32(arg)) / 4
			var blocks [][]byte
			for k := range nb {
				from := binary.LittleEndian.Uint32(arg[4*k:])
				to := uint32(len(arg))
				if k+1 < nb {
					to = binary.LittleEndian.Uint32(arg[4*k+4:])
				}
				blocks = append(blocks, arg[from:to])
			}
			blocks = blocks[:h.keep]
			var out []byte
			at := 4 * len(blocks)
			for _, b := range blocks {
				out = binary.LittleEndian.AppendUint32(out, uint32(at))
				at += len(b)
			}
			for _, b := range blocks {
				out = append(out, b...)
			}
			a[3+nkeys] = out
		}
		return next(ctx, cmd)
	}
}

// TestOpArgMissingBlocksRefused: an admit's one argument that lacks
// the blocks its ADMIT head promises (one candidate: ADMIT, CAND, WAITER,
// PLACE; here only ADMIT and CAND) must be refused by admit.lua, as a
// missing argv element was before opArg, not read from whatever bytes sit
// where the position table would go on.
func TestOpArgMissingBlocksRefused(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	b := newBackend(t, c, redisgate.Options{}) // production: the server's TIME (now 0 in ADMIT)
	src := gatetest.Src("s")
	req := gate.AdmitRequest{Scope: "oparg", PermitID: "p", Candidates: []gate.Candidate{{Source: src, Ceiling: 10}}}
	if _, err := b.Admit(ctx, req); err != nil { // marks the scope
		t.Fatal(err)
	}
	c.AddHook(&opArgHook{fn: "_admit", keep: 2})
	req.PermitID = "q"
	a, err := b.Admit(ctx, req)
	if err == nil {
		t.Fatalf("an admit without its WAITER and PLACE blocks: %+v, no error (admit.lua read them from the bytes past the position table)", a)
	}
	if !strings.Contains(err.Error(), "an op argument of 2 blocks, want 4") {
		t.Errorf("error %v, want one naming the blocks it has and wants", err)
	}
}

// TestOpArgShortRefused: an admit's one argument cut to its
// ADMIT block alone is refused, naming the blocks it has and wants.
func TestOpArgShortRefused(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	b := newBackend(t, c, redisgate.Options{})
	src := gatetest.Src("s")
	req := gate.AdmitRequest{Scope: "oparg", PermitID: "p", Candidates: []gate.Candidate{{Source: src, Ceiling: 10}}}
	if _, err := b.Admit(ctx, req); err != nil {
		t.Fatal(err)
	}
	c.AddHook(&opArgHook{fn: "_admit", keep: 1})
	req.PermitID = "q"
	if a, err := b.Admit(ctx, req); err == nil {
		t.Fatalf("an admit of its ADMIT block alone: %+v, no error", a)
	} else if !strings.Contains(err.Error(), "an op argument of 1 blocks, want 4") {
		t.Errorf("error %v, want one naming the blocks it has and wants", err)
	}
}

// confHook rewrites the CONF argument of every call of the function whose
// name ends in fn: cut keeps the scope's block (CONF_H: idle_ttl, channel,
// scope) and keep bytes after it, as a caller that lies about the sources'
// configurations would. A call of its own has it last; a batch second.
type confHook struct {
	redistest.PassThrough
	fn   string
	keep int
}

func (h *confHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) >= 5 && strings.EqualFold(fmt.Sprint(a[0]), "fcall") && strings.HasSuffix(fmt.Sprint(a[1]), h.fn) {
			at := len(a) - 1
			if h.fn == "_batch" {
				nkeys, _ := a[2].(int)
				at = 3 + nkeys + 1
			}
			conf := a[at].([]byte)
			head := 8 // idle_ttl, then two strings
			for range 2 {
				head += 4 + int(binary.LittleEndian.Uint32(conf[head:]))
			}
			a[at] = conf[:min(len(conf), head+h.keep)]
		}
		return next(ctx, cmd)
	}
}

// TestConfMissingSourceRefused: an admit called alone whose CONF argument
// lacks its candidate's SRC_CONF block, or holds a short one, is refused
// with a bounded error (the block it names and how many there are, or
// struct's "data string too short"), never decided with numbers read from
// past the argument's end; nothing is granted.
func TestConfMissingSourceRefused(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	b := newBackend(t, c, redisgate.Options{})
	src := gatetest.Src("s")
	req := gate.AdmitRequest{Scope: "conf", PermitID: "p", Candidates: []gate.Candidate{{Source: src, Ceiling: 10}}}
	if _, err := b.Admit(ctx, req); err != nil { // marks the scope
		t.Fatal(err)
	}
	for _, tc := range []struct {
		keep int
		want string
	}{
		{0, "an op names source configuration 1 of 0"},
		{20, "data string too short"},
	} {
		h := &confHook{fn: "_admit", keep: tc.keep}
		c.AddHook(h)
		req.PermitID = fmt.Sprint("q", tc.keep)
		a, err := b.Admit(ctx, req)
		if err == nil {
			t.Fatalf("keep %d: an admit without its source's configuration: %+v, no error", tc.keep, a)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("keep %d: error %v, want one saying %q", tc.keep, err, tc.want)
		}
		h.fn = "-" // (a hook cannot be removed: this one stops matching)
	}
	v, err := b.Peek(ctx, gate.PeekRequest{Scope: "conf", Sources: []*gate.Source{src}})
	if err != nil || v.Sources[0].Quota.InFlight != 1 {
		t.Fatalf("after the refused admits: %+v %v, want the first admit's one lease alone", v, err)
	}
}

// twoAdmitsInABatch sends, in one batch through hook, an admit of s1 and
// one of s2 then s1, and returns their errors.
func twoAdmitsInABatch(t *testing.T, scope string, hook *confHook) (b *redisgate.Backend, h *batchHook, s1, s2 *gate.Source, errs [2]error) {
	t.Helper()
	ctx := testCtx(t)
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	c.AddHook(hook)
	s1, s2 = gatetest.Src("s1"), gatetest.Src("s2")
	release, wait := gather(t, b, h, scope, 2,
		func() { _, errs[0] = b.Admit(ctx, admitReq(scope, "p1", s1)) },
		func() { _, errs[1] = b.Admit(ctx, admitReq(scope, "p2", s2, s1)) },
	)
	release()
	wait()
	return b, h, s1, s2, errs
}

// TestBatchConfIndexRefused: a batch whose CONF argument lacks the
// SRC_CONF blocks its ops name (their cmap's numbers out of its range)
// answers each op with a bounded error naming the number, and grants
// nothing.
func TestBatchConfIndexRefused(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-conf"
	b, h, s1, s2, errs := twoAdmitsInABatch(t, scope, &confHook{fn: "_batch"})
	for i, err := range errs {
		// (s1's is the batch's first, s2's, admit 2's first candidate, its second)
		if want := fmt.Sprintf("an op names source configuration %d of 0", i+1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("admit %d: %v, want the missing configuration named", i+1, err)
		}
	}
	if sizes := h.takeSizes(); len(sizes) != 2 || sizes[1] != 2 {
		t.Fatalf("batch sizes %v, want [1 2]", sizes)
	}
	v, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{s1, s2}})
	if err != nil || v.Sources[0].Quota.InFlight != 0 || v.Sources[1].Quota.InFlight != 0 {
		t.Fatalf("after the refused batch: %+v %v, want no lease", v, err)
	}
}

// lastBatchOpHook rewrites the last op's argument of every batch call with
// rewrite, while on (nil: always).
type lastBatchOpHook struct {
	redistest.PassThrough
	on      *atomic.Bool
	rewrite func(op []byte) []byte
}

func (h *lastBatchOpHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if (h.on == nil || h.on.Load()) && len(a) >= 4 && strings.EqualFold(fmt.Sprint(a[0]), "fcall") && strings.HasSuffix(fmt.Sprint(a[1]), "_batch") {
			a[len(a)-1] = h.rewrite(a[len(a)-1].([]byte))
		}
		return next(ctx, cmd)
	}
}

// mapTo99 sets the first byte of an op's key map (BATCH_OP: kind, then
// map) to 99, a source the batch lacks.
func mapTo99(op []byte) []byte {
	op = slices.Clone(op)
	op[8+4] = 99
	return op
}

// TestBatchMapOutOfRangeRefused: a batch op whose key map names a source
// the batch does not have fails with a bounded error naming it, and its
// batch-mate is decided as usual.
func TestBatchMapOutOfRangeRefused(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-map"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	c.AddHook(&lastBatchOpHook{rewrite: mapTo99})
	s1, s2 := gatetest.Src("s1"), gatetest.Src("s2")
	var errs [2]error
	var first gate.Admission
	release, wait := gather(t, b, h, scope, 2,
		func() { first, errs[0] = b.Admit(ctx, admitReq(scope, "p1", s1)) },
		func() { _, errs[1] = b.Admit(ctx, admitReq(scope, "p2", s2)) },
	)
	release()
	wait()
	if errs[0] != nil || !first.Granted {
		t.Fatalf("the batch-mate: %+v %v, want granted", first, errs[0])
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "an op names batch source 99 of 2") {
		t.Fatalf("the op with a map out of range: %v, want the source named", errs[1])
	}
	v, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{s2}})
	if err != nil || v.Sources[0].Quota.InFlight != 0 {
		t.Fatalf("after the refused op: %+v %v, want no lease on s2", v, err)
	}
}

// brec packs a stored breaker record (lib.lua's BREC: the numbers as
// little-endian doubles, the strings as a 4-byte length and their bytes).
func brec(vals ...any) string {
	var b []byte
	for _, v := range vals {
		switch v := v.(type) {
		case int64:
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(v)))
		case string:
			b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		}
	}
	return string(b)
}

// TestCorruptStoredStateRefused: a stored record whose state is no
// State (here OPEN + 256) must make Peek fail with an error naming the
// field, not give a view: Go now reads the record itself (storedBreaker),
// and gate.State(v) keeps the low byte, so the view says OPEN (refusing,
// retry in an hour) while Lua, which compares the number, finds it neither
// OPEN nor HALF_OPEN and its verdict in the same reply admits.
func TestCorruptStoredStateRefused(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	b := newBackend(t, c, redisgate.Options{})
	src := gatetest.Src("s")
	const scope = "corrupt"
	a := admit(t, ctx, b, scope, "p", src)
	settle(t, ctx, b, scope, src, a.Permit, gate.VerdictSuccess)
	now := serverTime(t, ctx, c)
	rec := brec(int64(gate.Open)+256, int64(3), int64(1), now, now+3600_000, int64(0), int64(0), int64(1000),
		int64(0), int64(0), int64(gate.OpenCauseFailures), int64(0), int64(0), int64(0), "", "", "")
	must(c.HSet(ctx, b.SourceKey(scope, "s", ""), redisgate.StateField, rec).Result())(t)
	v, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src}})
	if err == nil {
		sv := v.Sources[0]
		t.Fatalf("a stored state of %d read without error: view state %v reason %v retry %v; verdict (Lua) %v",
			int64(gate.Open)+256, sv.Breaker.State, sv.Breaker.Reason, sv.Breaker.RetryAfter, sv.Verdict.Reason)
	}
	if !strings.Contains(err.Error(), "state") {
		t.Errorf("error %v does not name the field", err)
	}
}

// TestConfSettleMissingSourceRefused: a settle called alone
// whose CONF argument lacks its source's SRC_CONF block is refused with a
// bounded error before it reads the source's state: its slot stays held
// and a failure that would open the breaker opens nothing.
func TestConfSettleMissingSourceRefused(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	b := newBackend(t, c, redisgate.Options{})
	src := gatetest.Src("s", func(s *gate.Source) { s.Breaker.FailThreshold = 1 })
	a := admit(t, ctx, b, "conf-s", "p", src)
	h := &confHook{fn: "_settle"}
	c.AddHook(h)
	_, err := b.Settle(ctx, settleReq("conf-s", src, a.Permit, gate.VerdictFailure))
	if err == nil || !strings.Contains(err.Error(), "an op names source configuration 1 of 0") {
		t.Fatalf("a settle without its source's configuration: %v, want the missing configuration named", err)
	}
	h.fn = "-"
	v := peek(t, ctx, b, "conf-s", src)
	if v.Quota.InFlight != 1 || v.Breaker.State != gate.Closed {
		t.Fatalf("after the refused settle: %+v, want its slot held and the breaker closed", v)
	}
}

// TestBatchConfHeadShortRefused: a batch whose CONF argument
// is shorter than its head (CONF_H) fails as a whole, as a batch whose head
// is broken: every op answers an error, none is granted, none hangs.
func TestBatchConfHeadShortRefused(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-conf-h"
	b, _, s1, s2, errs := twoAdmitsInABatch(t, scope, &confHook{fn: "_batch", keep: -3})
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "too short") {
			t.Errorf("admit %d: %v, want struct's error for the short CONF argument", i+1, err)
		}
	}
	v, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{s1, s2}})
	if err != nil || v.Sources[0].Quota.InFlight != 0 || v.Sources[1].Quota.InFlight != 0 {
		t.Fatalf("after the refused batch: %+v %v, want no lease", v, err)
	}
}
