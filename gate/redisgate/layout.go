package redisgate

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/polygate/polygate/gate"
)

// Every argument block and reply record the scripts exchange with Go is
// described once, here: a layout is the ordered list of its fields, each
// with its name and the Go side of it (how a Go value is written as an
// argument, or how a reply element is read into a Go value). From the same
// table the Lua prelude gets a table per layout (see luaLayouts), which
// lib.lua's read (arguments into a table of named fields) and pack (a table
// of named fields into a reply array) use. Adding a field is one line in a
// table below, plus the Lua line that uses or produces it by name.

// arg is one field of an argument block: a number (num) or, if str is
// set, a string. Each is written straight into the block's bytes, not
// boxed in an interface (an allocation for most values).
type arg[T any] struct {
	name string
	num  func(*T) float64
	str  func(*T) string
}

// numeric are the Go types of number fields.
type numeric interface {
	~int | ~int32 | ~int64 | ~uint32 | ~uint64 | ~float64
}

func num[T any, N numeric](name string, put func(*T) N) arg[T] {
	return arg[T]{name: name, num: func(v *T) float64 { return float64(put(v)) }}
}

func str[T any](name string, put func(*T) string) arg[T] {
	return arg[T]{name: name, str: put}
}

// args is an argument block of layout id (its Lua table's name). A block
// is one argument: its fields in layout order, each number a little-endian
// double and each string a 4-byte length and its bytes, which Lua reads
// with one struct.unpack (no argument string per field, no tonumber).
// Integers beyond 2^53 round, as they would in Lua; the script saturates
// what it adds up.
type args[T any] struct {
	id     string
	fields []arg[T]
}

// width is how many arguments a block takes.
func (l args[T]) width() int { return 1 }

// size is the length of v's block in bytes.
func (l args[T]) size(v *T) int {
	n := 0
	for _, f := range l.fields {
		if f.str != nil {
			n += 4 + len(f.str(v))
			continue
		}
		n += 8
	}
	return n
}

// appendTo appends v's block to b.
func (l args[T]) appendTo(b []byte, v *T) []byte {
	for _, f := range l.fields {
		if f.str != nil {
			s := f.str(v)
			b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
			b = append(b, s...)
			continue
		}
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f.num(v)))
	}
	return b
}

// pack appends v's block, an argument of its own, sized exactly.
func (l args[T]) pack(out []any, v *T) []any {
	return append(out, l.appendTo(make([]byte, 0, l.size(v)), v))
}

// opArg is the one argument of an admit or a settle (in a batch, after its
// BATCH_OP block): the position of each of its blocks, as a 4-byte
// little-endian count of bytes from the argument's start, then the blocks
// (lib.lua's op_block reads a position). One argument per op, not one per
// block: each argument is a string that Redis and then Lua make, about
// 3 000 instructions of redis-server per argument (docs/performance.md).
//
// An opArg is written into one buffer sized once (start), each block in
// place (put), after head bytes left free for the op's BATCH_OP block, so
// that a batch sends the buffer as it is instead of a copy behind its head.
type opArg struct {
	buf  []byte
	head int // bytes before the argument, for its BATCH_OP block
	next int // the next block's number
}

// start makes room for head bytes, the positions of n blocks and size
// bytes of blocks in all (the sum of their args.size), reusing buf.
func (w *opArg) start(head, n, size int) {
	w.buf = slices.Grow(w.buf[:0], head+4*n+size)[:head+4*n]
	w.head, w.next = head, 0
}

// bytes is the argument (without the room for its head).
func (w *opArg) bytes() []byte { return w.buf[w.head:] }

// put writes v's block as w's next one.
func (l args[T]) put(w *opArg, v *T) {
	binary.LittleEndian.PutUint32(w.buf[w.head+4*w.next:], uint32(len(w.buf)-w.head))
	w.next++
	w.buf = l.appendTo(w.buf, v)
}

// lua describes the layout for the prelude.
func (l args[T]) lua() luaLayout {
	ll := luaLayout{id: l.id, bin: true}
	for _, f := range l.fields {
		ll.names = append(ll.names, f.name)
		if f.str != nil {
			ll.strs = append(ll.strs, f.name)
		}
	}
	return ll
}

// embed makes a block of U's fields part of a block of T's.
func embed[T, U any](l args[U], part func(*T) *U) []arg[T] {
	out := make([]arg[T], 0, len(l.fields))
	for _, f := range l.fields {
		g := arg[T]{name: f.name}
		if f.str != nil {
			g.str = func(v *T) string { return f.str(part(v)) }
		} else {
			g.num = func(v *T) float64 { return f.num(part(v)) }
		}
		out = append(out, g)
	}
	return out
}

// ret is one element of a reply record and how it is read into T.
type ret[T any] struct {
	name string
	get  getter[T]
}

// getter reads a reply element into T. In a packed record (reply.packed) an
// element is a number (a little-endian double, which read gets as an int64)
// or, if str, a string (a 4-byte length and its bytes); a nested record or
// list is a string too.
type getter[T any] struct {
	read func(*parser, any, *T)
	// num, for a number field, reads a packed record's number as it is, not
	// boxed in an interface (an allocation for most values).
	num   func(*parser, int64, *T)
	str   bool
	aside bool // a stored record's field that is not read (see recField)
}

// reply is a reply record of layout id: an array of its fields, or with
// packed one string (see packed).
type reply[T any] struct {
	id     string
	fields []ret[T]
	packed bool
}

func newReply[T any](id string, fields []ret[T]) reply[T] {
	return reply[T]{id: id, fields: fields}
}

// packedReply is a packed record: Lua's L.pack(t) is one struct.pack of its
// fields in layout order (as an argument block's: a number a little-endian
// double, a string a 4-byte length and its bytes), a list of packed records
// is their concatenation, and Redis turns the whole reply into one bulk
// string instead of converting an array element by element.
func packedReply[T any](id string, fields []ret[T]) reply[T] {
	return reply[T]{id: id, fields: fields, packed: true}
}

// parse reads one record; a short or malformed one fails p.
func (l reply[T]) parse(p *parser, v any) T {
	var out T
	if l.packed {
		l.into(p, v, &out)
		return out
	}
	a := p.array(v, len(l.fields))
	for i, f := range l.fields {
		f.get.read(p, a[i], &out)
	}
	return out
}

// into reads one packed record into out (its fields; the others are left
// as they are); a short or malformed one, or one with bytes past its end,
// fails p.
func (l reply[T]) into(p *parser, v any, out *T) {
	if rest := l.unpackInto(p, p.str(v), out); rest != "" && p.err == nil {
		p.fail("%s: %d bytes past its end", l.id, len(rest))
	}
}

// unpack reads one packed record from the start of s and returns the rest.
func (l reply[T]) unpack(p *parser, s string) (T, string) {
	var out T
	rest := l.unpackInto(p, s, &out)
	return out, rest
}

