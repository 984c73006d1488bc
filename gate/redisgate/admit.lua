
-- admit.lua: gate.Backend.Admit, one walk over the candidates
-- (inmem.Backend.Admit with gate.SourceState.Admit per candidate).
--
-- keys: SCOPE_KEYS, then SRC_KEYS per candidate, then LINE_KEYS per candidate.
-- argv: one (opArg): the blocks ADMIT, then CAND per candidate (n of them),
-- then WAITER, then PLACE per candidate; then, in a call of its own, the
-- CONF argument (CONF_H, then SRC_CONF per candidate: see op_conf).
-- Reply ADMIT_R: rejections are REJ records, events EV records, the line's
-- places PLACE_R records, one per candidate, or none when the waiter has no
-- place (each list their concatenation).

-- The scope's marker tells whether this replica's picture of the scope
-- holds: a marker other than the one it last saw (ADMIT's seen; "" before its
-- first look, "*" for a scope it keeps no record of) means Redis lost the
-- scope, or this replica has not looked yet. Admit then grants nothing and
-- answers UNMARKED; the replica re-asserts what it knows (restore.lua) and
-- admits again (reassert.go).

-- scope_read is the scope's marker (if marker; false for none) and its
-- progress, in one MGET when neither was read yet (in a batch: kept in
-- CALL.got, as get and get_ms keep them).
local function scope_read(s, marker)
  local got = CALL and CALL.got
  if got then -- both read (by an op before): as get and get_ms answer
    local m, progress = got[s.marker], got[s.progress]
    if type(progress) == 'number' and (not marker or m ~= nil) then
      return marker and m, progress
    end
  end
  if not marker or (CALL and (CALL.got[s.marker] ~= nil or CALL.got[s.progress] ~= nil)) then
    return marker and get(s.marker), get_ms(s.progress)
  end
  local v = redis.call('MGET', s.marker, s.progress)
  local progress = tonumber(v[2] or 0)
  if CALL then
    CALL.got[s.marker], CALL.got[s.progress] = v[1], progress
  end
  return v[1], progress
end

-- NO_LINE is the line record of an admit without a waiter, made by the
-- first (struct is missing while the library loads).
local NO_LINE = nil

