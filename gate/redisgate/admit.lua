-- admit.lua: gate.Backend.Admit, one walk over the candidates
-- (inmem.Backend.Admit with gate.SourceState.Admit per candidate).
--
-- KEYS[1]        the scope's progress
-- KEYS[2+4(i-1)] candidate i: breaker, leases, log, data
-- ARGV  1 now_ms (0: TIME)  2 idle_ttl_ms  3 channel  4 scope  5 permit
--       6 tokens  7 n, then 13 per candidate i from 8+13(i-1):
--       name, ceiling, max_concurrency, rpm, tpm, lease_ms, and the breaker
--       policy (fail_threshold, min_calls, fail_rate, window_ms, cooldown_ms,
--       max_cooldown_ms, probe_ttl_ms)
-- Reply {granted (candidate index or 0), probe, epoch, rejections, events,
--        progress_ms, now_ms}; a rejection is {candidate, reason, retry_ms}.
local now = now_ms(ARGV[1])
local idle_ttl = tonumber(ARGV[2])
local channel, scope, permit = ARGV[3], ARGV[4], ARGV[5]
local tokens = tonumber(ARGV[6])
local n = tonumber(ARGV[7])

local granted, probe, epoch = 0, 0, 0
local rejections, events = {}, {}
for i = 1, n do
  local a = 8 + 13 * (i - 1)
  local name, ceiling = ARGV[a], tonumber(ARGV[a + 1])
  local l = limits(a + 2)
  local q = q_keys(3 + 4 * (i - 1))
  local reason, wait = q_check(q, l, ceiling, tokens, now)
  if reason ~= R_NONE then
    rejections[#rejections + 1] = { i, reason, wait }
  else
    local b = b_load(KEYS[2 + 4 * (i - 1)])
    local entry, evs = b_enter(b, policy(a + 6), permit, now)
    for _, e in ipairs(evs) do
      events[#events + 1] = ev_reply(i, e)
      announce(channel, scope, name, e)
    end
    if not entry.allowed then
      rejections[#rejections + 1] = { i, entry.reason, entry.wait }
    else
      b_save(b, idle_ttl)
      q_take(q, l, permit, tokens, now)
      granted, epoch = i, entry.epoch
      if entry.probe then
        probe = 1
      end
      break
    end
  end
end
return { granted, probe, epoch, rejections, events, tonumber(redis.call('GET', KEYS[1]) or 0), now }
