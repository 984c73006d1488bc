package redisgate

import (
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/polygate/polygate/gate"
)

// A call is KEYS (the scope's, then each group's: below) and ARGV: all its numbers packed in ARGV[1]
// (little-endian float64s: one struct.unpack reads them all, where an
// argument each would cost a conversion each), then its strings, one
// argument each: the header's, then each op's. An op's numbers start with
// its kind, the count of its numbers after these three and the count of
// its strings; lua/ops.lua reads them in the order listed below. Integers
// are exact (|n| < 2^53), times whole milliseconds, a flag 0 or 1.
//
// The header:
//
//	numbers: now ttl n m, then per source configuration base
//	         max_concurrency rpm tpm lease fail_threshold min_calls
//	         fail_rate window cooldown max_cooldown probe_ttl, then per
//	         tenant configuration base max_concurrency rpm tpm budget
//	         budget_window
//	strings: scope channel seen replica, then each source configuration's
//	         name, then each tenant configuration's
//
// now is a test clock's time (0: the server's), seen the marker last seen
// (loss.go), replica this Backend's name in the lines (where a waiter's or
// a handoff's is empty). An op names a source or a tenant by its
// configuration's index (from 1; a tenant 0: none), a configuration its
// keys by base, the position in KEYS after which they start.

// The kinds of ops (lua/ops.lua's OPS).
const (
	kindAdmit = iota + 1
	kindSettle
	kindGiveBack
	kindPeek
	kindOverride
	kindLeave
	kindRestore
)

// call gathers a call's ops and the sources and tenants they name: each
// configuration once (a source's by pointer: a reload makes new ones),
// each one's keys once.
type call struct {
	tag            string // the scope's keys' start (Backend.tag)
	head, tenHead  []float64
	headStrs, tens []any
	nums           []float64
	strs           []any
	keys           []string
	confs          []*gate.Source // by index - 1
	tenants        []gate.TenantCall
	n              int // ops
}

func newCall(b *Backend, scope, seen string) *call {
	tag := b.tag(scope)
	c := &call{
		tag:      tag,
		head:     []float64{float64(b.nowArg()), float64(b.idleTTL), 0, 0},
		headStrs: []any{scope, channel(tag), seen, b.replica},
	}
	for _, k := range scopeKeys {
		c.keys = append(c.keys, tag+k)
	}
	return c
}

// src is the index of s's configuration in the header.
// (A call names a few sources: a linear search costs less than maps.)
func (c *call) src(s *gate.Source) float64 {
	if i := slices.Index(c.confs, s); i >= 0 {
		return float64(i + 1)
	}
	l, p := s.Limits, s.Breaker
	c.head = append(c.head, c.group(":src4:"+s.Name, sourceKeys), float64(l.MaxConcurrency), float64(l.RPM), float64(l.TPM), msf(l.Lease),
		float64(p.FailThreshold), float64(p.MinCalls), p.FailRate, msf(p.Window), msf(p.Cooldown), msf(p.MaxCooldown), msf(p.ProbeTTL))
	c.headStrs = append(c.headStrs, s.Name)
	c.confs = append(c.confs, s)
	c.head[2] = float64(len(c.confs))
	return float64(len(c.confs))
}

// tenant is the index of tc's configuration in the header (0: none).
func (c *call) tenant(tc *gate.TenantCall) float64 {
	if tc == nil {
		return 0
	}
	if i := slices.Index(c.tenants, *tc); i >= 0 {
		return float64(i + 1)
	}
	l := tc.Limits
	c.tenHead = append(c.tenHead, c.group(":ten1:"+tc.Name, tenantKeys), float64(l.MaxConcurrency), float64(l.RPM),
		float64(l.TPM), float64(l.Budget), msf(l.BudgetWindow))
	c.tens = append(c.tens, tc.Name)
	c.tenants = append(c.tenants, *tc)
	c.head[3] = float64(len(c.tenants))
	return float64(len(c.tenants))
}

