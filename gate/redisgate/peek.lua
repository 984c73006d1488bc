-- peek.lua: gate.Backend.Peek; it writes nothing.
--
-- KEYS[1]        the scope's progress
-- KEYS[2+4(i-1)] source i: breaker, leases, log, data
-- ARGV  1 now_ms (0: TIME)  2 n, then window_ms of source i at 2+i
-- Reply {progress_ms, now_ms, {breaker view, quota view} per source}.
local now = now_ms(ARGV[1])
local n = tonumber(ARGV[2])
local out = {}
for i = 1, n do
  local k = 2 + 4 * (i - 1)
  local b = b_load(KEYS[k])
  out[i] = { b_view(b, { window = tonumber(ARGV[2 + i]) }, now), q_view(q_keys(k + 1), now) }
end
return { tonumber(redis.call('GET', KEYS[1]) or 0), now, out }
