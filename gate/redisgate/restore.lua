-- restore.lua: Backend.reassert, what a replica still knows of a scope after
-- Redis lost it (a restart without persistence, a failover to an empty
-- replica). It writes only when the scope's marker is missing (Redis lost
-- the scope, or never had it), and only where Redis has no breaker: a hash
-- that exists is Redis's own, newer word. A record is never re-asserted into
-- a Redis that kept the scope (an override another replica cleared there,
-- its hash since expired, must not come back).
--
-- KEYS  1 the scope's marker (no TTL: it is missing only if Redis lost the
--       scope), then the breaker of each remembered source
-- ARGV  1 now_ms (0: TIME)  2 idle_ttl_ms  3 n, then 8 per source i from
--       4+8(i-1): open_left_ms (0: not OPEN), reopens, epoch, opened_ago_ms,
--       override, actor, why, override_ago_ms
-- Reply {marker was missing (0/1), breakers restored}.
local now = now_ms(ARGV[1])
local idle_ttl = tonumber(ARGV[2])
if not redis.call('SET', KEYS[1], I(now), 'NX') then
  return { 0, 0 }
end
local restored = 0
for i = 1, tonumber(ARGV[3]) do
  local a = 4 + 8 * (i - 1)
  local key = KEYS[1 + i]
  if redis.call('EXISTS', key) == 0 then
    local b = b_load(key)
    local left = tonumber(ARGV[a])
    if left > 0 then
      b.state = OPEN
      b.reopens = tonumber(ARGV[a + 1])
      b.epoch = tonumber(ARGV[a + 2])
      b.opened_at = now - tonumber(ARGV[a + 3])
      b.open_until = now + left
    end
    local ov = tonumber(ARGV[a + 4])
    if ov ~= NO_OVERRIDE then
      b.override = ov
      b.actor = ARGV[a + 5]
      b.why = ARGV[a + 6]
      b.override_at = now - tonumber(ARGV[a + 7])
    end
    b_save(b, idle_ttl)
    restored = restored + 1
  end
end
return { 1, restored }