// unpackInto reads one packed record from the start of s into out and
// returns the rest. A number must be an integer within int64; a string's
// length within s.
func (l reply[T]) unpackInto(p *parser, s string, out *T) string {
	for _, f := range l.fields {
		if p.err != nil {
			break
		}
		var v any
		if f.get.str {
			if len(s) < 4 {
				p.fail("%s.%s: short: %d bytes left, want a length of 4", l.id, f.name, len(s))
				break
			}
			n := uint64(binary.LittleEndian.Uint32([]byte(s[:4])))
			if n > uint64(len(s)-4) {
				p.fail("%s.%s: a string of %d bytes, %d left", l.id, f.name, n, len(s)-4)
				break
			}
			v, s = s[4:4+n], s[4+n:]
		} else {
			if len(s) < 8 {
				p.fail("%s.%s: short: %d bytes left, want a number of 8", l.id, f.name, len(s))
				break
			}
			x := math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[:8])))
			if x != math.Trunc(x) || x < math.MinInt64 || x >= math.MaxInt64 {
				p.fail("%s.%s: %v is not an integer within int64", l.id, f.name, x)
				break
			}
			s = s[8:]
			if f.get.num != nil {
				f.get.num(p, int64(x), out)
				continue
			}
			v = int64(x)
		}
		f.get.read(p, v, out)
	}
	if p.err != nil {
		return ""
	}
	return s
}

// list reads an array of records (packed: their concatenation); nil when
// there are none.
func (l reply[T]) list(p *parser, v any) []T {
	var out []T
	if l.packed {
		for s := p.str(v); s != "" && p.err == nil; {
			var r T
			r, s = l.unpack(p, s)
			out = append(out, r)
		}
		return out
	}
	for _, e := range p.array(v, 0) {
		out = append(out, l.parse(p, e))
	}
	return out
}

func (l reply[T]) lua() luaLayout {
	ll := luaLayout{id: l.id, bin: l.packed}
	for _, f := range l.fields {
		ll.names = append(ll.names, f.name)
		if f.get.str {
			ll.strs = append(ll.strs, f.name)
		}
	}
	return ll
}

// luaLayout is what the prelude writes of a layout:
// ID = {WIDTH = n, <NAME> = index, ...}, or for a binary layout (bin)
// ID = {WIDTH = 1, FMT = struct format}.
type luaLayout struct {
	id    string
	names []string
	strs  []string
	bin   bool
}

// format is a binary layout's struct format (as record.format).
func (l luaLayout) format() string {
	f := "<"
	for _, n := range l.names {
		if slices.Contains(l.strs, n) {
			f += "I4c0"
		} else {
			f += "d"
		}
	}
	return f
}

// write defines the layout's Lua table: its ID, WIDTH, the index of each
// field by name in upper case, and two functions written out field by field
// (a loop over the names costs more Lua work per call than the whole
// breaker): read(argv, base) returns the block that starts after
// argv[base] as a table of named fields (numbers unless a string field),
// and pack(t) returns t's named fields as a reply array. A field pack finds
// nil ends the array early, which the Go parser refuses as a short record.
func (l luaLayout) write(b *strings.Builder) {
	if l.bin {
		l.writeBin(b)
		return
	}
	fmt.Fprintf(b, "local %s = {ID = %q, WIDTH = %d", l.id, l.id, len(l.names))
	for i, n := range l.names {
		fmt.Fprintf(b, ", %s = %d", strings.ToUpper(n), i+1)
	}
	b.WriteString("}\n")
	fmt.Fprintf(b, "%s.read = function(argv, base)\n  return {", l.id)
	for i, n := range l.names {
		if slices.Contains(l.strs, n) {
			fmt.Fprintf(b, "%s = argv[base + %d], ", n, i+1)
		} else {
			fmt.Fprintf(b, "%s = tonumber(argv[base + %d]), ", n, i+1)
		}
	}
	b.WriteString("}\nend\n")
	fmt.Fprintf(b, "%s.pack = function(t)\n  return {", l.id)
	for _, n := range l.names {
		fmt.Fprintf(b, "t.%s, ", n)
	}
	b.WriteString("}\nend\n")
}

// writeBin defines a binary layout's table: read(argv, base) unpacks the
// block argv[base + 1] into a table of named fields (into(argv, base, t):
// into t's, such as T, a table of the layout's own), pack(t) packs t's
// named fields into one string, for a block whose first field is on,
// on(argv, base) says whether it is 1, read_next(s, pos) is read_at and
// the position after the block, and for a block of one field,
// one(argv, base) is its value. Each has a twin that reads the block at
// position pos of the string s instead (read_at(s, pos), into_at(s, pos,
// t), which also returns the position after the block, on_at, one_at), for
// the blocks of one argument (opArg).
func (l luaLayout) writeBin(b *strings.Builder) {
	fmt.Fprintf(b, "local %s = {ID = %q, WIDTH = 1, FMT = %q}\n", l.id, l.id, l.format())
	var vars, named, packed []string
	for i, n := range l.names {
		v := fmt.Sprintf("v%d", i+1)
		vars = append(vars, v)
		named = append(named, n+" = "+v)
		if slices.Contains(l.strs, n) {
			packed = append(packed, "#t."+n)
		}
		packed = append(packed, "t."+n)
	}
	fmt.Fprintf(b, "%s.read_at = function(s, pos)\n  local %s = S_UNPACK(%q, s, pos)\n  return {%s}\nend\n",
		l.id, strings.Join(vars, ", "), l.format(), strings.Join(named, ", "))
	fmt.Fprintf(b, "%s.read_next = function(s, pos)\n  local %s, next = S_UNPACK(%q, s, pos)\n  return {%s}, next\nend\n",
		l.id, strings.Join(vars, ", "), l.format(), strings.Join(named, ", "))
	fmt.Fprintf(b, "%s.read = function(argv, base)\n  return %s.read_at(argv[base + 1], 1)\nend\n", l.id, l.id)
	var into []string
	for _, n := range l.names {
		into = append(into, "t."+n)
	}
	fmt.Fprintf(b, "%s.T = {}\n%s.into_at = function(s, pos, t)\n  local next\n  %s, next = S_UNPACK(%q, s, pos)\n  return t, next\nend\n",
		l.id, l.id, strings.Join(into, ", "), l.format())
	fmt.Fprintf(b, "%s.into = function(argv, base, t)\n  return (%s.into_at(argv[base + 1], 1, t))\nend\n", l.id, l.id)
	fmt.Fprintf(b, "%s.pack = function(t)\n  return S_PACK(%q, %s)\nend\n", l.id, l.format(), strings.Join(packed, ", "))
	if memoized[l.id] {
		// pack_memo(v1, ..., vn) is pack of the record whose fields, in
		// layout order, are v1 ... vn: the same string as the last
		// pack_memo's while they are the same (compared, not packed
		// again: the replies of a batch's ops are mostly one record, the
		// same time and progress). Values, not a table (a table's field
		// written and read costs more than the registers: the reply's
		// table was ~2 k instructions per op, docs/performance.md). The
		// last record packed and its string are the closure's upvalues,
		// stored only once packed (a pack that raises keeps the last):
		// what a reply already said, nothing of a call's state, kept
		// across calls (TestPackMemoComparesEveryField).
		var vars, conds, mv, vpacked []string
		for i, n := range l.names {
			v, m := fmt.Sprintf("v%d", i+1), fmt.Sprintf("m%d", i+1)
			vars, mv = append(vars, v), append(mv, m)
			conds = append(conds, v+" == "+m)
			if slices.Contains(l.strs, n) {
				vpacked = append(vpacked, "#"+v)
			}
			vpacked = append(vpacked, v)
		}
		fmt.Fprintf(b, "%s.pack_memo = (function()\n  local ms, %s = nil\n  return function(%s) -- %s\n    if ms and %s then\n      return ms\n    end\n",
			l.id, strings.Join(mv, ", "), strings.Join(vars, ", "), strings.Join(l.names, ", "), strings.Join(conds, " and "))
		fmt.Fprintf(b, "    local s = S_PACK(%q, %s)\n    ms, %s = s, %s\n    return s\n  end\nend)()\n",
			l.format(), strings.Join(vpacked, ", "), strings.Join(mv, ", "), strings.Join(vars, ", "))
	}
	if len(l.names) > 0 && l.names[0] == "on" && !slices.Contains(l.strs, "on") {
		// A block that may be off: on(argv, base) reads its first field alone.
		fmt.Fprintf(b, "%s.on_at = function(s, pos)\n  return S_UNPACK('<d', s, pos) == 1\nend\n", l.id)
		fmt.Fprintf(b, "%s.on = function(argv, base)\n  return %s.on_at(argv[base + 1], 1)\nend\n", l.id, l.id)
	}
	if len(l.names) == 1 {
		// A block of one field: one(argv, base) is that field, without a table.
		fmt.Fprintf(b, "%s.one_at = function(s, pos)\n  return (S_UNPACK(%q, s, pos))\nend\n", l.id, l.format())
		fmt.Fprintf(b, "%s.one = function(argv, base)\n  return %s.one_at(argv[base + 1], 1)\nend\n", l.id, l.id)
	}
}

