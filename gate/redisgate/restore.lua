-- restore.lua: Backend.reassert, what a replica still knows of a scope after
-- Redis lost it (a restart without persistence, a failover to an empty
-- replica). It writes only when the scope's marker is missing (Redis lost
-- the scope, or never had it), and only where Redis has no breaker: a hash
-- that exists is Redis's own, newer word. A record is never re-asserted into
-- a Redis that kept the scope (an override another replica cleared there,
-- its hash since expired, must not come back).
--
-- keys: RESTORE_KEYS, then n × BRK_KEYS (the breaker of each remembered
-- source).   argv: RESTORE, then n × RESTORE_SRC.   Reply RESTORE_R.
local function restore(keys, argv)
  local a = read(RESTORE, argv, 0)
  local k = read(RESTORE_KEYS, keys, 0)
  local now = now_ms(a.now)
  if not redis.call('SET', k.marker, I(now), 'NX') then
    return pack(RESTORE_R, { lost = 0, restored = 0 })
  end
  local restored = 0
  for i = 1, a.n do
    local r = read(RESTORE_SRC, argv, block(RESTORE, RESTORE_SRC, i))
    local key = read(BRK_KEYS, keys, block(RESTORE_KEYS, BRK_KEYS, i)).brk
    if redis.call('EXISTS', key) == 0 then
      local b = b_load(key)
      if r.open_left > 0 then
        b.state = OPEN
        b.reopens = r.reopens
        b.epoch = r.epoch
        b.opened_at = now - r.opened_ago
        b.open_until = now + r.open_left
      end
      if r.override ~= NO_OVERRIDE then
        b.override = r.override
        b.actor = r.actor
        b.why = r.why
        b.override_at = now - r.override_ago
      end
      b_save(b, a.idle_ttl)
      restored = restored + 1
    end
  end
  return pack(RESTORE_R, { lost = 1, restored = restored })
end