-- place_at is the waiter's place in candidate i's line (its PLACE block,
-- the op's block n + 2 + i: after ADMIT, the n CANDs and WAITER).
local function place_at(args, p0, n, i)
  return PLACE.one_at(args, op_block(args, p0, n + 2 + i))
end

-- waiter_at is the waiter (w, its WAITER block read once, at wpos) with
-- place p: its place in the line at hand.
local function waiter_at(w, args, wpos, p)
  if not w then
    w = WAITER.read_at(args, wpos)
  end
  w.place = p
  return w
end

-- twin: gate.(*SourceState).Admit
-- Its argument is argv[ao + 1] (ao 0 in a call of its own), from position
-- p0 (1 in a call of its own; in a batch, after its BATCH_OP block); its
-- keys are found with map (see op_src), its sources' SRC_CONF blocks with
-- cmap (see op_conf); a batch passes the argument too (args). In a batch
-- its sources' keys (bsrc), the scope's, the time and the sources'
-- configurations are the batch's tables, looked up here rather than
-- through op_src, op_scope, now_ms and op_conf (a Lua call each: the
-- dispatch's cost per op, docs/performance.md); those remain for a call of
-- its own and, for op_conf, for a cmap out of range (its error).
local function admit(keys, argv, ao, map, p0, cmap, args)
  args = args or op_arg(argv, ao)
  if not map then
    conf_open(op_arg(argv, ao + 1), false)
  end
  local sc, bsrc = CONF_H.T, map and CALL.src
  p0 = p0 or 1
  -- The position table (op_block's): one candidate's four positions
  -- (ADMIT, CAND, WAITER, PLACE) in one read where the argument has room
  -- for them, else the first alone (what op_block reads, raising as it).
  local q1, q2, q3, q4
  if #args >= p0 + 15 then
    q1, q2, q3, q4 = S_UNPACK('<I4I4I4I4', args, p0)
  else
    q1 = S_UNPACK('<I4', args, p0)
  end
  -- ADMIT's fields as locals (not into ADMIT.T: a table's writes and reads
  -- cost more than the registers); the CANDs follow it, at cpos.
  local at = p0 + q1
  local hnow, permit, tokens, n, seen, cpos = S_UNPACK(ADMIT.FMT, args, at)
  if q1 ~= 8 * n + 8 then
    op_check(at, p0, 2 * n + 2) -- ADMIT, the CANDs, WAITER, the PLACEs: raises
  end
  local s = map and CALL.scope or op_scope(keys, map)
  local marked = seen ~= '*'
  local marker, progress
  if map and CALL.scoped then
    -- scope_read's first case without its call: both read by an op before
    -- (CALL.scoped, set below), they stay in CALL.got (the marker as read,
    -- the progress a number) for the batch.
    marker, progress = CALL.got[s.marker], CALL.got[s.progress]
  else
    marker, progress = scope_read(s, marked)
    if map and marked then
      CALL.scoped = true
    end
  end
  if marked and marker ~= seen then
    return redis.error_reply('UNMARKED the scope\'s marker changed: re-assert, then admit again')
  end
  local now = map and hnow == 0 and CALL.now or now_ms(hnow)
  -- WAITER's position (wpos), and with one candidate its PLACE's (ppos),
  -- read above (op_check counted them). With one candidate whose WAITER
  -- follows its CAND, the ceiling and WAITER's on in one read (ceil; it
  -- raises where WAITER.on_at would).
  local wpos, ppos, ceil, waits
  if n == 1 then
    wpos, ppos = p0 + q3, p0 + q4
  else
    wpos = op_block(args, p0, n + 2)
  end
  if n == 1 and cpos + 8 == wpos then
    ceil, waits = S_UNPACK('<dd', args, cpos)
    waits = waits == 1
  else
    waits = WAITER.on_at(args, wpos)
  end
  -- (A batch's ops first try the early exit, admit_run: those it does
  -- not take walk here. BATCH_RUNS.admit_first repeats the reads above,
  -- in their order, before its b_load: change both.)
  -- With a waiter, walk[i] is what the walk found at candidate i: nil not
  -- reached, false the line empty and no place there (the waiter is not in
  -- line after the walk either: l_after is skipped), true reached and not
  -- refused, else the reason it refused. The waiter's block is read (w, see
  -- waiter_at) only for a line it has a place in or that is not empty: the
  -- sidecar's common case, an empty line and no place, reads none of it.
  local w, walk = nil, waits and {}
  local granted, probe, epoch = 0, 0, 0
  local rejections, events = '', ''
  for i = 1, n do
    local ceiling
    ceiling, cpos = S_UNPACK(CAND.FMT, args, cpos)
    local c = cmap and CONF_SRC[string.byte(cmap, i)] or op_conf(cmap, i)
    local q = map and bsrc[string.byte(map, i)].q or op_src(keys, nil, i)
    local passed = true
    if waits then
      walk[i] = true
      local k, p = map and bsrc[string.byte(map, i)].l or op_line(keys, nil, n, i), place_at(args, p0, n, i)
      if p == '' and l_empty(k) then
        walk[i] = false -- l_check's first test, before w is read
      else
        w = waiter_at(w, args, wpos, p)
        local nobody
        passed, nobody = l_check(k, w, now)
        if nobody then
          walk[i] = false
        end
      end
    end
    local reason, wait, b = R_QUEUED, 0, nil
    if passed then
      b = b_load(q.state, false, permit)
      reason, wait = q_check(q, b, c, ceiling, tokens, now)
    end
    if reason == R_NONE then
      local allowed, entry_probe, entry_epoch, evs
      allowed, entry_probe, entry_epoch, reason, wait, evs = b_enter(b, c, permit, now)
      if evs ~= NO_EVENTS then
        for _, e in ipairs(evs) do
          events = events .. ev_reply(i, e)
          announce(sc.channel, sc.scope, c.name, e)
        end
      end
      if allowed then
        q_take(q, b, c, permit, tokens, now)
        b_save(b, sc.idle_ttl, now)
        granted, epoch = i, entry_epoch
        if entry_probe then
          probe = 1
        end
        break
      end
    end
    rejections = rejections .. pack(REJ, { src = i, reason = reason, retry = wait })
    if waits and walk[i] then
      walk[i] = reason
    end
  end
  -- inmem's after: a grant leaves every line, a refusal for capacity keeps
  -- the source's place, a breaker's refusal leaves the source's line. A
  -- candidate the walk did not reach is asked only when w has a place there.
  -- The reply lists a place per candidate, or none when it has no place.
  if not NO_LINE then
    NO_LINE = pack(LINE_ADMIT_R, { places = '' })
  end
  local places = NO_LINE
  if waits then
    local kept = nil -- candidate -> its place, where not ''
    for i = 1, n do
      local p = walk[i] ~= false and place_at(args, p0, n, i)
      if p and (walk[i] ~= nil or p ~= '') then
        local k = map and bsrc[string.byte(map, i)].l or op_line(keys, nil, n, i)
        w = waiter_at(w, args, wpos, p)
        if granted ~= 0 and granted ~= i then
          local e = l_entry(k, w.waiter)
          if e then
            l_remove(k, e)
          end
        else
          p = l_after(k, w, granted == i, l_capacity(walk[i])) -- (true: not refused)
          if p ~= '' then
            kept = kept or {}
            kept[i] = p
          end
        end
      end
    end
    if kept then
      places = ''
      for i = 1, n do
        places = places .. pack(PLACE_R, { place = kept[i] or '' })
      end
      places = pack(LINE_ADMIT_R, { places = places })
    end
  end
  -- ADMIT_R's granted, probe, epoch, rejections, events, progress, now, line
  return ADMIT_R.pack_memo(granted, probe, epoch, rejections, events, progress, now, places)
