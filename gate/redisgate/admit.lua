
-- admit.lua: gate.Backend.Admit, one walk over the candidates
-- (inmem.Backend.Admit with gate.SourceState.Admit per candidate).
--
-- keys: SCOPE_KEYS, then SRC_KEYS per candidate, then LINE_KEYS per candidate.
-- argv: ADMIT, then CAND per candidate (n of them), then WAITER, then PLACE
-- per candidate.
-- Reply ADMIT_R: rejections are REJ records, events EV records, the line's
-- places PLACE_R records (each list their concatenation).

-- unmarked: the scope's marker is not the one this replica last saw (h.seen;
-- "" before its first look, "*" for a scope it keeps no record of): Redis
-- lost the scope, or this replica has not looked yet. Admit then grants
-- nothing and answers UNMARKED; the replica re-asserts what it knows
-- (restore.lua) and admits again (reassert.go).
local function unmarked(s, h)
  return h.seen ~= '*' and get(s.marker) ~= h.seen
end

-- twin: gate.(*SourceState).Admit
-- Its arguments start after argv[ao] (0 in a call of its own; a batch's
-- ops read theirs in place), its keys are found with map (see op_src).
local function admit(keys, argv, ao, map)
  local h = read(ADMIT, argv, ao)
  local s = op_scope(keys, map)
  if unmarked(s, h) then
    return redis.error_reply('UNMARKED the scope\'s marker changed: re-assert, then admit again')
  end
  local now = now_ms(h.now)
  local wbase = ao + block(ADMIT, CAND, h.n + 1)
  local w = on_block(WAITER, argv, wbase)
  -- The waiter's line of candidate i, its place there, and whether the
  -- line was empty and it had none (it is not in line after the walk
  -- either: l_after is skipped).
  local lines, nobody, reached = {}, {}, {}
  local function line(i)
    if lines[i] == nil then
      lines[i] = op_line(keys, map, h.n, i)
    end
    w.place = read(PLACE, argv, wbase + WAITER.WIDTH + PLACE.WIDTH * (i - 1)).place
    return lines[i]
  end
  local granted, probe, epoch = 0, 0, 0
  local rejections, events, refused = '', '', {}
  for i = 1, h.n do
    local c = read(CAND, argv, ao + block(ADMIT, CAND, i))
    local q = op_src(keys, map, i)
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
      rejections = rejections .. pack(REJ, { src = i, reason = reason, retry = wait })
      refused[i] = reason
    else
      local allowed, entry_probe, entry_epoch, entry_reason, entry_wait, evs = b_enter(b, c, h.permit, now)
      for _, e in ipairs(evs) do
        events = events .. ev_reply(i, e)
        announce(h.channel, h.scope, c.name, e)
      end
      if not allowed then
        rejections = rejections .. pack(REJ, { src = i, reason = entry_reason, retry = entry_wait })
        refused[i] = entry_reason
      else
        q_take(q, b, c, h.permit, h.tokens, now)
        b_save(b, h.idle_ttl, now)
        granted, epoch = i, entry_epoch
        if entry_probe then
          probe = 1
        end
        break
      end
    end
  end
  -- inmem's after: a grant leaves every line, a refusal for capacity keeps
  -- the source's place, a breaker's refusal leaves the source's line. A
  -- candidate the walk did not reach is asked only when w has a place there.
  local places = ''
  if w then
    for i = 1, h.n do
      local place = ''
      local k = not nobody[i] and line(i)
      if k and (reached[i] or w.place ~= '') then
        if granted ~= 0 and granted ~= i then
          local e = l_entry(k, w.waiter)
          if e then
            l_remove(k, e)
          end
        else
          place = l_after(k, w, granted == i, l_capacity(refused[i]))
        end
      end
      places = places .. pack(PLACE_R, { place = place })
    end
  end
  return pack(ADMIT_R, {
    granted = granted, probe = probe, epoch = epoch, rejections = rejections, events = events,
    progress = get_ms(s.progress), now = now, line = pack(LINE_ADMIT_R, { places = places }),
  })
end
