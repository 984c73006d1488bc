package redisgate

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/polygate/polygate/internal/redistest"
)

// TestIdivIsGosDivision runs lib.lua's idiv in Redis's Lua against Go's
// integer division, at the edges where a / b in floating point rounds to
// the next integer (a just below a multiple of b, near 2^53), and against
// the division it had before its a % b case (math.floor and corrections)
// for fractions (of a and of b) and numbers past 2^53, which Go never sends
// but an argument may hold.
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
	script := prelude() + libLua + callStart + `
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
local out, bad = {}, {}
` + body.String() + `
out[#out + 1] = table.concat(bad, ', ')
return out
`
	got, err := c.Eval(context.Background(), script, nil).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
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