// memoized are the binary layouts whose Lua table has pack_memo: the
// records a batch's ops answer, mostly the same one (admit.lua, settle.lua).
var memoized = map[string]bool{admitReply.id: true, settleRecord.id: true}

// ---------------------------------------------------------------- keys

// keyBlock is a block of keys; every key is a string, named in Lua by
// names[i] (by default its suffix) and ending in suffixes[i].
type keyBlock struct {
	id       string
	suffixes []string
	names    []string
}

func (k keyBlock) lua() luaLayout {
	names := k.names
	if names == nil {
		names = k.suffixes
	}
	return luaLayout{id: k.id, names: names, strs: names}
}

// keySchema is the version of the source keys' layout, part of every source
// key's name: a layout that changes what a key holds takes a new version, so
// that sidecars of the old and the new layout sharing one Redis never read
// each other's records (see docs/redis.md, rolling upgrades). 1 was the
// breaker hash with a field per scalar and per window bucket ("brk") and the
// leases in a ZSET of their own ("leases").
const keySchema = "v2"

// sourceKeys are a source's keys, each the source's base name plus the
// suffix: its state hash (the breaker and the leases, stateRecord), and the
// minute's log and its data (read only where a limit per minute is set).
var sourceKeys = keyBlock{"SRC_KEYS",
	[]string{keySchema, keySchema + ":log", keySchema + ":data"},
	[]string{"state", "log", "data"}}

// scopeKeys are the keys of the scope itself that a script reads first. The
// marker (no TTL) is missing or changed only if Redis lost the scope (see
// reassert.go).
var scopeKeys = keyBlock{"SCOPE_KEYS", []string{"progress", "marker"}, nil}

// ---------------------------------------------------------------- stored records

// A record is the value of one field of a source's state hash, written and
// read only by Lua: its fields in layout order, each number a little-endian
// double (exact below 2^53, as every Lua number) and each string a 4-byte
// length and its bytes. Lua reads a record with one struct.unpack and
// writes it with one struct.pack (L.read(s), L.pack(t) in the prelude), so
// no number is formatted or parsed as text. A record with n > 0 is a table
// of n rows (numbers only), numbered from 0, that Lua reads and writes a row
// at a time, in place: L.get(s, row) returns the row's fields, L.put(s,
// row, ...) the string with the row replaced, L.all(s) every row's fields
// in one array (row r's field F at r * L.COLS + L.F), and L.ZERO is the
// table of zeros.
type record struct {
	id     string
	field  string // the hash field that holds it
	n      int    // rows; 0: one record of named fields
	fields []recField
}

type recField struct {
	name string
	str  bool
	// aside: not the breaker's (a lease count, the TTL's mark), which
	// storedBreaker skips; lib.lua's b_keep copies them on every save
	// (inline, TestKeepCopiesTheFieldsAside), the others only when the
	// breaker changed (bdirty).
	aside bool
}

// stateRecord is a source's breaker (gate.Breaker but its window) and the
// counts of its leases (gate.Quota.Leases): held is the number of leases
// in the hash (one field leaseField+permit each: its end as a double, then
// leaseLogged if the admission is in the minute's log), and lease_min is at
// most the earliest end among them, so that a script walks the leases only
// once one may have ended. expire_at is when the hash's TTL was last set
// (0: it has none), so that a script sets it again only once an eighth of
// the idle TTL has passed. A missing record is the zero Breaker (CLOSED at
// epoch 0) with no lease. Its fields are storedBreaker's, which reads it.
var stateRecord = record{id: "BREC", field: "b", fields: recFields(storedBreaker)}

// storedBreaker reads a stateRecord, as lib.lua's b_save writes it, into a
// gate.Breaker (its window aside: storedWindow); held, lease_min and
// expire_at are the quota's and the hash's, not the breaker's. An enum or a
// count out of its range is refused (a corrupt record), not wrapped into
// another value that Go's view and Lua's decisions would read apart. Replies that
// show a breaker carry its record and its window, and Go makes the view
// from them with gate.(*Breaker).View (breakerAt): no Lua twin of View.
var storedBreaker = packedReply("BREC", []ret[gate.Breaker]{
	inRange("BREC", "state", 0, int64(gate.HalfOpen), func(b *gate.Breaker, v int64) { b.State = gate.State(v) }),
	{"epoch", getUint(func(b *gate.Breaker, v uint64) { b.Epoch = v })},
	inRange("BREC", "reopens", 0, math.MaxInt, func(b *gate.Breaker, v int64) { b.Reopens = int(v) }),
	{"opened_at", getInt(func(b *gate.Breaker, v int64) { b.OpenedAt = v })},
	{"open_until", getInt(func(b *gate.Breaker, v int64) { b.OpenUntil = v })},
	{"probe_until", getInt(func(b *gate.Breaker, v int64) { b.ProbeUntil = v })},
	inRange("BREC", "consecutive", 0, math.MaxInt, func(b *gate.Breaker, v int64) { b.Consecutive = int(v) }),
	{"width", getInt(func(b *gate.Breaker, v int64) { b.Width = v })},
	inRange("BREC", "override", 0, int64(gate.Disabled), func(b *gate.Breaker, v int64) { b.Override = gate.Override(v) }),
	{"override_at", getInt(func(b *gate.Breaker, v int64) { b.OverrideAt = v })},
	inRange("BREC", "open_cause", 0, int64(gate.OpenCauseForced), func(b *gate.Breaker, v int64) { b.Cause = gate.OpenCause(v) }),
	{"held", aside[gate.Breaker]()},
	{"lease_min", aside[gate.Breaker]()},
	{"expire_at", aside[gate.Breaker]()},
	text("BREC", "probe", func(b *gate.Breaker, v string) { b.Probe = v }),
	text("BREC", "actor", func(b *gate.Breaker, v string) { b.Actor = v }),
	text("BREC", "why", func(b *gate.Breaker, v string) { b.Why = v }),
})

