package redisgate

import (
	"context"
	"crypto/rand"
	_ "embed"

	"github.com/polygate/polygate/gate"
)

// Each source's line (gate/line.go) lives in three keys beside the source's
// own, under the scope's hash tag; the line blocks of keys come after every
// other key of the admit, settle and peek calls (one per candidate or
// source), and ride in those calls: a waiter's places are checked and kept
// by the Pick's admit, a released slot is handed on by the settle, and the
// poller's peek tells a replica which of its waiters are at the front of
// each line. lib.lua's "line" section has the functions.

//go:embed leave.lua
var leaveLua string

// leaveScript is Backend.Leave.
var leaveScript = newOp("leave", leaveLua)

// lineKeys are the line's keys (see lib.lua).
var lineKeys = keyBlock{"LINE_KEYS", []string{"line", "line_w", "line_s"}, nil}

// appendLineKeys appends source's line keys.
func appendLineKeys(keys []string, tag, source string) []string {
	return appendKeys(keys, tag+":src:"+source+":", lineKeys.suffixes)
}

// newReplica names this Backend among the replicas that share a line.
func newReplica() string { return "r" + rand.Text()[:16] }

// lineArg is a waiter as an argument block; nil is off.
type lineArg struct {
	b *Backend
	w *gate.Waiter
}

func (a *lineArg) replica() string {
	if a.w.Replica != "" {
		return a.w.Replica
	}
	return a.b.replica
}

// on is put's field of a block that may be off: its zero value when off
// (Lua reads no other field of a block that is off).
func on[T, V any](isOn func(*T) bool, put func(*T) V) func(*T) V {
	return func(v *T) V {
		if !isOn(v) {
			var zero V
			return zero
		}
		return put(v)
	}
}

func waiterOn(a *lineArg) bool { return a.w != nil }

var waiterArgs = args[lineArg]{"WAITER", []arg[lineArg]{
	num("on", func(a *lineArg) int { return flag(a.w != nil) }),
	str("waiter", on(waiterOn, func(a *lineArg) string { return a.w.ID })),
	str("replica", on(waiterOn, func(a *lineArg) string { return a.replica() })),
	num("priority", on(waiterOn, func(a *lineArg) int32 { return a.w.Priority })),
	str("tenant", on(waiterOn, func(a *lineArg) string { return a.w.Tenant })),
	num("weight", on(waiterOn, func(a *lineArg) int { return a.w.Weight })),
	num("other_weight", on(waiterOn, func(a *lineArg) int { return a.w.OtherWeight })),
	num("max_tenants", on(waiterOn, func(a *lineArg) int { return a.w.MaxTenants })),
	num("aging", on(waiterOn, func(a *lineArg) int64 { return a.w.Aging.Milliseconds() })),
	num("lease", on(waiterOn, func(a *lineArg) int64 { return max(1, a.w.Lease.Milliseconds()) })),
	str("place", on(waiterOn, func(a *lineArg) string { return a.w.Place })),
}}

// placeArgs is the waiter's place in one candidate's line; an admit's
// waiter block is followed by one per candidate.
var placeArgs = args[string]{"PLACE", []arg[string]{
	str("place", func(p *string) string { return *p }),
}}

// joinArg is whether a peek's waiter joins one source's line, and its place
// there; the waiter block is followed by one per source.
type joinArg struct {
	on    bool
	place string
}

var joinArgs = args[joinArg]{"JOIN", []arg[joinArg]{
	num("on", func(j *joinArg) int { return flag(j.on) }),
	str("place", func(j *joinArg) string { return j.place }),
}}

// lineRead is a peek's line block; a waiter block (the join) follows it.
type lineRead struct {
	b *Backend
	r *gate.LineRead
}

func readOn(a *lineRead) bool { return a.r != nil }

func (a *lineRead) replica() string {
	if a.r.Replica != "" {
		return a.r.Replica
	}
	return a.b.replica
}

var lineReadArgs = args[lineRead]{"LINE_READ", []arg[lineRead]{
	num("on", func(a *lineRead) int { return flag(a.r != nil) }),
	str("replica", on(readOn, func(a *lineRead) string { return a.replica() })),
	num("lease", on(readOn, func(a *lineRead) int64 { return max(1, a.r.Lease.Milliseconds()) })),
	num("describe", on(readOn, func(a *lineRead) int { return flag(a.r.Describe) })),
}}

