
-- override.lua: gate.Backend.Override (gate.Breaker.Apply, then a view).
--
-- keys: SRC_KEYS.   argv: OVERRIDE.   Reply OVERRIDE_R.
local function override(keys, argv)
  local a = read(OVERRIDE, argv, 0)
  local now = now_ms(a.now)
  local q = read(SRC_KEYS, keys, 0)
  local b = b_load(q.state, true)
  local evs = b_apply(b, a.action, a.actor, a.why, now)
  if evs == nil then
    return redis.error_reply('redisgate: unknown breaker action ' .. I(a.action))
  end
  b_save(b, a.idle_ttl, now)
  local events = ''
  for _, e in ipairs(evs) do
    events = events .. ev_reply(1, e)
    announce(a.channel, a.scope, a.source, e)
  end
  return pack(OVERRIDE_R, { events = events, breaker = b_stored(b), window = b.win, quota = q_view(q, b, now), now = now })
end
