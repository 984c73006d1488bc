package redisgate

import (
	"slices"
	"strings"
	"testing"
)

// TestInlinedReadsFollowTheLayouts pins the Lua lines that unpack or pack
// a layout's fields by position instead of through its generated
// functions (admit.lua, settle.lua, batch.lua: the ops' common path,
// docs/performance.md, ninth session) to the layouts' field order: a field
// added to ADMIT, SETTLE, BATCH_OP, CAND, WAITER, HANDOFF, ADMIT_R or
// SETTLE_R fails here, naming the line to change with it.
func TestInlinedReadsFollowTheLayouts(t *testing.T) {
	src := luaSources(t)
	layouts := map[string]luaLayout{}
	for _, l := range luaLayouts() {
		layouts[l.id] = l
	}
	for _, c := range []struct {
		file, line string
		id         string
		names      []string // the layout's fields, in order, that the line assumes
	}{
		{"admit.lua", "local hnow, permit, tokens, n, seen, cpos = S_UNPACK(ADMIT.FMT, args, at)",
			"ADMIT", []string{"now", "permit", "tokens", "n", "seen"}},
		{"admit.lua", "ceil, waits = S_UNPACK('<dd', args, cpos)", "CAND", []string{"ceiling"}},
		{"admit.lua", "ceil, waits = S_UNPACK('<dd', args, cpos)", "WAITER", []string{"on"}},
		{"admit.lua", "return ADMIT_R.pack_memo(granted, probe, epoch, rejections, events, progress, now, places)",
			"ADMIT_R", []string{"granted", "probe", "epoch", "rejections", "events", "progress", "now", "line"}},
		{"admit.lua", "r, rnow, rprog = ADMIT_R.pack_memo(1, 0, b.epoch, '', '', progress, now, NO_LINE)",
			"ADMIT_R", []string{"granted", "probe", "epoch", "rejections", "events", "progress", "now", "line"}},
		{"settle.lua", "local snow, permit, epoch, probe, verdict, floor, actual, pflag, hb = S_UNPACK(SETTLE.FMT, args, at)",
			"SETTLE", []string{"now", "permit", "epoch", "probe", "verdict", "floor", "actual", "progress"}},
		{"settle.lua", "if S_UNPACK('<d', args, hb) == 1 then", "HANDOFF", []string{"on"}},
		{"settle.lua", "SETTLE_R.pack_memo(rel, effect, events, progress, now, handoff)",
			"SETTLE_R", []string{"released", "effect", "events", "progress", "now", "handoff"}},
		{"batch.lua", "local kind, map, cmap, p0 = S_UNPACK(BATCH_OP.FMT, s, 1)", "BATCH_OP", []string{"kind", "map", "cmap"}},
		// the runs' (admit_run, settle_run)
		{"admit.lua", "local hnow, permit, tokens, nc, seen, cpos = S_UNPACK(ADMIT.FMT, args, at)",
			"ADMIT", []string{"now", "permit", "tokens", "n", "seen"}},
		{"admit.lua", "local kind, ml, m, cl, cm, q0 = S_UNPACK('<dI4BI4B', args, 1)", "BATCH_OP", []string{"kind", "map", "cmap"}},
		{"settle.lua", "local kind, ml, m, cl, cm, q0 = S_UNPACK('<dI4BI4B', args, 1)", "BATCH_OP", []string{"kind", "map", "cmap"}},
		{"settle.lua", "t = { SETTLE_R.pack_memo(1, F_APPLIED, '', progress, now, handoff), rec, false }",
			"SETTLE_R", []string{"released", "effect", "events", "progress", "now", "handoff"}},
	} {
		if !strings.Contains(src[c.file], c.line) {
			t.Errorf("%s: no line %q (this test names the lines that read %s by position: keep it in step)", c.file, c.line, c.id)
			continue
		}
		l, ok := layouts[c.id]
		if !ok {
			t.Errorf("no layout %s", c.id)
			continue
		}
		// A layout read in full must be exactly these fields; one whose
		// first fields alone are read (CAND's ceiling, WAITER's and
		// HANDOFF's on) must start with them, and CAND be that one field
		// (WAITER follows it in the '<dd' read).
		full := c.id != "WAITER" && c.id != "HANDOFF"
		got := l.names
		if !full && len(got) > len(c.names) {
			got = got[:len(c.names)]
		}
		if !slices.Equal(got, c.names) {
			t.Errorf("%s's fields are %v, but %s:\n  %s\nreads them as %v: change the line with the layout", c.id, l.names, c.file, c.line, c.names)
		}
		for _, f := range c.names {
			if slices.Contains(l.strs, f) != slices.Contains([]string{"permit", "seen", "map", "cmap", "rejections", "events", "line", "handoff"}, f) {
				t.Errorf("%s.%s changed between a number and a string: %s:\n  %s", c.id, f, c.file, c.line)
			}
		}
	}
}

// TestKeepCopiesTheFieldsAside: lib.lua's b_keep copies the breaker
// record's fields aside (a lease count, the TTL's mark: stateRecord's
// aside fields) into its saved copy on every save, inline (no copy_aside
// call per save); the line must name exactly those fields, in order.
func TestKeepCopiesTheFieldsAside(t *testing.T) {
	const mark = "-- (BREC.copy_aside's)"
	var line string
	for _, l := range strings.Split(luaSources(t)["lib.lua"], "\n") {
		if strings.Contains(l, mark) {
			line = strings.TrimSpace(l)
		}
	}
	if line == "" {
		t.Fatalf("lib.lua: no line marked %q (b_keep's copy of the fields aside)", mark)
	}
	var want, to, from []string
	for _, f := range stateRecord.fields {
		if f.aside {
			want = append(want, f.name)
		}
	}
	lhs, rhs, ok := strings.Cut(strings.TrimSpace(strings.TrimSuffix(line, mark)), " = ")
	if !ok {
		t.Fatalf("lib.lua: %q is not an assignment", line)
	}
	for _, v := range strings.Split(lhs, ", ") {
		to = append(to, strings.TrimPrefix(v, "d."))
	}
	for _, v := range strings.Split(rhs, ", ") {
		from = append(from, strings.TrimPrefix(v, "b."))
	}
	if !slices.Equal(to, want) || !slices.Equal(from, want) {
		t.Errorf("BREC's fields aside are %v, but lib.lua's b_keep copies %v from %v:\n  %s", want, to, from, line)
	}
}