type handoffArg struct {
	b *Backend
	h *gate.LineHandoff
}

func handoffOn(a *handoffArg) bool { return a.h != nil }

var handoffArgs = args[handoffArg]{"HANDOFF", []arg[handoffArg]{
	num("on", func(a *handoffArg) int { return flag(a.h != nil) }),
	str("replica", on(handoffOn, func(a *handoffArg) string {
		if a.h.Replica != "" {
			return a.h.Replica
		}
		return a.b.replica
	})),
	num("lease", on(handoffOn, func(a *handoffArg) int64 { return max(1, a.h.Lease.Milliseconds()) })),
}}

// lineAdmit is the admit reply's line record: the waiter's place in each
// candidate's line, in candidate order ("" none).
type lineAdmit struct {
	places []string
}

var lineAdmitReply = packedReply("LINE_ADMIT_R", []ret[lineAdmit]{
	{"places", nested(func(p *parser, v any, r *lineAdmit) { r.places = placeReply.list(p, v) })},
})

// placeReply is one place of LINE_ADMIT_R's list.
var placeReply = packedReply("PLACE_R", []ret[string]{
	{"place", getStr(func(s *string, v string) { *s = v })},
})

var lineReply = newReply("LINE_R", []ret[gate.LineView]{
	{"length", getInt(func(r *gate.LineView, v int64) { r.Length = int(v) })},
	{"place", getStr(func(r *gate.LineView, v string) { r.Place = v })},
	{"wake", nested(func(p *parser, v any, r *gate.LineView) {
		for _, id := range p.array(v, 0) {
			r.Wake = append(r.Wake, p.str(id))
		}
	})},
	{"head", getStr(func(r *gate.LineView, v string) { r.Head = v })},
	{"oldest", getInt(func(r *gate.LineView, v int64) { r.Oldest = ms(v) })},
	{"groups", nested(func(p *parser, v any, r *gate.LineView) {
		r.Groups = lineGroup.list(p, v)
		gate.SortGroups(r.Groups)
	})},
})

var lineGroup = newReply("LINE_GROUP", []ret[gate.LineGroup]{
	{"priority", getInt(func(g *gate.LineGroup, v int64) { g.Priority = int32(v) })},
	{"tenant", getStr(func(g *gate.LineGroup, v string) { g.Tenant = v })},
	{"waiting", getInt(func(g *gate.LineGroup, v int64) { g.Waiting = int(v) })},
})

// leaveArgs is the whole leave call.
var leaveArgs = args[gate.LeaveRequest]{"LEAVE", []arg[gate.LeaveRequest]{
	str("waiter", func(r *gate.LeaveRequest) string { return r.Waiter }),
}}

// lineLayouts are the line's layouts, for the prelude.
func lineLayouts() []luaLayout {
	return []luaLayout{lineKeys.lua(), waiterArgs.lua(), placeArgs.lua(), joinArgs.lua(), lineReadArgs.lua(), handoffArgs.lua(), lineAdmitReply.lua(), placeReply.lua(), lineReply.lua(), lineGroup.lua(), leaveArgs.lua()}
}

// lineConstants are gate/line.go's constants, for the prelude.
func lineConstants(def func(string, any)) {
	def("LINE_CAP", gate.LineCap)
	def("SHARE_SCALE", gate.ShareScale)
	def("CLASS_OFFSET", int64(gate.ClassOffset))
	def("KEY_LEN", gate.KeyLen)
	def("DESCRIBE_MAX", gate.DescribeMax)
}

// Leave implements gate.Backend.
func (b *Backend) Leave(ctx context.Context, req gate.LeaveRequest) error {
	if len(req.Sources) == 0 {
		return nil
	}
	keys := make([]string, 0, len(lineKeys.suffixes)*len(req.Sources))
	for _, s := range req.Sources {
		keys = appendLineKeys(keys, b.tag(req.Scope), s)
	}
	if _, err := b.run(ctx, "leave", leaveScript, keys, leaveArgs.pack(nil, &req)); err != nil {
		return err
	}
	return nil
}
