package redisgate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/polygate/polygate/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestPackMemoComparesEveryField runs each memoized layout's pack_memo in
// Redis's Lua: after a record, the same record but for one field (each
// field in turn) packs as pack does, not as the memo of the first; and the
// first again packs as itself. A field left out of the memo's comparison
// would answer the earlier record's bytes.
// evalList runs script, one of the tests that run the library's Lua in
// Redis and answer a list of strings (most: what differed), and returns
// the list.
func evalList(t *testing.T, c *redis.Client, script string) []string {
	t.Helper()
	out, err := c.Eval(context.Background(), script, nil).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPackMemoComparesEveryField(t *testing.T) {
	c := redistest.Start(t).Client(t)
	n := 0
	for _, l := range luaLayouts() {
		if !memoized[l.id] {
			continue
		}
		n++
		var base, body strings.Builder
		var vals []string // t's fields in layout order: pack_memo's arguments
		for _, f := range l.names {
			vals = append(vals, "t."+f)
		}
		for _, f := range l.names {
			v := "1"
			if slices.Contains(l.strs, f) {
				v = "'a'"
			}
			fmt.Fprintf(&base, "%s = %s, ", f, v)
		}
		for _, f := range l.names {
			v := "2"
			if slices.Contains(l.strs, f) {
				v = "'b'"
			}
			fmt.Fprintf(&body, "check(%q, %s)\n", f, v)
		}
		script := prelude() + callStart + fmt.Sprintf(`
local L, bad = %s, {}
local function base() return { %s } end
local function memo(t) return L.pack_memo(%s) end
local function check(f, v)
  memo(base())
  local t = base()
  t[f] = v
  if memo(t) ~= L.pack(t) then bad[#bad + 1] = f end
  if memo(base()) ~= L.pack(base()) then bad[#bad + 1] = f .. ' (the first again)' end
end
%s
return bad
`, l.id, base.String(), strings.Join(vals, ", "), body.String())
		if bad := evalList(t, c, script); len(bad) > 0 {
			t.Errorf("%s.pack_memo answered the earlier record's bytes for a record differing in %v", l.id, bad)
		}
	}
	if n != len(memoized) {
		t.Fatalf("%d memoized layouts found, want %d", n, len(memoized))
	}
}
