-- settle.lua: gate.Backend.Settle (gate.SourceState.Settle, then progress).
--
-- keys: SCOPE_KEYS, SRC_KEYS, the source's LINE_KEYS.   argv: one (opArg:
-- SETTLE, HANDOFF), then, in a call of its own, the CONF argument (CONF_H,
-- SRC_CONF).   Reply: SETTLE_R, the breaker's record, its window.
-- Its argument is argv[ao + 1], from position p0 (as admit's), its keys are
-- found with map and its source's policy with cmap (as admit's).
-- twin: gate.(*SourceState).Settle
-- (In a batch, what admit looks up in the batch's tables, the same way.)
local function settle(keys, argv, ao, map, p0, cmap, args)
  args = args or op_arg(argv, ao)
  if not map then
    conf_open(op_arg(argv, ao + 1), false)
  end
  local sc, bsrc = CONF_H.T, map and CALL.src
  -- The outcome is SETTLE's fields (in the walk also SETTLE.T, a: b_settle's
  -- o), pc the source's name and policy (its p); HANDOFF follows SETTLE at hb.
  p0 = p0 or 1
  local at = p0 + S_UNPACK('<I4', args, p0) -- (op_block's)
  if at ~= p0 + 8 then
    op_check(at, p0, 2) -- SETTLE, HANDOFF: raises
  end
  -- SETTLE's fields as locals (as admit's ADMIT), into SETTLE.T (a) for the
  -- walk only.
  local snow, permit, epoch, probe, verdict, floor, actual, pflag, hb = S_UNPACK(SETTLE.FMT, args, at)
  probe = probe == 1
  local now = map and snow == 0 and CALL.now or now_ms(snow)
  local s = map and CALL.scope or op_scope(keys, map)
  local bs = map and bsrc[BYTE[map] or string.byte(map, 1)] -- (BYTE: see lib.lua)
  local q = bs and bs.q or op_src(keys, nil, 1)
  local pc = cmap and CONF_SRC[BYTE[cmap] or string.byte(cmap, 1)] or op_conf(cmap, 1)

  -- (A batch's ops first try the early exit, settle_run: those it does
  -- not take walk here. BATCH_RUNS.first repeats the reads above, in
  -- their order, before its b_load: change both.)
  local hc = map and CALL.h[q.state]
  local a = SETTLE.T -- (SETTLE.into_at's table, b_settle's o)
  a.now, a.permit, a.epoch, a.probe, a.verdict, a.floor, a.actual, a.progress = snow, permit, epoch, probe, verdict,
    floor, actual, pflag
  local b = b_load(q.state, true, a.permit)
  local released = q_release(q, b, a.permit, a.actual, now)
  -- A give-back without a verdict (lostAdmit: an Admit whose reply was
  -- lost, so neither its probe flag nor its epoch is known) of the permit
  -- that holds the breaker's probe is that probe's outcome, and ends its
  -- lease: permit ids are unique, so the permit names the probe's round as
  -- surely as its epoch would. Otherwise the probe stays held by nobody
  -- until its TTL ends, and the source refuses everyone meanwhile.
  if not a.probe and a.verdict == V_NONE and b.state == HALF_OPEN and b.probe == a.permit then
    a.probe, a.epoch = true, b.epoch
  end
  local effect, evs
  if released or a.probe then
    effect, evs = b_settle(b, pc, a, now)
  else
    effect, evs = b_stale(b, a)
  end
  b_save(b, sc.idle_ttl, now)
  local events = ''
  if evs ~= NO_EVENTS then
    for _, e in ipairs(evs) do
      events = events .. ev_reply(1, e)
      announce(sc.channel, sc.scope, pc.name, e)
    end
  end
  local progress = now
  if pflag == 1 and map then -- set_ms's case in a batch, without its call
    CALL.got[s.progress], CALL.put[s.progress] = now, sc.idle_ttl
  elseif pflag == 1 then
    set_ms(s.progress, now, sc.idle_ttl)
  else
    progress = get_ms(s.progress)
  end
  local rel, handoff = 0, ''
  if released then
    rel = 1
    if S_UNPACK('<d', args, hb) == 1 then -- (HANDOFF.on_at's)
      local k = bs and bs.l or op_line(keys, nil, 1, 1)
      if not (k.empty or l_empty(k)) then -- (l_handoff's first test, before its block is read; l_empty's answer kept on k)
        handoff = l_handoff(k, HANDOFF.read_at(args, hb), now)
      end
    end
  end
  -- The reply, SETTLE_R (its released, effect, events, progress, now,
  -- handoff); the breaker and its window as elements of their own (layout.go's
  -- settleReply): packed into the record they would be copied again.
  -- (b_stored's answer without its call where the cache holds it)
  local rec = hc and hc.b == b and hc.vrec and not hc.vdirty and not b.bdirty and hc.vrec or b_stored(b)
  return { SETTLE_R.pack_memo(rel, effect, events, progress, now, handoff), rec, b.win }
end

-- BATCH_RUNS[OP_SETTLE] (settle_run) is batch_ops's for a settle, the i-th op (its argument args,
-- its head's map, cmap and p0 read; its argument argv[ao + 1]), and the
-- settles that follow it with the same map and cmap (a run: batch.go
-- sends a batch's settles first): what they share is looked up once (the
-- source's keys, its cache entry and breaker, its configuration, the
-- scope, the time), and each op reads only its own fields. The walk's
-- early exit for the common op of a batch (docs/performance.md, seventh
-- session): a success, not a probe's, of this epoch, whose permit holds
-- its lease (not in a minute's log, or no actual tokens to set), its state
-- hash cached with that lease and the window (b_first read them), its
-- breaker CLOSED without an override (a run's exits change neither) and no
-- lease ended to sweep. It releases and records (the run's count once: below) as the walk would, with
-- the walk's steps for this case in their order (b_load's b_cached,
-- q_release, h_del, b_settle) but not their calls, and answers as the
-- walk; the first op that does not take it walks (settle) and ends the
-- run. Each op's own reads are settle's, in its order, before it changes
-- anything, so an op that raises raises as settle would (st[1] names it).
-- Returns the number of the op after the run.
BATCH_RUNS[OP_SETTLE] = function(keys, argv, ao, i, n, out, st, args, map, cmap, p0) -- settle_run
  local j, cj, bs, hc, b, pc = BATCH_RUNS.src(map, cmap)
  if not hc and pc and bs then
    -- The source's state hash not loaded yet (the batch's first op of the
    -- source): loaded here as the walk's b_load would (b_first), so that
    -- the run starts at this op rather than after its walk.
    hc, b = BATCH_RUNS.first(bs.q.state, args, p0)
  end
  if pc and b and b.win and b.state == CLOSED and b.override == NO_OVERRIDE
    and b.width == (pc.wwin == pc.window and pc.wid or bucket_width(pc)) then -- (b_record's first test: the walk's op sets it)
    local sp, got, put, idle_ttl, cnow, f, dirty = CALL.scope.progress, CALL.got, CALL.put, CONF_H.T.idle_ttl,
      CALL.now, hc.f, hc.dirty
    local prev, pnow, pprog = nil, nil, nil -- the op before in the run, answered in full, its now and progress
    -- The run's successes are counted (the ops from..i, all at now pn) and
    -- recorded into the window (b_record, one row: calls + k) once, where a
    -- full reply needs it (the table t holds the last answered op's reply,
    -- its window t[3] set then), not once per op. CALL says what is
    -- pending (rc, rpc, rnow, rt, rfrom, rk: the ops counted, the last
    -- rk), for batch_run's error path (run_flush): an op that raises
    -- leaves them recorded as one at a time would. The window b_keep
    -- saves is the recorded one (hc.saved_win set again after a record).
    local from, pn, t = i, nil, nil
    local C = CALL
    C.rc, C.rpc, C.rfrom, C.rk = hc, pc, i, i - 1
    while true do
      local at = p0 + S_UNPACK('<I4', args, p0) -- (op_block's)
      if at ~= p0 + 8 then
        break -- (settle raises: op_check)
      end
      local snow, permit, epoch, probe, verdict, floor, actual, pflag, hb = S_UNPACK(SETTLE.FMT, args, at)
      local now = snow == 0 and cnow or now_ms(snow)
      local field = LEASE .. permit
      local lease = f[field]
      if not (lease and verdict == V_SUCCESS and probe ~= 1 and epoch == b.epoch and (actual < 0 or #lease <= 8)
        and not (b.held > 0 and now >= b.lease_min)) then
        break
      end
      b.lease_of, b.lease_f, b.lease_v = lease, false, false
      f[field], dirty[field] = false, true
      if b.held > 0 then
        b.held = b.held - 1
      end
      if pn ~= now then -- another time: the count so far recorded (before this op's b_keep)
        if from < i then
          b_record(b, pc, pn, false, i - from)
          t[3] = b.win
        end
        from, pn = i, now
        C.rfrom, C.rnow = i, now
      end
      C.rk = i -- (counted: b_record's place)
      if b.consecutive ~= 0 then
        b.consecutive, b.bdirty = 0, true
      end
      b_keep(hc, now, idle_ttl) -- b_save for this case (as admit_run's: no lease to write)
      local progress = now
      if pflag == 1 then -- set_ms's case in a batch, without its call
        got[sp], put[sp] = now, idle_ttl
      else
        progress = get_ms(sp)
      end
      local handoff = ''
      if S_UNPACK('<d', args, hb) == 1 then -- (HANDOFF.on_at's)
        local k = bs.l
        if not (k.empty or l_empty(k)) then -- (l_handoff's first test, before its block is read; l_empty's answer kept on k)
          handoff = l_handoff(k, HANDOFF.read_at(args, hb), now)
        end
      end
      -- (b_stored's answer without its call where the cache holds it)
      local rec = hc.vrec and not hc.vdirty and not b.bdirty and hc.vrec or b_stored(b)
      -- The op before in the run, where its SETTLE_R is this one's (the same
      -- now and progress, no handoff), answers 1: this op's reply, with one
      -- call fewer in its window (a success in a CLOSED breaker changes
      -- nothing else its view shows; runBatch expands it). Its table is
      -- this op's: only the record and the window change.
      -- (Its window t[3] set where the count is recorded.)
      if t and prev and now == pnow and progress == pprog and handoff == '' then
        out[prev], t[2] = 1, rec
        out[i] = t
      else
        if from < i then -- the ops before this one recorded, into the op before's reply
          b_record(b, pc, pn, false, i - from)
          t[3], hc.saved_win = b.win, b.win
          from = i
          C.rfrom = i
        end
        t = { SETTLE_R.pack_memo(1, F_APPLIED, '', progress, now, handoff), rec, false }
        out[i] = t
        C.rt = t
      end
      if handoff == '' then
        prev, pnow, pprog = i, now, progress
      else
        prev = nil
      end
      -- the next op, while it is a settle of the same map and cmap
      st[1], i, ao = 0, i + 1, ao + 1
      if i > n then
        BATCH_RUNS.flush(0)
        return i
      end
      local nx = ao + 1
      args = argv[nx]
      if #args < 18 then
        BATCH_RUNS.flush(0)
        return i -- (batch_ops reads its head, or raises)
      end
      -- BATCH_OP's kind, and its map and cmap of one byte each, as numbers
      -- (no string each): BATCH_OP.FMT's with a byte where one is read.
      local kind, ml, m, cl, cm, q0 = S_UNPACK('<dI4BI4B', args, 1)
      if kind ~= OP_SETTLE or ml ~= 1 or cl ~= 1 or m ~= j or cm ~= cj then
        BATCH_RUNS.flush(0)
        return i -- (its head read again by batch_ops)
      end
      st[1], p0 = i, q0
    end
    BATCH_RUNS.flush(0) -- (before the walk's reads of the window)
  end
  out[i] = settle(keys, argv, ao, map, p0, cmap, args)
  return i + 1
end
