package redisgate

import (
	"testing"

	"github.com/polygate/polygate/internal/redistest"
)

// confMemoHead opens the memo tests' function (its locals its own: the
// library's chunk is at Lua's 200) with src and conf, which pack a
// SRC_CONF and a CONF argument.
const confMemoHead = `
return (function()
local function src(name, conc)
  return SRC_CONF.pack({ name = name, max_concurrency = conc, rpm = 0, tpm = 0, lease = 30000, fail_threshold = 5,
    min_calls = 10, fail_rate = 0.5, window = 60000, cooldown = 1000, max_cooldown = 60000, probe_ttl = 5000 })
end
local function conf(ttl, scope, ...)
  return CONF_H.pack({ idle_ttl = ttl, channel = 'ch-' .. scope, scope = scope }) .. table.concat({ ... })
end
`

// TestConfOpenMemo runs conf_open, which keeps the last batch's CONF
// argument read (lib.lua), in Redis's Lua: batches of the same argument,
// of another, a lone call's between two batches of the same argument (it
// refills CONF_H.T: the next batch reads its own again), a batch whose
// argument raises, one read within a smaller max, and none; lone calls of the argument a batch read last
// and again. Each must leave CONF_H.T, CONF_SRC and a lone call's sources
// (op_conf) as a read of its own argument does.
func TestConfOpenMemo(t *testing.T) {
	c := redistest.Start(t).Client(t)
	script := prelude() + libLua + callStart + confMemoHead + `
local A = conf(1000, 'a', src('x', 1), src('y', 2))
local B = conf(2000, 'b', src('z', 3))
local bad = {}
local function want(step, ttl, scope, names)
  local h = CONF_H.T
  if h.idle_ttl ~= ttl or h.scope ~= scope or h.channel ~= 'ch-' .. scope then
    bad[#bad + 1] = step .. ': scope block ' .. tostring(h.scope) .. ' ' .. tostring(h.idle_ttl)
  end
  if names then
    local got = {}
    for i, p in ipairs(CONF_SRC or {}) do got[i] = p.name .. '=' .. p.max_concurrency end
    if table.concat(got, ',') ~= names then
      bad[#bad + 1] = step .. ': sources ' .. table.concat(got, ',') .. ', want ' .. names
    end
  elseif CONF_SRC ~= nil then
    bad[#bad + 1] = step .. ': a lone call with a batch\'s sources'
  end
end
conf_open(A, true, 255); want('A', 1000, 'a', 'x=1,y=2')
local first = CONF_SRC
conf_open(A, true, 255); want('A again', 1000, 'a', 'x=1,y=2')
if CONF_SRC ~= first then bad[#bad + 1] = 'A again: read again, not the memo' end
conf_open(B, true, 255); want('B', 2000, 'b', 'z=3')
conf_open(A, true, 255); want('A after B', 1000, 'a', 'x=1,y=2')
conf_open(B, false); want('B alone', 2000, 'b', nil)
if op_conf(nil, 1).name ~= 'z' then bad[#bad + 1] = 'B alone: its first source not z' end
conf_open(A, true, 255); want('A after B alone', 1000, 'a', 'x=1,y=2')
conf_open(A, false); want('A alone', 1000, 'a', nil)
if op_conf(nil, 2).name ~= 'y' then bad[#bad + 1] = 'A alone: its second source not y' end
conf_open(A, false); want('A alone again', 1000, 'a', nil)
if op_conf(nil, 1).name ~= 'x' or op_conf(nil, 2).max_concurrency ~= 2 then
  bad[#bad + 1] = 'A alone again: its sources not x, y'
end
if pcall(conf_open, B, true, 0) then bad[#bad + 1] = 'B of at most 0 sources did not raise' end
conf_open(A, true, 255); want('A after a raise', 1000, 'a', 'x=1,y=2')
if pcall(conf_open, A, true, 1) then bad[#bad + 1] = 'A of at most 1 source after A read within 255 did not raise' end
conf_open(A, true, 255); want('A after a smaller max', 1000, 'a', 'x=1,y=2')
conf_open(A, true, 255)
if pcall(conf_open, nil, true, 255) then bad[#bad + 1] = 'no CONF argument did not raise' end
conf_open(B, false)
if pcall(conf_open, nil, true, 255) then bad[#bad + 1] = 'no CONF argument after a lone call did not raise' end
return bad
end)()
`
	for _, b := range evalList(t, c, script) {
		t.Error(b)
	}
}

// TestLoneConfMemo runs op_conf's memo of a lone call's first source
// (CONF_H.ONE, lib.lua) in Redis's Lua: the same argument again (the memo,
// not read again), another argument, one whose scope block is the same but
// whose first source is not, one that raises while its first source is
// read, a batch of the same argument between two lone calls (the memos are
// disjoint), and the order op_conf asks for: each must answer as a read of its
// own argument does.
func TestLoneConfMemo(t *testing.T) {
	c := redistest.Start(t).Client(t)
	script := prelude() + libLua + callStart + confMemoHead + `
local A = conf(1000, 'a', src('x', 1), src('y', 2))
local A2 = conf(1000, 'a', src('x', 7), src('y', 2))
local B = conf(2000, 'b', src('z', 3))
local bad = {}
local function want(step, s, i, name, conc)
  local ok, p = pcall(op_conf, nil, i)
  if not ok or p.name ~= name or p.max_concurrency ~= conc then
    bad[#bad + 1] = step .. ': source ' .. i .. ' ' .. (ok and (p.name .. '=' .. p.max_concurrency) or tostring(p))
      .. ', want ' .. name .. '=' .. conc
  end
  return p
end
conf_open(A, false); local first = want('A', A, 1, 'x', 1); want('A', A, 2, 'y', 2)
conf_open(A, false); local again = want('A again', A, 1, 'x', 1)
if again ~= first then bad[#bad + 1] = 'A again: its first source read again, not the memo' end
want('A again', A, 2, 'y', 2)
conf_open(A, true, 255); local batched = CONF_SRC[1]
conf_open(A, false); local lone = want('A lone after a batch of A', A, 1, 'x', 1)
if lone ~= first or lone == batched then bad[#bad + 1] = 'A lone after a batch of A: not its own memo (the batch\'s table, or read again)' end
conf_open(A2, false); want('A2', A2, 1, 'x', 7); want('A2', A2, 2, 'y', 2)
conf_open(A, false); want('A after A2', A, 1, 'x', 1)
conf_open(B, false); want('B', B, 1, 'z', 3)
if pcall(op_conf, nil, 2) then bad[#bad + 1] = 'B: a second source did not raise' end
conf_open(A, false); want('A after B, its second first', A, 2, 'y', 2)
if pcall(op_conf, nil, 1) then bad[#bad + 1] = 'A: its first source after its second did not raise' end
conf_open(A, false); want('A after the raise', A, 1, 'x', 1)
local T = conf(1000, 'a', string.sub(src('x', 9), 1, 12))
conf_open(T, false)
if pcall(op_conf, nil, 1) then bad[#bad + 1] = 'a cut first source did not raise' end
conf_open(T, false)
if pcall(op_conf, nil, 1) then bad[#bad + 1] = 'a cut first source again did not raise' end
conf_open(A, false); want('A after a cut one', A, 1, 'x', 1)
conf_open(A, false)
if pcall(op_conf, nil, 1) ~= true then bad[#bad + 1] = 'A: op_conf raised' end
return bad
end)()
`
	for _, b := range evalList(t, c, script) {
		t.Error(b)
	}
}
