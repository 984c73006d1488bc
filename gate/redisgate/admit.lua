
-- admit.lua: gate.Backend.Admit, one walk over the candidates
-- (inmem.Backend.Admit with gate.SourceState.Admit per candidate).
--
-- keys: SCOPE_KEYS, then SRC_KEYS per candidate, then LINE_KEYS per candidate.
-- argv: ADMIT, then CAND per candidate (n of them), then WAITER, then PLACE
-- per candidate.
-- Reply ADMIT_R: rejections are REJ records, events EV records, the line's
-- places PLACE_R records (each list their concatenation).

-- The scope's marker tells whether this replica's picture of the scope
-- holds: a marker other than the one it last saw (h.seen; "" before its
-- first look, "*" for a scope it keeps no record of) means Redis lost the
-- scope, or this replica has not looked yet. Admit then grants nothing and
-- answers UNMARKED; the replica re-asserts what it knows (restore.lua) and
-- admits again (reassert.go).

-- scope_read is the scope's marker (if marker; false for none) and its
-- progress, in one MGET in a call of its own (get and get_ms in a batch).
local function scope_read(s, marker)
  if CALL or not marker then
    return marker and get(s.marker), get_ms(s.progress)
  end
  local v = redis.call('MGET', s.marker, s.progress)
  return v[1], tonumber(v[2] or 0)
end

-- NO_LINE is the line record of an admit without a waiter, made by the
-- first (struct is missing while the library loads).
local NO_LINE = nil

-- twin: gate.(*SourceState).Admit
-- Its arguments start after argv[ao] (0 in a call of its own; a batch's
-- ops read theirs in place), its keys are found with map (see op_src).
local function admit(keys, argv, ao, map)
  local h = read(ADMIT, argv, ao)
  local s = op_scope(keys, map)
  local marked = h.seen ~= '*'
  local marker, progress = scope_read(s, marked)
  if marked and marker ~= h.seen then
    return redis.error_reply('UNMARKED the scope\'s marker changed: re-assert, then admit again')
  end
  local now = now_ms(h.now)
  local wbase = ao + block(ADMIT, CAND, h.n + 1)
  local w = on_block(WAITER, argv, wbase)
  -- With a waiter: its line of candidate i, its place there, whether the
  -- line was empty and it had none (it is not in line after the walk
  -- either: l_after is skipped), the candidates the walk reached and why
  -- they refused.
  local lines, nobody, reached, refused, line
  if w then
    lines, nobody, reached, refused = {}, {}, {}, {}
    line = function(i)
      if lines[i] == nil then
        lines[i] = op_line(keys, map, h.n, i)
      end
      w.place = read(PLACE, argv, wbase + WAITER.WIDTH + PLACE.WIDTH * (i - 1)).place
      return lines[i]
    end
  end
  local granted, probe, epoch = 0, 0, 0
  local rejections, events = '', ''
  for i = 1, h.n do
    local c = read(CAND, argv, ao + block(ADMIT, CAND, i))
    local q = op_src(keys, map, i)
    local passed = true
    if w then
      reached[i] = true
      passed, nobody[i] = l_check(line(i), w, now)
    end
    local reason, wait, b = R_QUEUED, 0, nil
    if passed then
      b = b_load(q.state, false, h.permit)
      reason, wait = q_check(q, b, c, c.ceiling, h.tokens, now)
    end
    if reason == R_NONE then
      local allowed, entry_probe, entry_epoch, evs
      allowed, entry_probe, entry_epoch, reason, wait, evs = b_enter(b, c, h.permit, now)
      for _, e in ipairs(evs) do
        events = events .. ev_reply(i, e)
        announce(h.channel, h.scope, c.name, e)
      end
      if allowed then
        q_take(q, b, c, h.permit, h.tokens, now)
        b_save(b, h.idle_ttl, now)
        granted, epoch = i, entry_epoch
        if entry_probe then
          probe = 1
        end
        break
      end
    end
    rejections = rejections .. pack(REJ, { src = i, reason = reason, retry = wait })
    if w then
      refused[i] = reason
    end
  end
  -- inmem's after: a grant leaves every line, a refusal for capacity keeps
  -- the source's place, a breaker's refusal leaves the source's line. A
  -- candidate the walk did not reach is asked only when w has a place there.
  if not NO_LINE then
    NO_LINE = pack(LINE_ADMIT_R, { places = '' })
  end
  local places = NO_LINE
  if w then
    places = ''
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
    places = pack(LINE_ADMIT_R, { places = places })
  end
  return pack(ADMIT_R, {
    granted = granted, probe = probe, epoch = epoch, rejections = rejections, events = events,
    progress = progress, now = now, line = places,
  })
end
