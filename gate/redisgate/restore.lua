-- restore.lua: Backend.restore, what a replica still knows of a scope after
-- Redis lost it (a restart without persistence, a failover to an empty
-- replica). The scope's marker (no TTL) tells: the replica passes the value
-- it last saw (seen; "" before its first look). The same value means Redis
-- kept the scope, and nothing is written: a record is never re-asserted
-- into a Redis that kept the scope (an override another replica cleared
-- there, its hash since expired, must not come back). A first look at a
-- marker that exists adopts it. A missing marker (created here from token)
-- or another one than seen (another replica found the loss first) is a
-- loss: each record is written where Redis's breaker says less, that is
-- OPEN where the breaker is CLOSED and never opened since the loss, and the
-- override where there is none. What replicas that did not know did since
-- the loss is kept otherwise.
--
-- keys: RESTORE_KEYS, then n × BRK_KEYS (the breaker of each remembered
-- source).   argv: RESTORE, then n × RESTORE_SRC.   Reply RESTORE_R.
local function restore(keys, argv)
  local a = read(RESTORE, argv, 0)
  local k = read(RESTORE_KEYS, keys, 0)
  local marker = redis.call('GET', k.marker)
  if marker == a.seen or (marker and a.seen == '') then
    return pack(RESTORE_R, { lost = 0, restored = 0, marker = marker })
  end
  if not marker then
    marker = a.token
    redis.call('SET', k.marker, marker)
  end
  local now = now_ms(a.now)
  local restored = 0
  for i = 1, a.n do
    local r = read(RESTORE_SRC, argv, block(RESTORE, RESTORE_SRC, i))
    local b = b_load(read(BRK_KEYS, keys, block(RESTORE_KEYS, BRK_KEYS, i)).brk)
    local wrote = false
    if r.open_left > 0 and b.state == CLOSED and b.reopens == 0 then
      b.bdirty = true -- (see b_keep)
      b.state = OPEN
      b.reopens = r.reopens
      b.epoch = gmax(b.epoch, r.epoch)
      b.open_cause = r.cause
      b.opened_at = now - r.opened_ago
      b.open_until = now + r.open_left
      wrote = true
    end
    if r.override ~= NO_OVERRIDE and b.override == NO_OVERRIDE then
      b.bdirty = true
      b.override = r.override
      b.actor = r.actor
      b.why = r.why
      b.override_at = now - r.override_ago
      wrote = true
    end
    if wrote then
      b_save(b, a.idle_ttl)
      restored = restored + 1
    end
  end
  return pack(RESTORE_R, { lost = 1, restored = restored, marker = marker })
end
