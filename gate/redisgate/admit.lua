
-- admit.lua: gate.Backend.Admit, one walk over the candidates
-- (inmem.Backend.Admit with gate.SourceState.Admit per candidate).
--
-- keys: SCOPE_KEYS, then SRC_KEYS per candidate, then LINE_KEYS.
-- argv: ADMIT, then CAND per candidate (n of them), then WAITER.
-- Reply ADMIT_R: rejections are REJ records, events EV records.

-- unmarked: the scope's marker is not the one this replica last saw (h.seen;
-- "" before its first look, "*" for a scope it keeps no record of): Redis
-- lost the scope, or this replica has not looked yet. Admit then grants
-- nothing and answers UNMARKED; the replica re-asserts what it knows
-- (restore.lua) and admits again (reassert.go).
local function unmarked(s, h)
  return h.seen ~= '*' and redis.call('GET', s.marker) ~= h.seen
end

-- twin: gate.(*SourceState).Admit
local function admit(keys, argv)
  local h = read(ADMIT, argv, 0)
  local s = read(SCOPE_KEYS, keys, 0)
  if unmarked(s, h) then
    return redis.error_reply('UNMARKED the scope\'s marker changed: re-assert, then admit again')
  end
  local now = now_ms(h.now)
  local lk, w = line_of(keys, h.n, argv, ADMIT, CAND, h.n, WAITER)
  local passed, nobody
  if w then
    passed, nobody = l_check(lk, w, now)
    if not passed then
      return admit_queued(keys, lk, w, now)
    end
  end
  local granted, probe, epoch = 0, 0, 0
  local rejections, events = {}, {}
  for i = 1, h.n do
    local c = read(CAND, argv, block(ADMIT, CAND, i))
    local q = src_keys(keys, SCOPE_KEYS, i)
    local b = b_load(q.state, false, h.permit)
    local reason, wait = q_check(q, b, c, c.ceiling, h.tokens, now)
    if reason ~= R_NONE then
      rejections[#rejections + 1] = pack(REJ, { src = i, reason = reason, retry = wait })
    else
      local entry, evs = b_enter(b, c, h.permit, now)
      for _, e in ipairs(evs) do
        events[#events + 1] = ev_reply(i, e)
        announce(h.channel, h.scope, c.name, e)
      end
      if not entry.allowed then
        rejections[#rejections + 1] = pack(REJ, { src = i, reason = entry.reason, retry = entry.wait })
      else
        q_take(q, b, c, h.permit, h.tokens, now)
        b_save(b, h.idle_ttl, now)
        granted, epoch = i, entry.epoch
        if entry.probe then
          probe = 1
        end
        break
      end
    end
  end
  local line = { queued = 0, place = '' }
  if w and not nobody then
    line.place = l_after(lk, w, granted ~= 0, l_capacity(rejections))
  end
  return pack(ADMIT_R, {
    granted = granted, probe = probe, epoch = epoch, rejections = rejections, events = events,
    progress = tonumber(redis.call('GET', s.progress) or 0), now = now, line = pack(LINE_ADMIT_R, line),
  })
end