end

-- BATCH_RUNS.admit_first is an admit run's first load of its source's
-- state hash (bs.q.state; b_first: its cache entry and breaker), settle's
-- BATCH_RUNS.first for an admit: only where the walk of the op (args, from
-- p0) would load it, after the reads that come before its b_load there,
-- each as admit_run reads it (the head of one candidate, the scope's marker
-- and progress, the ceiling and waiter's flag, the line's test); nil where
-- the walk would not load it (the op raises, answers UNMARKED, or tests
-- its line first): admit_run then walks, as before.
BATCH_RUNS.admit_first = function(bs, args, p0)
  local key = bs.q.state
  local pre = CALL.pre[key]
  if not pre or #args < p0 + 15 then
    return nil, nil
  end
  local q1, _, q3, q4 = S_UNPACK('<I4I4I4I4', args, p0)
  local _, _, _, nc, seen, cpos = S_UNPACK(ADMIT.FMT, args, p0 + q1)
  if nc ~= 1 or q1 ~= 16 or cpos + 8 ~= p0 + q3 then
    return nil, nil
  end
  local marked = seen ~= '*'
  if not CALL.scoped then -- (admit_run's)
    local marker = scope_read(CALL.scope, marked)
    if marked then
      CALL.scoped = true
    end
    if marked and marker ~= seen then
      return nil, nil
    end
  elseif marked and CALL.got[CALL.scope.marker] ~= seen then
    return nil, nil
  end
  local _, waits = S_UNPACK('<dd', args, cpos)
  local l = bs.l
  if waits == 1 and (S_UNPACK(PLACE.FMT, args, p0 + q4) ~= '' or not (l.empty or l_empty(l))) then
    return nil, nil
  end
  b_first(key, pre)
  local hc = CALL.h[key]
  return hc, hc.b
end

-- BATCH_RUNS[OP_ADMIT] (admit_run) is batch_ops's for an admit, the i-th op (as settle_run's), and
-- the admits that follow it with the same map and cmap: what they share is
-- looked up once (the source's keys, its cache entry and breaker, its
-- configuration), each op reads only its own fields. The walk's early exit
-- for the common op of a batch (docs/performance.md, seventh session): one
-- candidate, its state hash cached with the permit's lease field (b_first
-- read it), its breaker CLOSED without an override (a run's exits change
-- neither), no lease ended to sweep, no minute's log (no RPM, no TPM), a
-- slot free below the ceiling, and no place in its line with the line
-- empty (or no waiter). It grants as the walk would, with the walk's steps
-- for this case in their order (b_load's b_cached, q_check, b_enter,
-- q_take) but not their calls; the first op that does not take it walks
-- (admit) and ends the run, nothing changed. Each op's own reads are
-- admit's, in its order, before it changes anything: an op that raises
-- raises as admit would (st[1] names it).
BATCH_RUNS[OP_ADMIT] = function(keys, argv, ao, i, n, out, st, args, map, cmap, p0) -- admit_run
  local j, cj, bs, hc, b, c = BATCH_RUNS.src(map, cmap)
  if not hc and c and bs and c.rpm == 0 and c.tpm == 0 then
    -- The source's state hash not loaded yet (the batch's first op of its
    -- source, e.g. a batch of admits alone):
    -- loaded as the walk's b_load would, so that the run starts here.
    hc, b = BATCH_RUNS.admit_first(bs, args, p0)
  end
  if c and b and b.state == CLOSED and b.override == NO_OVERRIDE and c.rpm == 0 and c.tpm == 0 then
    local s, got, idle_ttl, cnow, f, dirty = CALL.scope, CALL.got, CONF_H.T.idle_ttl, CALL.now, hc.f, hc.dirty
    local maxc, clease, l = c.max_concurrency, c.lease, bs.l
    if not NO_LINE then
      NO_LINE = pack(LINE_ADMIT_R, { places = '' })
    end
    local r, rnow, rprog = nil, nil, nil -- the last reply, its now and progress
    while #args >= p0 + 15 do -- (else admit reads the first position alone, raising as op_block)
      -- The position table (admit's): ADMIT, CAND, WAITER, PLACE.
      local q1, _, q3, q4 = S_UNPACK('<I4I4I4I4', args, p0)
      local at = p0 + q1
      local hnow, permit, tokens, nc, seen, cpos = S_UNPACK(ADMIT.FMT, args, at)
      if nc ~= 1 or q1 ~= 16 or cpos + 8 ~= p0 + q3 then
        break -- (admit raises, op_check, or walks)
      end
      local marked = seen ~= '*'
      local marker, progress
      if CALL.scoped then -- (admit's)
        marker, progress = got[s.marker], got[s.progress]
      else
        marker, progress = scope_read(s, marked)
        if marked then
          CALL.scoped = true
        end
      end
      if marked and marker ~= seen then
        break -- (admit answers UNMARKED)
      end
      local now = hnow == 0 and cnow or now_ms(hnow)
      local ceil, waits = S_UNPACK('<dd', args, cpos)
      local field = LEASE .. permit
      local lease = f[field] -- (nil: not read, false: none)
      local held = b.held
      if lease == nil or held > 0 and now >= b.lease_min or not (held < maxc and (ceil >= maxc or held < ceil))
        or waits == 1 and (S_UNPACK(PLACE.FMT, args, p0 + q4) ~= '' or not (l.empty or l_empty(l))) then
        break
      end
      local e = now + clease
      b.lease_of, b.lease_f, b.lease_v = lease or true, false, false
      if not lease then
        held = held + 1
        b.held = held
      end
      if held == 1 or e < b.lease_min then
        b.lease_min = e
      end
      -- b_save for this case (CLOSED, no override, the batch's cache hc:
      -- c.b == b) without its tests, the lease written straight into the
      -- cache.
      f[field], dirty[field] = S_PACK('<d', e), true
      b_keep(hc, now, idle_ttl)
      -- ADMIT_R's granted, probe, epoch, rejections, events, progress, now, line
      -- (the op before's where now and progress are the same: a run's
      -- exits change no epoch)
      if now ~= rnow or progress ~= rprog then
        r, rnow, rprog = ADMIT_R.pack_memo(1, 0, b.epoch, '', '', progress, now, NO_LINE), now, progress
      end
      out[i] = r
      -- the next op, while it is an admit of the same map and cmap
      st[1], i, ao = 0, i + 1, ao + 1
      if i > n then
        return i
      end
      local nx = ao + 1
      args = argv[nx]
      if #args < 18 then
        return i -- (batch_ops reads its head, or raises)
      end
      -- (settle_run's, repeated: one function for both costs a Lua call per op,
      -- 1.02× the script per cycle at 64 callers, eleventh session)
      local kind, ml, m, cl, cm, q0 = S_UNPACK('<dI4BI4B', args, 1)
      if kind ~= OP_ADMIT or ml ~= 1 or cl ~= 1 or m ~= j or cm ~= cj then
        return i -- (its head read again by batch_ops)
      end
      st[1], p0 = i, q0
    end
  end
  out[i] = admit(keys, argv, ao, map, p0, cmap, args)
  return i + 1
end
