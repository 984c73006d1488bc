
-- settle.lua: gate.Backend.Settle (gate.SourceState.Settle, then progress).
--
-- keys: SCOPE_KEYS, SRC_KEYS, the source's LINE_KEYS.   argv: SETTLE, HANDOFF.   Reply SETTLE_R.
-- twin: gate.(*SourceState).Settle
local function settle(keys, argv)
  local a = read(SETTLE, argv, 0)
  local now = now_ms(a.now)
  local s = read(SCOPE_KEYS, keys, 0)
  local q = src_keys(keys, SCOPE_KEYS, 1)
  local o = { permit = a.permit, epoch = a.epoch, probe = a.probe == 1, verdict = a.verdict, floor = a.floor }

  local b = b_load(q.state, true, a.permit)
  local released = q_release(q, b, o.permit, a.actual, now)
  local effect, evs
  if released or o.probe then
    effect, evs = b_settle(b, a, o, now)
  else
    effect, evs = b_stale(b, o)
  end
  b_save(b, a.idle_ttl, now)
  local events = {}
  for _, e in ipairs(evs) do
    events[#events + 1] = ev_reply(1, e)
    announce(a.channel, a.scope, a.source, e)
  end
  local view = b_view(b, a, now)
  local progress = now
  if a.progress == 1 then
    set_px(s.progress, I(now), I(a.idle_ttl))
  else
    progress = tonumber(get(s.progress) or 0)
  end
  local rel, handoff = 0, ''
  if released then
    rel = 1
    local lk, h = line_of(keys, 1, 1, argv, SETTLE, SETTLE, 0, HANDOFF)
    if h then
      handoff = l_handoff(lk, h, now)
    end
  end
  return pack(SETTLE_R, {
    released = rel, effect = effect, events = events, view = view, progress = progress, now = now,
    handoff = handoff,
  })
end