// group is the base of the keys named after the tag, role by role, made
// the call's keys if they are not yet.
func (c *call) group(name string, roles []string) float64 {
	first := c.tag + name + roles[0]
	if i := slices.Index(c.keys, first); i >= 0 {
		return float64(i)
	}
	base := len(c.keys)
	for _, r := range roles {
		c.keys = append(c.keys, c.tag+name+r)
	}
	return float64(base)
}

// add appends an op of kind with its numbers and strings.
func (c *call) add(kind int, nums []float64, strs ...any) {
	c.nums = append(append(c.nums, float64(kind), float64(len(nums)), float64(len(strs))), nums...)
	c.strs = append(c.strs, strs...)
	c.n++
}

// args are the call's keys and ARGV.
func (c *call) args() ([]string, []any) {
	nums := make([]byte, 0, 8*(len(c.head)+len(c.tenHead)+len(c.nums)))
	for _, f := range slices.Concat(c.head, c.tenHead, c.nums) {
		nums = binary.LittleEndian.AppendUint64(nums, math.Float64bits(f))
	}
	argv := make([]any, 0, 1+len(c.headStrs)+len(c.tens)+len(c.strs))
	argv = append(append(append(append(argv, nums), c.headStrs...), c.tens...), c.strs...)
	return c.keys, argv
}

func msf(d time.Duration) float64 { return float64(d.Milliseconds()) }

