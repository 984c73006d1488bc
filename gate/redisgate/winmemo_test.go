package redisgate

import (
	"testing"

	"github.com/polygate/polygate/internal/redistest"
)

// TestWindowRowMemo runs the window's get and put, which remember the last
// put (layout.go), in Redis's Lua against a row read and a row replaced
// without a memo: a seeded random walk over windows (the last put's, an
// older one, another breaker's, the zero window), rows (mostly the last
// one) and values (whole, fractional, negative, numeric strings).
func TestWindowRowMemo(t *testing.T) {
	c := redistest.Start(t).Client(t)
	script := prelude() + libLua + callStart + `
return (function() -- (its locals its own: the library's chunk is at Lua's 200)
local function get0(s, row) return S_UNPACK(WIN.ROW, s, row * 24 + 1) end
local function put0(s, row, a, b, c)
  return string.sub(s, 1, row * 24) .. S_PACK(WIN.ROW, a, b, c) .. string.sub(s, row * 24 + 25)
end
math.randomseed(11)
local bad, seen, s, row = {}, { WIN.ZERO }, WIN.ZERO, 0
local vals = { 0, 1, 2, 7.5, -3, 123456789012, '42' }
for step = 1, 20000 do
  local r = math.random()
  if r < 0.1 then
    s = seen[math.random(#seen)] -- an older window
  elseif r < 0.15 then
    s = WIN.ZERO
  end
  if math.random() < 0.3 then
    row = math.random(0, BUCKETS - 1)
  end
  local a1, a2, a3 = WIN.get(s, row)
  local b1, b2, b3 = get0(s, row)
  if a1 ~= b1 or a2 ~= b2 or a3 ~= b3 or type(a1) ~= 'number' then
    bad[#bad + 1] = 'get at step ' .. step
  end
  local v1, v2, v3 = vals[math.random(#vals)], vals[math.random(#vals)], vals[math.random(#vals)]
  local out = WIN.put(s, row, v1, v2, v3)
  if out ~= put0(s, row, v1, v2, v3) then
    bad[#bad + 1] = 'put at step ' .. step
  end
  if #bad > 5 then
    break
  end
  s = out
  if math.random() < 0.05 then
    seen[#seen + 1] = s
  end
end
return bad
end)()
`
	if bad := evalList(t, c, script); len(bad) > 0 {
		t.Errorf("the window's memo differs from a row read or replaced without it: %v", bad)
	}
}