// windowRecord is the breaker's failure-rate window (gate.Breaker.Buckets),
// a row per bucket; storedWindow reads a row.
var windowRecord = record{id: "WIN", field: "w", n: gate.WindowBuckets, fields: recFields(storedWindow)}

var storedWindow = packedReply("WIN", []ret[gate.Bucket]{
	{"index", getInt(func(b *gate.Bucket, v int64) { b.Index = v })},
	{"calls", getInt(func(b *gate.Bucket, v int64) { b.Calls = v })},
	{"fails", getInt(func(b *gate.Bucket, v int64) { b.Fails = v })},
})

// inRange is a number field of record id that must lie in [lo, hi]; one
// outside fails p, naming the field (a conversion alone would wrap an enum
// of 257 into 1).
func inRange[T any](id, name string, lo, hi int64, set func(*T, int64)) ret[T] {
	return ret[T]{name, number(func(p *parser, x int64, t *T) {
		if p.err == nil && (x < lo || x > hi) {
			p.fail("%s.%s: %d, want %d to %d", id, name, x, lo, hi)
			return
		}
		set(t, x)
	})}
}

// text is a string field of record id of at most gate.MaxText bytes (an id
// or an operator's text, which the backend refuses longer when written);
// a longer one fails p, naming the field and its length, not its bytes.
func text[T any](id, name string, set func(*T, string)) ret[T] {
	return ret[T]{name, getter[T]{read: func(p *parser, v any, t *T) {
		s := p.str(v)
		if p.err == nil && len(s) > gate.MaxText {
			p.fail("%s.%s: %d bytes, at most %d", id, name, len(s), gate.MaxText)
			return
		}
		set(t, s)
	}, str: true}}
}

// aside is a number field of a stored record that its reader skips.
func aside[T any]() getter[T] {
	return getter[T]{read: func(*parser, any, *T) {}, num: func(*parser, int64, *T) {}, aside: true}
}

// recFields are the fields of a stored record read by r.
func recFields[T any](r reply[T]) []recField {
	out := make([]recField, 0, len(r.fields))
	for _, f := range r.fields {
		out = append(out, recField{name: f.name, str: f.get.str, aside: f.get.aside})
	}
	return out
}

// breakers keeps breakerAt's Breaker between reads (380 bytes a settle,
// and a peek per source, made garbage at once).
var breakers = sync.Pool{New: func() any { return new(gate.Breaker) }}

// breakerAt is the view at now (ms) of a breaker a script replied with:
// its state record (stateRecord; "" for a missing one, the zero Breaker)
// and its window (windowRecord, every row; "" for none), by gate's own
// code, with the policy the script was given.
func breakerAt(p *parser, rec, win any, policy gate.BreakerPolicy, now int64) gate.BreakerView {
	// The records are read into one Breaker in place (not one allocation
	// per row), kept between reads: the view copies what it shows.
	b := breakers.Get().(*gate.Breaker)
	defer breakers.Put(b)
	*b = gate.Breaker{}
	if p.str(rec) != "" {
		storedBreaker.into(p, rec, b)
	}
	s, rows := p.str(win), 0
	for ; s != "" && p.err == nil; rows++ {
		if rows == gate.WindowBuckets {
			p.fail("WIN: more than %d rows", gate.WindowBuckets)
			break
		}
		s = storedWindow.unpackInto(p, s, &b.Buckets[rows])
	}
	if rows != 0 && rows != gate.WindowBuckets {
		p.fail("WIN: %d rows, want %d", rows, gate.WindowBuckets)
	}
	return b.View(policy, now)
}

// leaseField starts the hash field of each lease: leaseField + permit;
// leaseLogged ends the value of a lease whose admission is in the log.
const (
	leaseField  = "l"
	leaseLogged = "L"
)

// format is the struct format of one row.
func (r record) format() string {
	f := "<"
	for _, fl := range r.fields {
		if fl.str {
			f += "I4c0"
		} else {
			f += "d"
		}
	}
	return f
}

// write defines the record's Lua table: ID, FIELD, FMT, read(s) (nil: the
// zero record), pack(t) and copy(t, d) (t's fields of the record into d,
// which allocates nothing; its fields aside alone are copied by lib.lua's
// b_keep, inline: TestKeepCopiesTheFieldsAside); for a table record, see
// writeRows.
func (r record) write(b *strings.Builder) {
	if r.n > 0 {
		r.writeRows(b)
		return
	}
	fmt.Fprintf(b, "local %s = {ID = %q, FIELD = %q, FMT = %q}\n", r.id, r.id, r.field, r.format())
	var vars, zero, named, packed []string
	for i, f := range r.fields {
		v := fmt.Sprintf("v%d", i+1)
		vars = append(vars, v)
		z := "0"
		if f.str {
			z = "''"
			packed = append(packed, "#t."+f.name)
		}
		zero = append(zero, f.name+" = "+z)
		named = append(named, f.name+" = "+v)
		packed = append(packed, "t."+f.name)
	}
	fmt.Fprintf(b, "%s.read = function(s)\n  if not s then\n    return {%s}\n  end\n", r.id, strings.Join(zero, ", "))
	fmt.Fprintf(b, "  local %s = S_UNPACK(%q, s)\n  return {%s}\nend\n", strings.Join(vars, ", "), r.format(), strings.Join(named, ", "))
	fmt.Fprintf(b, "%s.pack = function(t)\n  return S_PACK(%q, %s)\nend\n", r.id, r.format(), strings.Join(packed, ", "))
	var all strings.Builder
	for _, f := range r.fields {
		fmt.Fprintf(&all, "  d.%s = t.%s\n", f.name, f.name)
	}
	fmt.Fprintf(b, "%s.copy = function(t, d)\n%send\n", r.id, all.String())
}