func flag(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// waiter is a waiter's numbers (priority weight other_weight max_tenants
// aging lease named) and strings (id replica tenant).
func waiter(w *gate.Waiter) ([]float64, []any) {
	return []float64{float64(w.Priority), float64(w.Weight), float64(w.OtherWeight), float64(w.MaxTenants), msf(w.Aging), msf(w.Lease), flag(w.Named)},
		[]any{w.ID, w.Replica, w.Tenant}
}

// admit: numbers tokens waits n tenant, the waiter's when it waits, then
// src ceiling per candidate; strings permit, the waiter's and a place per
// candidate when it waits.
func (c *call) admit(r *gate.AdmitRequest) {
	nums := []float64{float64(r.Tokens), flag(r.Line != nil), float64(len(r.Candidates)), c.tenant(r.Tenant)}
	strs := []any{r.PermitID}
	if r.Line != nil {
		wn, ws := waiter(r.Line)
		nums, strs = append(nums, wn...), append(strs, ws...)
	}
	for _, cand := range r.Candidates {
		nums = append(nums, c.src(cand.Source), float64(cand.Ceiling))
		if r.Line != nil {
			strs = append(strs, r.Line.Places[cand.Source.Name])
		}
	}
	c.add(kindAdmit, nums, strs...)
}

// settle: numbers src epoch probe verdict floor actual progress hands
// lease tenant; strings permit replica (the handoff's lease and replica
// when hands).
func (c *call) settle(r *gate.SettleRequest) {
	var lease float64
	replica := ""
	if r.Line != nil {
		lease, replica = msf(r.Line.Lease), r.Line.Replica
	}
	c.add(kindSettle, []float64{c.src(r.Source), float64(r.Epoch), flag(r.Probe), float64(r.Verdict), msf(r.Floor),
		float64(r.ActualTokens), flag(r.Progress), flag(r.Line != nil), lease, c.tenant(r.Tenant)}, r.PermitID, replica)
}

// giveBack: numbers life tenant, then src per source; strings permit. Life
// is how long its tombstone lasts: the longest lease of its sources, as a
// permit granted later holds its slot no longer.
func (c *call) giveBack(r *gate.AdmitRequest) {
	nums := []float64{0, c.tenant(r.Tenant)}
	for _, cand := range r.Candidates {
		nums = append(nums, c.src(cand.Source))
		nums[0] = max(nums[0], msf(cand.Source.Limits.Lease))
	}
	c.add(kindGiveBack, nums, r.PermitID)
}

// peek: numbers tokens reads lease describe joins n, the waiter's when
// one joins, then src ceiling join per candidate, then tenant per tenant;
// strings replica (the read's), the waiter's when one joins, then a place
// per candidate.
func (c *call) peek(r *gate.PeekRequest) {
	var join *gate.Waiter
	var lease float64
	var describe bool
	replica := ""
	if l := r.Line; l != nil {
		join, lease, describe, replica = l.Join, msf(l.Lease), l.Describe, l.Replica
	}
	nums := []float64{float64(r.Tokens), flag(r.Line != nil), lease, flag(describe), flag(join != nil), float64(len(r.Sources))}
	strs := []any{replica}
	if join != nil {
		wn, ws := waiter(join)
		nums, strs = append(nums, wn...), append(strs, ws...)
	}
	for i := range r.Sources {
		cand := r.Candidate(i)
		joins := join != nil && slices.Contains(r.Line.Joins, cand.Source.Name)
		place := ""
		if joins {
			place = join.Places[cand.Source.Name]
		}
		nums = append(nums, c.src(cand.Source), float64(cand.Ceiling), flag(joins))
		strs = append(strs, place)
	}
	for i := range r.Tenants {
		nums = append(nums, c.tenant(&r.Tenants[i]))
	}
	c.add(kindPeek, nums, strs...)
}

// override: numbers src action; strings actor why.
func (c *call) override(r *gate.OverrideRequest) {
	c.add(kindOverride, []float64{c.src(r.Source), float64(r.Action)}, r.Actor, r.Why)
}

// leave: numbers src per source; strings waiter.
func (c *call) leave(r *gate.LeaveRequest) {
	var nums []float64
	for _, s := range r.Sources {
		nums = append(nums, c.src(&gate.Source{Name: s}))
	}
	c.add(kindLeave, nums, r.Waiter)
}

// restore: numbers src open_left opened_ago reopens epoch cause override
// override_ago per record; strings token, then actor why per record.
func (c *call) restore(token string, recs []gate.Record) {
	var nums []float64
	strs := []any{token}
	for _, r := range recs {
		var left, ago, reopens int64
		var epoch uint64
		cause := gate.OpenCauseNone
		if r.Open {
			left, ago, reopens, epoch, cause = ms(r.OpenLeft), max(r.OpenedAgo.Milliseconds(), 0), int64(max(r.Reopens, 1)), r.Epoch, r.Cause
		}
		nums = append(nums, c.src(&gate.Source{Name: r.Source}), float64(left), float64(ago), float64(reopens), float64(epoch),
			float64(cause), float64(r.Override), float64(max(r.OverrideAgo.Milliseconds(), 0)))
		strs = append(strs, r.Actor, r.Why)
	}
	c.add(kindRestore, nums, strs...)
}

// ms is d in whole milliseconds, rounded up: a time left is never early.
func ms(d time.Duration) int64 {
	if d > math.MaxInt64-time.Millisecond {
		return math.MaxInt64 / int64(time.Millisecond)
	}
	return (d + time.Millisecond - 1).Milliseconds()
}

// Every key of a scope starts with the prefix and the scope's name in
// braces, the hash tag, so that a call's keys share one Cluster slot:
//
//	<prefix>{scope}:progress       the scope's last success (ms)
//	<prefix>{scope}:marker         the scope exists in this Redis (loss.go)
//	<prefix>{scope}:gone           tombstones of permits given back
//	<prefix>{scope}:src4:<source>:state|leases|minute|tokens|line|waiters
//	<prefix>{scope}:ten1:<tenant>:state|leases|minute|tokens|spent
//
// "src4" and "ten1" name the layout of the values (lua/store.lua): sidecars
// of another layout sharing the Redis keep their own.

// scopeEscaper keeps braces out of the hash tag (and stays injective).
var scopeEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

var (
	scopeKeys  = []string{":progress", ":marker", ":gone"}
	sourceKeys = []string{":state", ":leases", ":minute", ":tokens", ":line", ":waiters"}
	tenantKeys = []string{":state", ":leases", ":minute", ":tokens", ":spent"}
)

// tag is the part of every key of the scope up to the hash tag's end.
func (b *Backend) tag(scope string) string {
	return b.prefix + "{" + scopeEscaper.Replace(scope) + "}"
}

// channel is the scope's announcement channel.
func channel(tag string) string { return tag + ":events" }
