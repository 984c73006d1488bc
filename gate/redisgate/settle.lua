-- settle.lua: gate.Backend.Settle (gate.SourceState.Settle, then progress).
--
-- KEYS  1 the scope's progress  2 breaker  3 leases  4 log  5 data
-- ARGV  1 now_ms (0: TIME)  2 idle_ttl_ms  3 channel  4 scope  5 source
--       6 permit  7 epoch  8 probe (0/1)  9 verdict  10 floor_ms
--       11 actual tokens (< 0 keeps the estimate)  12 progress (0/1)
--       13..19 the breaker policy (as in admit.lua)
-- Reply {released, effect, events, breaker view, progress_ms, now_ms}.
local now = now_ms(ARGV[1])
local idle_ttl = tonumber(ARGV[2])
local channel, scope, source = ARGV[3], ARGV[4], ARGV[5]
local o = {
  permit = ARGV[6], epoch = tonumber(ARGV[7]), probe = ARGV[8] == '1', verdict = tonumber(ARGV[9]),
  floor = tonumber(ARGV[10]),
}
local p = policy(13)

local released = q_release(q_keys(3), o.permit, tonumber(ARGV[11]), now)
local b = b_load(KEYS[2])
local effect, evs
if released or o.probe then
  effect, evs = b_settle(b, p, o, now)
else
  effect, evs = b_stale(b, o)
end
b_save(b, idle_ttl)
local events = {}
for _, e in ipairs(evs) do
  events[#events + 1] = ev_reply(1, e)
  announce(channel, scope, source, e)
end
local view = b_view(b, p, now)
local progress = now
if ARGV[12] == '1' then
  redis.call('SET', KEYS[1], I(now), 'PX', I(idle_ttl))
else
  progress = tonumber(redis.call('GET', KEYS[1]) or 0)
end
local rel = 0
if released then
  rel = 1
end
return { rel, effect, events, view, progress, now }
