package redisgate

import (
	"testing"

	"github.com/polygate/polygate/internal/redistest"
)

// TestNowMsReadsTime runs now_ms (lib.lua) outside a batch in Redis's Lua:
// with 0 the server's TIME in whole milliseconds (its strings read by
// arithmetic, its microseconds cut to whole milliseconds without
// math.floor), which a read of TIME by tonumber and math.floor around it
// brackets; a test clock's time as given, a number or a string.
func TestNowMsReadsTime(t *testing.T) {
	c := redistest.Start(t).Client(t)
	script := prelude() + libLua + `
return (function() -- (its locals its own: the library's chunk is at Lua's 200)
local function ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local bad = {}
for i = 1, 50 do
  local a = ms()
  local n = now_ms(0)
  local b = ms()
  if type(n) ~= 'number' or n ~= math.floor(n) or n < a or n > b then
    bad[#bad + 1] = 'now_ms(0) ' .. tostring(n) .. ' not a whole millisecond within ' .. a .. '..' .. b
    break
  end
end
if now_ms(5) ~= 5 or now_ms('7') ~= 7 then
  bad[#bad + 1] = 'a test clock: ' .. tostring(now_ms(5)) .. ' ' .. tostring(now_ms('7'))
end
local a, n = ms(), now_ms('0')
if n < a or n ~= math.floor(n) then bad[#bad + 1] = 'now_ms("0") ' .. tostring(n) .. ', not TIME' end
return bad
end)()
`
	for range 3 {
		for _, b := range evalList(t, c, script) {
			t.Error(b)
		}
	}
}
