
-- admit.lua: gate.Backend.Admit, one walk over the candidates
-- (inmem.Backend.Admit with gate.SourceState.Admit per candidate).
--
-- keys: SCOPE_KEYS, then SRC_KEYS per candidate, then LINE_KEYS per candidate.
-- argv: ADMIT, then CAND per candidate (n of them), then WAITER, then PLACE
-- per candidate.
-- Reply ADMIT_R: rejections are REJ records, events EV records.

-- unmarked: the scope's marker is not the one this replica last saw (h.seen;
-- "" before its first look, "*" for a scope it keeps no record of): Redis
-- lost the scope, or this replica has not looked yet. Admit then grants
-- nothing and answers UNMARKED; the replica re-asserts what it knows
-- (restore.lua) and admits again (reassert.go).
local function unmarked(s, h)
  return h.seen ~= '*' and get(s.marker) ~= h.seen
end

-- twin: gate.(*SourceState).Admit
local function admit(keys, argv)
  local h = read(ADMIT, argv, 0)
  local s = read(SCOPE_KEYS, keys, 0)
  if unmarked(s, h) then
    return redis.error_reply('UNMARKED the scope\'s marker changed: re-assert, then admit again')
  end
  local now = now_ms(h.now)
  local _, w = line_of(keys, h.n, 1, argv, ADMIT, CAND, h.n, WAITER)
  -- The waiter's line of candidate i, its place there, and whether the
  -- line was empty and it had none (it is not in line after the walk
  -- either: l_after is skipped).
  local lines, nobody, reached = {}, {}, {}
  local function line(i)
    if lines[i] == nil then
      lines[i] = line_of(keys, h.n, i, argv, ADMIT, CAND, h.n, WAITER)
    end
    w.place = read(PLACE, argv, ADMIT.WIDTH + CAND.WIDTH * h.n + WAITER.WIDTH + PLACE.WIDTH * (i - 1)).place
    return lines[i]
  end
  local granted, probe, epoch = 0, 0, 0
  local rejections, events, refused = {}, {}, {}
  for i = 1, h.n do
    local c = read(CAND, argv, block(ADMIT, CAND, i))
    local q = src_keys(keys, SCOPE_KEYS, i)
    local passed = true
    reached[i] = true
    if w then
      passed, nobody[i] = l_check(line(i), w, now)
    end
    local reason, wait, b = R_QUEUED, 0, nil
    if passed then
      b = b_load(q.state, false, h.permit)
      reason, wait = q_check(q, b, c, c.ceiling, h.tokens, now)
    end
    if reason ~= R_NONE then
      rejections[#rejections + 1] = pack(REJ, { src = i, reason = reason, retry = wait })
      refused[i] = reason
    else
      local entry, evs = b_enter(b, c, h.permit, now)
      for _, e in ipairs(evs) do
        events[#events + 1] = ev_reply(i, e)
        announce(h.channel, h.scope, c.name, e)
      end
      if not entry.allowed then
        rejections[#rejections + 1] = pack(REJ, { src = i, reason = entry.reason, retry = entry.wait })
        refused[i] = entry.reason
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
  -- inmem's after: a grant leaves every line, a refusal for capacity keeps
  -- the source's place, a breaker's refusal leaves the source's line. A
  -- candidate the walk did not reach is asked only when w has a place there.
  local places = {}
  if w then
    for i = 1, h.n do
      places[i] = ''
      local k = not nobody[i] and line(i)
      if k and (reached[i] or w.place ~= '') then
        if granted ~= 0 and granted ~= i then
          local e = l_entry(k, w.waiter)
          if e then
            l_remove(k, e)
          end
        else
          places[i] = l_after(k, w, granted == i, l_capacity(refused[i]))
        end
      end
    end
  end
  return pack(ADMIT_R, {
    granted = granted, probe = probe, epoch = epoch, rejections = rejections, events = events,
    progress = tonumber(get(s.progress) or 0), now = now, line = pack(LINE_ADMIT_R, { places = places }),
  })
end