// writeRows defines a table record's Lua table: ID, FIELD, ROW (a row's
// struct format), COLS and the column of each field by name in upper case,
// ZERO, get(s, row), put(s, row, fields...) and all(s).
func (r record) writeRows(b *strings.Builder) {
	size := 8 * len(r.fields)
	row := record{fields: r.fields}.format()
	var names []string
	for _, f := range r.fields {
		if f.str {
			panic("redisgate: record " + r.id + ": a table record holds numbers only")
		}
		names = append(names, f.name)
	}
	cols := ""
	for i, n := range names {
		cols += fmt.Sprintf(", %s = %d", strings.ToUpper(n), i+1)
	}
	// (Lua 5.1 writes a zero byte as \0; it has no \x escapes.)
	fmt.Fprintf(b, "local %s = {ID = %q, FIELD = %q, ROW = %q, ALL = %q, COLS = %d%s, ZERO = \"%s\"}\n", r.id, r.id, r.field,
		row, "<"+strings.Repeat(row[1:], r.n), len(names), cols, strings.Repeat(`\0`, size*r.n))
	fmt.Fprintf(b, "%s.all = function(s)\n  return {S_UNPACK(%q, s)}\nend\n", r.id, "<"+strings.Repeat(row[1:], r.n))
	// get(s, row) and put(s, row, ...) (a row read, a row replaced) are
	// pure functions of their arguments that remember the last put: its
	// string (ls), row, the row's values and the rows before and after it
	// (the two string.sub). A get or put of that string at that row, which
	// is b_record's at every settle of a batch after the first (one window,
	// one TIME: the same row), answers from them instead of unpacking the
	// row or cutting the string again (~4 k instructions per settle,
	// docs/performance.md, ninth session; TestWindowRowMemo). Strings are
	// compared by content (Lua interns them), so the memo holds for any
	// breaker whose window is that string. A value is kept as a number
	// (+ 0: what struct's pack wrote and get would unpack; a -0 becomes 0,
	// equal in every comparison). put's memo assumes the row was in the
	// string: on a string too short for it, the pure get would raise where
	// the memo answers; b_record always gets (and so raises on such a
	// window) before it puts.
	var lv, vn []string
	for i := range names {
		lv = append(lv, fmt.Sprintf("l%d", i+1))
		vn = append(vn, fmt.Sprintf("%s + 0", names[i]))
	}
	fmt.Fprintf(b, "%s.get, %s.put = (function()\n  local ls, lrow, lpre, lpost, %s = nil\n", r.id, r.id, strings.Join(lv, ", "))
	fmt.Fprintf(b, "  local function get(s, row)\n    if s == ls and row == lrow then\n      return %s\n    end\n    return S_UNPACK(%q, s, row * %d + 1)\n  end\n",
		strings.Join(lv, ", "), row, size)
	fmt.Fprintf(b, "  local function put(s, row, %s)\n    local pre, post = lpre, lpost\n    if s ~= ls or row ~= lrow then\n"+
		"      pre, post = string.sub(s, 1, row * %d), string.sub(s, row * %d + %d)\n    end\n"+
		"    local out = pre .. S_PACK(%q, %s) .. post\n    ls, lrow, lpre, lpost, %s = out, row, pre, post, %s\n    return out\n  end\n",
		strings.Join(names, ", "), size, size, size+1, row, strings.Join(names, ", "), strings.Join(lv, ", "), strings.Join(vn, ", "))
	fmt.Fprintf(b, "  return get, put\nend)()\n")
}

// decode reads a record of one row (n == 0) as Go values by field name:
// int64 for a number, string for a string. Tests read stored state with it.
func (r record) decode(s string) (map[string]any, error) {
	out := map[string]any{}
	for _, f := range r.fields {
		if f.str {
			if len(s) < 4 {
				return nil, fmt.Errorf("record %s: %s: short", r.id, f.name)
			}
			n := int(binary.LittleEndian.Uint32([]byte(s)))
			if len(s) < 4+n {
				return nil, fmt.Errorf("record %s: %s: short", r.id, f.name)
			}
			out[f.name], s = s[4:4+n], s[4+n:]
			continue
		}
		if len(s) < 8 {
			return nil, fmt.Errorf("record %s: %s: short", r.id, f.name)
		}
		out[f.name], s = int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(s)))), s[8:]
	}
	if s != "" {
		return nil, fmt.Errorf("record %s: %d bytes past its end", r.id, len(s))
	}
	return out, nil
}

// records are the stored records the prelude defines.
var records = []record{stateRecord, windowRecord}

// ---------------------------------------------------------------- arguments

// limitArgs is a gate.Limits (lease in ms).
var limitArgs = args[gate.Limits]{"LIMITS", []arg[gate.Limits]{
	num("max_concurrency", func(l *gate.Limits) int { return l.MaxConcurrency }),
	num("rpm", func(l *gate.Limits) int64 { return l.RPM }),
	num("tpm", func(l *gate.Limits) int64 { return l.TPM }),
	num("lease", func(l *gate.Limits) int64 { return l.Lease.Milliseconds() }),
}}

// policyArgs is a gate.BreakerPolicy (durations in ms).
var policyArgs = args[gate.BreakerPolicy]{"POLICY", []arg[gate.BreakerPolicy]{
	num("fail_threshold", func(p *gate.BreakerPolicy) int { return p.FailThreshold }),
	num("min_calls", func(p *gate.BreakerPolicy) int { return p.MinCalls }),
	num("fail_rate", func(p *gate.BreakerPolicy) float64 { return p.FailRate }),
	num("window", func(p *gate.BreakerPolicy) int64 { return p.Window.Milliseconds() }),
	num("cooldown", func(p *gate.BreakerPolicy) int64 { return p.Cooldown.Milliseconds() }),
	num("max_cooldown", func(p *gate.BreakerPolicy) int64 { return p.MaxCooldown.Milliseconds() }),
	num("probe_ttl", func(p *gate.BreakerPolicy) int64 { return p.ProbeTTL.Milliseconds() }),
}}

// call is what every head block is written from: the Backend (time, TTL,
// channel) and the request.
type call[R any] struct {
	b            *Backend
	req          *R
	tag, channel string // the scope's (names)
	// seen: an admit's scope's marker as this Backend last saw it
	// (memory.marker), read once for the argument's size and its bytes.
	seen string
}

// admitArgs head the admit call; n candidates (candArgs) follow. What the
// ops of a call share (the scope, the sources' limits and policies) is in
// its CONF argument (confArgs), not in each op.
var admitArgs = args[call[gate.AdmitRequest]]{"ADMIT", []arg[call[gate.AdmitRequest]]{
	num("now", func(c *call[gate.AdmitRequest]) int64 { return c.b.nowArg() }),
	str("permit", func(c *call[gate.AdmitRequest]) string { return c.req.PermitID }),
	num("tokens", func(c *call[gate.AdmitRequest]) int64 { return c.req.Tokens }),
	num("n", func(c *call[gate.AdmitRequest]) int { return len(c.req.Candidates) }),
	str("seen", func(c *call[gate.AdmitRequest]) string { return c.seen }), // see admit.lua's unmarked
}}

// candArgs is one candidate of the admit call: what is the request's own;
// its source's limits and policy are a SRC_CONF block of the call's CONF
// argument (srcConfArgs).
var candArgs = args[gate.Candidate]{"CAND", []arg[gate.Candidate]{
	num("ceiling", func(c *gate.Candidate) int { return c.Ceiling }),
}}

