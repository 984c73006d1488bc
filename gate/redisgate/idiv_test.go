package redisgate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/polygate/polygate/internal/redistest"
)

// TestIdivIsGosDivision runs lib.lua's idiv in Redis's Lua against Go's
// integer division, around multiples of b up to 2^53 (below it a / b in
// floating point never rounds up to the next integer for whole a and b,
// so these pin the a % b way's arithmetic), and against the division it
// had before its a % b way (math.floor and corrections) where that way
// must not be taken or could round: numbers past 2^53 and fractions of a
// and of b, which Go never sends but an argument may hold.
func TestIdivIsGosDivision(t *testing.T) {
	c := redistest.Start(t).Client(t)
	type pair struct{ a, b int64 }
	var ints []pair
	for _, b := range []int64{1, 2, 3, 7, 10, 1000, 6000, 1 << 20, 1<<20 + 1, 999_999_937, 1 << 40, 3 << 45} {
		for _, base := range []int64{0, 1_764_600_000_000, 1 << 52, 1<<53 - 1<<20} {
			for _, d := range []int64{-2, -1, 0, 1, 2} {
				a := base/b*b + d
				if a < 1<<53 && a > -(1<<53) {
					ints = append(ints, pair{a, b}, pair{-a, b})
				}
			}
			ints = append(ints, pair{1<<53 - 1, b}, pair{-(1<<53 - 1), b})
		}
	}
	var body strings.Builder
	for _, p := range ints {
		fmt.Fprintf(&body, "out[#out + 1] = string.format('%%d', idiv(%d, %d))\n", p.a, p.b)
	}
	for _, a := range []string{"0.5", "1.5", "9.99", "10.000001", "70", "133", "1764600000123.25", "4503599627370495.5", "-7.5",
		"2^53 + 2", "2^60 - 2^8", "3 * 2^61 - 2^12", "-(2^62)", "1/0"} {
		for _, b := range []string{"1", "3", "10", "1000", "7 * 2^40 + 1", "1.1", "2.5", "3.3", "1000.1"} {
			fmt.Fprintf(&body, "if idiv(%s, %s) ~= old(%s, %s) then bad[#bad + 1] = '%s / %s' end\n", a, b, a, b, a, b)
		}
	}
	script := prelude() + libLua + callStart + oldIdivLua + `
local out, bad = {}, {}
` + body.String() + `
out[#out + 1] = table.concat(bad, ', ')
return out
`
	got := evalList(t, c, script)
	if len(got) != len(ints)+1 {
		t.Fatalf("%d results, want %d", len(got), len(ints)+1)
	}
	for i, p := range ints {
		if want := fmt.Sprint(p.a / p.b); got[i] != want {
			t.Errorf("idiv(%d, %d) = %s, want %s", p.a, p.b, got[i], want)
		}
	}
	if bad := got[len(ints)]; bad != "" {
		t.Errorf("idiv differs from its earlier division for %s", bad)
	}
}

// TestRecordBucketAsIdiv runs b_record, whose bucket index and slot are
// idiv's a % b way written inline, at times where that way must not be
// taken (before 1970, which a test clock may pass, and past 2^53) and
// around them, against the row the old division (math.floor and
// corrections) names (review lua9r).
func TestRecordBucketAsIdiv(t *testing.T) {
	c := redistest.Start(t).Client(t)
	var body strings.Builder
	for _, now := range []string{"0", "1", "999", "1000", "1764600000123", "-1", "-999", "-1000", "-1001", "-10001",
		"-1764600000123", "2^53 - 1", "2^53", "2^53 + 2", "2^60", "1.5", "-1.5"} {
		for _, w := range []string{"1", "3", "1000", "6000"} {
			fmt.Fprintf(&body, "check(%s, %s)\n", now, w)
		}
	}
	script := prelude() + libLua + callStart + `
return (function()
` + oldIdivLua + `
local bad = {}
local function check(now, w)
  local b = { win = WIN.ZERO, wold = WIN.ZERO, width = w }
  local p = { window = w * BUCKETS, wwin = w * BUCKETS, wid = w }
  local ok = pcall(b_record, b, p, now, false, 1)
  local idx = old(now, w)
  local slot = idx - old(idx, BUCKETS) * BUCKETS
  if idx == 0 then
    idx = 0 -- (-0, before 1970: b_record keeps the zero window's +0 index, equal to it)
  end
  -- (a row before the window's first, at a time before 1970, raises
  -- where the row is read: both ways)
  local want_ok = pcall(S_UNPACK, WIN.ROW, WIN.ZERO, slot * 24 + 1)
  local want = string.sub(WIN.ZERO, 1, slot * 24) .. S_PACK(WIN.ROW, idx, 1, 0) .. string.sub(WIN.ZERO, slot * 24 + 25)
  if ok ~= want_ok or (ok and b.win ~= want) then
    bad[#bad + 1] = tostring(now) .. ' / ' .. tostring(w)
  end
end
` + body.String() + `
return bad
end)()
`
	if bad := evalList(t, c, script); len(bad) > 0 {
		t.Errorf("b_record's row differs from the old division's at %v", bad)
	}
}

// oldIdivLua is idiv as it was before its a % b way (math.floor, then the
// corrections), as the Lua function old: what the tests above compare with.
const oldIdivLua = `
local function old(a, b)
  if a < 0 then
    return -old(-a, b)
  end
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
`
