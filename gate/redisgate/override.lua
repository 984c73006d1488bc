-- override.lua: gate.Backend.Override (gate.Breaker.Apply, then a view).
--
-- KEYS  1 breaker  2 leases  3 log  4 data
-- ARGV  1 now_ms (0: TIME)  2 idle_ttl_ms  3 channel  4 scope  5 source
--       6 action  7 actor  8 why  9 window_ms
-- Reply {events, breaker view, quota view, now_ms}.
local now = now_ms(ARGV[1])
local idle_ttl = tonumber(ARGV[2])
local channel, scope, source = ARGV[3], ARGV[4], ARGV[5]
local b = b_load(KEYS[1])
local evs = b_apply(b, tonumber(ARGV[6]), ARGV[7], ARGV[8], now)
if evs == nil then
  return redis.error_reply('redisgate: unknown breaker action ' .. ARGV[6])
end
b_save(b, idle_ttl)
local events = {}
for _, e in ipairs(evs) do
  events[#events + 1] = ev_reply(1, e)
  announce(channel, scope, source, e)
end
return { events, b_view(b, { window = tonumber(ARGV[9]) }, now), q_view(q_keys(2), now), now }