// settleArgs is the settle call's own (its source's policy is the SRC_CONF
// block of the call's CONF argument, as a candidate's).
var settleArgs = args[call[gate.SettleRequest]]{"SETTLE", []arg[call[gate.SettleRequest]]{
	num("now", func(c *call[gate.SettleRequest]) int64 { return c.b.nowArg() }),
	str("permit", func(c *call[gate.SettleRequest]) string { return c.req.PermitID }),
	num("epoch", func(c *call[gate.SettleRequest]) uint64 { return c.req.Epoch }),
	num("probe", func(c *call[gate.SettleRequest]) int { return flag(c.req.Probe) }),
	num("verdict", func(c *call[gate.SettleRequest]) int { return int(c.req.Verdict) }),
	num("floor", func(c *call[gate.SettleRequest]) int64 { return c.req.Floor.Milliseconds() }),
	num("actual", func(c *call[gate.SettleRequest]) int64 { return c.req.ActualTokens }), // < 0 keeps the estimate
	num("progress", func(c *call[gate.SettleRequest]) int { return flag(c.req.Progress) }),
}}

// scopeConf is what every admit and settle of one scope shares: the
// Backend's idle TTL, the scope's channel (from its tag) and name.
type scopeConf struct {
	b          *Backend
	tag, scope string
}

// confArgs (CONF_H) heads the CONF argument of an admit's, a settle's or a
// batch's call: what its ops share, sent once per call instead of in every
// op. A SRC_CONF block (srcConfArgs) per distinct source configuration
// follows, which an op names by its number (in a call of its own, its i-th
// source's is the i-th; in a batch, its BATCH_OP block's cmap says). The
// blocks follow one another, with no position table: a call of its own
// reads them in order, a batch all of them at its start.
var confArgs = args[scopeConf]{"CONF_H", []arg[scopeConf]{
	num("idle_ttl", func(c *scopeConf) int64 { return c.b.idleTTL }),
	str("channel", func(c *scopeConf) string { return c.tag + channelSuffix }),
	str("scope", func(c *scopeConf) string { return c.scope }),
}}

// srcConfArgs is a source's name, limits and policy (a candidate's or a
// settle's), read once per call by lib.lua's op_conf.
var srcConfArgs = args[gate.Source]{"SRC_CONF", concat(
	[]arg[gate.Source]{
		str("name", func(s *gate.Source) string { return s.Name }),
	},
	embed(limitArgs, func(s *gate.Source) *gate.Limits { return &s.Limits }),
	embed(policyArgs, func(s *gate.Source) *gate.BreakerPolicy { return &s.Breaker }),
)}

// peekArgs head the peek call; n sources (peekSourceArgs) follow.
var peekArgs = args[call[gate.PeekRequest]]{"PEEK", []arg[call[gate.PeekRequest]]{
	num("now", func(c *call[gate.PeekRequest]) int64 { return c.b.nowArg() }),
	num("n", func(c *call[gate.PeekRequest]) int { return len(c.req.Sources) }),
	num("tokens", func(c *call[gate.PeekRequest]) int64 { return c.req.Tokens }),
}}

// peekSourceArgs is one source of the peek call, as a candidate.
var peekSourceArgs = args[gate.Candidate]{"PEEK_SRC", concat(
	[]arg[gate.Candidate]{
		num("ceiling", func(c *gate.Candidate) int { return c.Ceiling }),
	},
	embed(limitArgs, func(c *gate.Candidate) *gate.Limits { return &c.Source.Limits }),
)}

// overrideArgs is the whole override call.
var overrideArgs = args[call[gate.OverrideRequest]]{"OVERRIDE", []arg[call[gate.OverrideRequest]]{
	num("now", func(c *call[gate.OverrideRequest]) int64 { return c.b.nowArg() }),
	num("idle_ttl", func(c *call[gate.OverrideRequest]) int64 { return c.b.idleTTL }),
	str("channel", func(c *call[gate.OverrideRequest]) string { return c.channel }),
	str("scope", func(c *call[gate.OverrideRequest]) string { return c.req.Scope }),
	str("source", func(c *call[gate.OverrideRequest]) string { return c.req.Source.Name }),
	num("action", func(c *call[gate.OverrideRequest]) int { return int(c.req.Action) }),
	str("actor", func(c *call[gate.OverrideRequest]) string { return c.req.Actor }),
	str("why", func(c *call[gate.OverrideRequest]) string { return c.req.Why }),
}}

// batchCall heads a batch call (batch.go): the batch's CONF argument
// (confArgs: the scope's, and each distinct SRC_CONF block of its ops)
// follows it, then the sources' batchPreArgs blocks, then n ops, each a
// batchOpArgs block and then the op's own arguments (admitArgs' or
// settleArgs' and what follows them).
type batchCall struct {
	b *Backend
	n int
	// srcs is how many sources the batch has: a batchPreArgs block each
	// follows the BATCH block, before the ops.
	srcs int
}

var batchArgs = args[batchCall]{"BATCH", []arg[batchCall]{
	num("now", func(c *batchCall) int64 { return c.b.nowArg() }),
	num("n", func(c *batchCall) int { return c.n }),
	num("srcs", func(c *batchCall) int { return c.srcs }),
}}

// batchPre is what a batch's ops will read of a source's state hash besides
// the breaker: its window, if a settle of the batch counts (window), and
// the lease field of each op's permit (leases: leaseField + permit). The
// batch reads them with the breaker, in one HMGET, when it first loads the
// hash (lib.lua's b_first), instead of a command per op.
type batchPre struct {
	window bool
	leases []string
}

// batchPreArgs is a source's batchPre, one block per source of the batch
// in the order of its keys (batchSrcKeys), each followed by its leases, one
// argument each (at most one per op: maxBatchOps).
var batchPreArgs = args[batchPre]{"BATCH_PRE", []arg[batchPre]{
	num("window", func(p *batchPre) int { return flag(p.window) }),
	num("leases", func(p *batchPre) int { return len(p.leases) }),
}}

// batchOpArgs heads one op of a batch, in the op's one argument (its
// opArg follows): its kind (opAdmit, opSettle) and map: where its keys
// are, one byte per source of the op (in the order of its keys in a call
// of its own), the number of that source among the batch's (batchSrcKeys,
// from 1), and cmap: the same for its SRC_CONF blocks, the number of each
// among the blocks of the batch's CONF argument (from 1). A batch has at
// most maxBatchKeys / len(batchSrcKeys.suffixes) sources, and as many
// sources of its ops counted once per op (each brings those keys of its
// own), fewer than 256.
var batchOpArgs = args[batchOp]{"BATCH_OP", []arg[batchOp]{
	num("kind", func(o *batchOp) int { return int(o.kind) }),
	str("map", func(o *batchOp) string { return o.kmap }),
	str("cmap", func(o *batchOp) string { return o.cmap }),
}}

// batchSrcKeys are a source's keys in a batch, each source once: its own
// (sourceKeys) and its line's (lineKeys). The scope's keys come first, once.
var batchSrcKeys = keyBlock{"BATCH_SRC",
	append(slices.Clone(sourceKeys.suffixes), lineKeys.suffixes...),
	append(slices.Clone(sourceKeys.names), lineKeys.suffixes...)}

// restoreKeys head the restore call's keys: the scope's marker (no TTL: it
// is missing only if Redis lost the scope); n brkKeys follow.
var restoreKeys = keyBlock{"RESTORE_KEYS", []string{"marker"}, nil}

// brkKeys is a source's state hash alone (its breaker).
var brkKeys = keyBlock{"BRK_KEYS", []string{keySchema}, []string{"brk"}}

// restoreCall heads the restore call: n records (restoreSrcArgs) follow.
type restoreCall struct {
	b *Backend
	n int
	// seen is the marker this Backend last saw ("" : none yet); token is
	// the marker to create if it is missing.
	seen, token string
}

var restoreArgs = args[restoreCall]{"RESTORE", []arg[restoreCall]{
	num("now", func(c *restoreCall) int64 { return c.b.nowArg() }),
	num("idle_ttl", func(c *restoreCall) int64 { return c.b.idleTTL }),
	num("n", func(c *restoreCall) int { return c.n }),
	str("seen", func(c *restoreCall) string { return c.seen }),
	str("token", func(c *restoreCall) string { return c.token }),
}}

// restoreRec is a remembered breaker as of now (durations in ms, relative to
// now; open_left 0: not OPEN).
type restoreRec struct {
	openLeft, openedAgo, overrideAgo int64
	reopens                          int
	epoch                            uint64
	cause                            gate.OpenCause
	override                         gate.Override
	actor, why                       string
}

var restoreSrcArgs = args[restoreRec]{"RESTORE_SRC", []arg[restoreRec]{
	num("open_left", func(r *restoreRec) int64 { return r.openLeft }),
	num("reopens", func(r *restoreRec) int { return r.reopens }),
	num("epoch", func(r *restoreRec) uint64 { return r.epoch }),
	num("opened_ago", func(r *restoreRec) int64 { return r.openedAgo }),
	num("cause", func(r *restoreRec) int { return int(r.cause) }),
	num("override", func(r *restoreRec) int { return int(r.override) }),
	str("actor", func(r *restoreRec) string { return r.actor }),
	str("why", func(r *restoreRec) string { return r.why }),
	num("override_ago", func(r *restoreRec) int64 { return r.overrideAgo }),
}}

func concat[T any](parts ...[]arg[T]) []arg[T] {
	var out []arg[T]
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ---------------------------------------------------------------- replies

// number reads a number field with num: a packed record's as it is, an
// array reply's element once checked to be an integer.
func number[T any](num func(*parser, int64, *T)) getter[T] {
	return getter[T]{read: func(p *parser, v any, t *T) { num(p, p.int(v), t) }, num: num}
}

func getInt[T any](set func(*T, int64)) getter[T] {
	return number(func(_ *parser, v int64, t *T) { set(t, v) })
}

func getUint[T any](set func(*T, uint64)) getter[T] {
	return number(func(p *parser, v int64, t *T) { set(t, p.nonNegative(v)) })
}

func getStr[T any](set func(*T, string)) getter[T] {
	return getter[T]{read: func(p *parser, v any, t *T) { set(t, p.str(v)) }, str: true}
}

// nested reads a nested record or list (in a packed record, a string).
func nested[T any](read func(*parser, any, *T)) getter[T] {
	return getter[T]{read: read, str: true}
}

// quotaView is a gate.QuotaView.
var quotaView = newReply("QV", []ret[gate.QuotaView]{
	{"in_flight", getInt(func(q *gate.QuotaView, v int64) { q.InFlight = int(v) })},
	{"requests", getInt(func(q *gate.QuotaView, v int64) { q.Requests = v })},
	{"tokens", getInt(func(q *gate.QuotaView, v int64) { q.Tokens = v })},
})

// indexed is a record that names its source by index (the candidate's, from
// 1; 1 in a one-source reply).
type indexed[T any] struct {
	src int64
	v   T
}

// eventReply is a gate.Event with the source as an index.
var eventReply = packedReply("EV", append([]ret[indexed[gate.Event]]{
	{"src", getInt(func(e *indexed[gate.Event], v int64) { e.src = v })},
}, eventFields("EV", func(e *indexed[gate.Event]) *gate.Event { return &e.v },
	"kind", "from", "to", "cause", "epoch", "reopens", "cooldown", "permit", "override", "actor", "why")...))

// eventFields are the fields of a gate.Event named, in that order, of a
// record T that holds one (ev), each checked as gate names it: an enum in
// its range, a count or cooldown not negative, a text of at most
// gate.MaxText bytes. An event reply and an announcement read their events
// with them, so that both refuse the same values.
func eventFields[T any](id string, ev func(*T) *gate.Event, names ...string) []ret[T] {
	out := make([]ret[T], len(names))
	for i, name := range names {
		switch name {
		case "kind":
			out[i] = inRange(id, name, int64(gate.EventTransition), int64(gate.EventOverride), func(t *T, v int64) { ev(t).Kind = gate.EventKind(v) })
		case "from":
			out[i] = inRange(id, name, 0, int64(gate.HalfOpen), func(t *T, v int64) { ev(t).From = gate.State(v) })
		case "to":
			out[i] = inRange(id, name, 0, int64(gate.HalfOpen), func(t *T, v int64) { ev(t).To = gate.State(v) })
		case "cause":
			out[i] = inRange(id, name, 0, int64(gate.CauseReset), func(t *T, v int64) { ev(t).Cause = gate.Cause(v) })
		case "epoch":
			out[i] = ret[T]{name, getUint(func(t *T, v uint64) { ev(t).Epoch = v })}
		case "reopens":
			out[i] = inRange(id, name, 0, math.MaxInt, func(t *T, v int64) { ev(t).Reopens = int(v) })
		case "cooldown":
			out[i] = ret[T]{name, number(func(p *parser, v int64, t *T) { ev(t).Cooldown = ms(int64(p.nonNegative(v))) })}
		case "permit":
			out[i] = text(id, name, func(t *T, v string) { ev(t).PermitID = v })
		case "override":
			out[i] = inRange(id, name, 0, int64(gate.Disabled), func(t *T, v int64) { ev(t).Override = gate.Override(v) })
		case "actor":
			out[i] = text(id, name, func(t *T, v string) { ev(t).Actor = v })
		case "why":
			out[i] = text(id, name, func(t *T, v string) { ev(t).Why = v })
		default:
			panic("redisgate: no event field " + name)
		}
	}
	return out
}

// rejection is a gate.Rejection with the source as an index; a verdict
// (peek) is the same record without the index.
var rejection = packedReply("REJ", []ret[indexed[gate.Rejection]]{
	{"src", getInt(func(r *indexed[gate.Rejection], v int64) { r.src = v })},
	{"reason", number(func(p *parser, v int64, r *indexed[gate.Rejection]) { r.v.Reason = p.reason(v) })},
	{"retry", number(func(p *parser, v int64, r *indexed[gate.Rejection]) { r.v.RetryAfter = ms(int64(p.nonNegative(v))) })},
})

// raw keeps a reply element for a nested layout to read.
func raw[T any](set func(*T, any)) getter[T] {
	return nested(func(_ *parser, v any, t *T) { set(t, v) })
}

// clockReply is the time pair every reply but override's ends with.
type clockReply struct{ progress, now int64 }

func (c clockReply) age() time.Duration { return progressAge(c.progress, c.now) }

type admitOut struct {
	granted, probe  int64
	epoch           uint64
	rejections, evs any
	clock           clockReply
	line            lineAdmit
}

var admitReply = packedReply("ADMIT_R", []ret[admitOut]{
	{"granted", getInt(func(r *admitOut, v int64) { r.granted = v })},
	{"probe", getInt(func(r *admitOut, v int64) { r.probe = v })},
	{"epoch", getUint(func(r *admitOut, v uint64) { r.epoch = v })},
	{"rejections", raw(func(r *admitOut, v any) { r.rejections = v })},
	{"events", raw(func(r *admitOut, v any) { r.evs = v })},
	{"progress", getInt(func(r *admitOut, v int64) { r.clock.progress = v })},
	{"now", getInt(func(r *admitOut, v int64) { r.clock.now = v })},
	{"line", nested(func(p *parser, v any, r *admitOut) { r.line = lineAdmitReply.parse(p, v) })},
})

// settleOut is a settle's reply: an array of its record (SETTLE_R,
// packed) and the breaker and its window as saved (see breakerAt), each
// an element of its own, which Redis copies as it is: packing them into
// the record would copy and hash their bytes in Lua once more.
type settleOut struct {
	released, effect int64
	evs              any
	clock            clockReply
	handoff          string
	breaker, window  any
}

var settleReply = newReply("SETTLE_OUT", []ret[settleOut]{
	{"r", nested(func(p *parser, v any, r *settleOut) { settleRecord.into(p, v, r) })},
	{"breaker", raw(func(r *settleOut, v any) { r.breaker = v })},
	{"window", raw(func(r *settleOut, v any) { r.window = v })},
})

var settleRecord = packedReply("SETTLE_R", []ret[settleOut]{
	{"released", getInt(func(r *settleOut, v int64) { r.released = v })},
	{"effect", getInt(func(r *settleOut, v int64) { r.effect = v })},
	{"events", raw(func(r *settleOut, v any) { r.evs = v })},
	{"progress", getInt(func(r *settleOut, v int64) { r.clock.progress = v })},
	{"now", getInt(func(r *settleOut, v int64) { r.clock.now = v })},
	{"handoff", getStr(func(r *settleOut, v string) { r.handoff = v })},
})

type peekOut struct {
	clock   clockReply
	sources any
}

var peekReply = newReply("PEEK_R", []ret[peekOut]{
	{"progress", getInt(func(r *peekOut, v int64) { r.clock.progress = v })},
	{"now", getInt(func(r *peekOut, v int64) { r.clock.now = v })},
	{"sources", raw(func(r *peekOut, v any) { r.sources = v })},
})

// peekSrcOut is one source of a peek reply: its breaker and window as
// stored (see breakerAt), the quota's view and Admit's verdict now.
type peekSrcOut struct {
	breaker, window any
	v               gate.SourceView
}

var peekSource = newReply("PEEK_SRC_R", []ret[peekSrcOut]{
	{"breaker", raw(func(s *peekSrcOut, v any) { s.breaker = v })},
	{"window", raw(func(s *peekSrcOut, v any) { s.window = v })},
	{"quota", nested(func(p *parser, v any, s *peekSrcOut) { s.v.Quota = quotaView.parse(p, v) })},
	{"reason", getInt(func(s *peekSrcOut, v int64) { s.v.Verdict.Reason = gate.Reason(v) })},
	{"retry", getInt(func(s *peekSrcOut, v int64) { s.v.Verdict.RetryAfter = ms(v) })},
	{"line", nested(func(p *parser, v any, s *peekSrcOut) { s.v.Line = lineReply.parse(p, v) })},
})

// overrideOut: the breaker and its window as saved (see breakerAt).
type overrideOut struct {
	evs, breaker, window, quota any
	now                         int64
}

var overrideReply = newReply("OVERRIDE_R", []ret[overrideOut]{
	{"events", raw(func(r *overrideOut, v any) { r.evs = v })},
	{"breaker", raw(func(r *overrideOut, v any) { r.breaker = v })},
	{"window", raw(func(r *overrideOut, v any) { r.window = v })},
	{"quota", raw(func(r *overrideOut, v any) { r.quota = v })},
	{"now", getInt(func(r *overrideOut, v int64) { r.now = v })},
})

type restoreOut struct {
	lost, restored int64
	marker         string
}

// restoreReply: whether the marker was missing or not the one seen (0/1),
// how many breakers were written, and the marker now.
var restoreReply = newReply("RESTORE_R", []ret[restoreOut]{
	{"lost", getInt(func(r *restoreOut, v int64) { r.lost = v })},
	{"restored", getInt(func(r *restoreOut, v int64) { r.restored = v })},
	{"marker", getStr(func(r *restoreOut, v string) { r.marker = v })},
})

// announced is an announcement: its format version, scope, and event.
type announced struct {
	version int64
	scope   string
	e       gate.Event
}

// announcement is what lib.lua's announce publishes (as a JSON array) and
// Subscribe reads.
var announcement = newReply("ANN", append([]ret[announced]{
	{"version", getInt(func(a *announced, v int64) { a.version = v })},
	text("ANN", "scope", func(a *announced, v string) { a.scope = v }),
	text("ANN", "source", func(a *announced, v string) { a.e.Source = v }),
}, eventFields("ANN", func(a *announced) *gate.Event { return &a.e },
	"kind", "from", "to", "cause", "epoch", "reopens", "cooldown", "override", "actor", "why")...))

// luaLayouts are the layouts the prelude defines.
func luaLayouts() []luaLayout {
	return append([]luaLayout{
		sourceKeys.lua(), scopeKeys.lua(),
		limitArgs.lua(), policyArgs.lua(), admitArgs.lua(), candArgs.lua(), settleArgs.lua(), confArgs.lua(), srcConfArgs.lua(), peekArgs.lua(),
		peekSourceArgs.lua(), overrideArgs.lua(),
		quotaView.lua(), eventReply.lua(), rejection.lua(), admitReply.lua(), settleRecord.lua(),
		peekReply.lua(), peekSource.lua(), overrideReply.lua(), announcement.lua(),
		restoreKeys.lua(), brkKeys.lua(), restoreArgs.lua(), restoreSrcArgs.lua(), restoreReply.lua(),
		batchArgs.lua(), batchPreArgs.lua(), batchOpArgs.lua(), batchSrcKeys.lua(),
	}, lineLayouts()...)
}
