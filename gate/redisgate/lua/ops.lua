-- ops.lua: the Backend's operations, and run, the library's one function.
-- Each op reads its numbers (x, after x[xi]) and strings (a, after a[ai])
-- as wire.go's function of its name writes them, and appends its reply to
-- r, one flat list for the whole call (a nested list costs Redis a
-- conversion of its own), which results.go reads in the same order.

-- replica_or is the replica named, or the header's.
local function replica_or(replica)
  if replica == '' then
    return C.h.replica
  end
  return replica
end

-- read_waiter is wire.go's waiter after x[i] and a[j].
local function read_waiter(x, i, a, j)
  return {
    priority = x[i + 1], weight = x[i + 2], other_weight = x[i + 3], max_tenants = x[i + 4], aging = x[i + 5],
    lease = x[i + 6], named = x[i + 7] == 1, id = a[j + 1], replica = replica_or(a[j + 2]), tenant = a[j + 3],
  }
end

-- gone says whether permit was given back before its Admit ran (a
-- tombstone, see give_back): the Admit then grants nothing.
local function gone(permit, now)
  if C.gone == nil then
    C.gone = redis.call('EXISTS', C.keys[3]) == 1
  end
  if not C.gone then
    return false
  end
  return (tonumber(redis.call('HGET', C.keys[3], permit)) or 0) > now
end

local function tombstone(permit, untl, now)
  keep_until(C.keys[3], permit, untl, untl, now)
  C.gone = true
end

-- twin: inmem.(*Backend).Admit
-- The walk over the candidates (gate.(*SourceState).Admit for each), with
-- the waiter's lines (gate.(*Line).Check before, After after). Its reply:
-- 1 and the marker when it is not the one the replica saw (nothing
-- granted: the replica re-asserts, then admits again); 2 when the permit
-- was given back before; else 0 granted probe epoch progress now, the
-- granted source's put_notable, the number of places (one per candidate,
-- or none) and the places, then the groups: a rejection is GROUP_REJECTION
-- c reason retry and its breaker's put_notable (remembered for a loss), an
-- event put_events'. A tenant that refuses refuses every candidate alike
-- (its reason and wait), and the waiter leaves their lines.
local function admit(r, x, xi, a, ai)
  local tokens, waits, nc, ti = x[xi + 1], x[xi + 2] == 1, x[xi + 3], x[xi + 4]
  local permit, i, j = a[ai + 1], xi + 4, ai + 1 -- the candidates' numbers after x[i], places after a[j]
  if waits then
    i, j = i + 7, j + 3
  end
  local m = marker()
  if not m or m ~= C.h.seen then
    r[#r + 1], r[#r + 2] = 1, m or ''
    return
  end
  local now = now_ms()
  if gone(permit, now) then
    r[#r + 1] = 2
    return
  end
  local granted, probe, epoch, held = 0, 0, 0, nil
  local groups = {}
  local tc, t = nil, nil
  if ti ~= 0 then
    tc = tconf(ti)
    t = ten(tc)
    local reason, wait = t_verdict(t, tc, tokens, now)
    if reason ~= R_NONE then
      local n = #r
      r[n + 1], r[n + 2], r[n + 3], r[n + 4], r[n + 5], r[n + 6], r[n + 7] = 0, 0, 0, 0, progress(), now, 0
      for k = 1, nc do
        local s = src(conf(x[i + 2 * k - 1]))
        if waits and not l_empty(s) then
          l_leave(s, a[ai + 2])
        end
        n = #r
        r[n + 1], r[n + 2], r[n + 3], r[n + 4] = GROUP_REJECTION, k, reason, wait
        put_notable(r, s.b)
      end
      return
    end
  end
  -- walk[k], made where a line has something to say (not empty, or w has a
  -- place in it), is true where the walk reached candidate k and it did
  -- not refuse, else the reason it refused; nil where the walk did not
  -- reach it or its line was empty and w had no place there.
  local w, walk = nil, nil
  for k = 1, nc do
    local c = conf(x[i + 2 * k - 1])
    local s = src(c)
    local passed = true
    if waits and (a[j + k] ~= '' or not l_empty(s)) then
      w = w or read_waiter(x, xi + 4, a, ai + 1)
      walk = walk or {}
      walk[k] = true
      w.place = a[j + k]
      local nobody
      passed, nobody = l_check(s, w, now)
      if nobody then
        walk[k] = nil
      end
    end
    local reason, wait = R_QUEUED, 0
    if passed then
      reason, wait = q_check(s, c, x[i + 2 * k], tokens, now)
    end
    if reason == R_NONE then
      local allowed, p, e, evs
      allowed, p, e, reason, wait, evs = b_enter(s.b, c, permit, now)
      put_events(groups, k, c.name, evs)
      if allowed then
        q_take(s, c, permit, tokens, now)
        granted, epoch, held = k, e, s.b
        if p then
          probe = 1
        end
        break
      end
    end
    local n = #groups
    groups[n + 1], groups[n + 2], groups[n + 3], groups[n + 4] = GROUP_REJECTION, k, reason, wait
    put_notable(groups, s.b)
    if walk and walk[k] then
      walk[k] = reason
    end
  end
  if granted ~= 0 and t then
    t_take(t, tc, permit, tokens, conf(x[i + 2 * granted - 1]).lease, now)
  end
  local n = #r
  r[n + 1], r[n + 2], r[n + 3], r[n + 4], r[n + 5], r[n + 6] = 0, granted, probe, epoch, progress(), now
  if held then
    put_notable(r, held)
  end
  local places = NONE
  if walk then
    -- A grant leaves every line, a refusal for capacity keeps the place, a
    -- breaker's refusal leaves the source's line.
    local kept = false
    places = {}
    for k = 1, nc do
      local p = ''
      if walk[k] ~= nil or a[j + k] ~= '' then
        local s = src(conf(x[i + 2 * k - 1]))
        w.place = a[j + k]
        if granted ~= 0 and granted ~= k then
          l_leave(s, w.id)
        else
          p = l_after(s, w, granted == k, walk[k] ~= true and l_capacity(walk[k]))
        end
      end
      places[k] = p
      kept = kept or p ~= ''
    end
    if not kept then
      places = NONE
    end
  end
  r[#r + 1] = #places
  for k = 1, #places do
    r[#r + 1] = places[k]
  end
  for k = 1, #groups do
    r[#r + 1] = groups[k]
  end
end

-- twin: inmem.(*Backend).Settle
-- Its reply: released effect progress now handoff marker, put_breaker's,
-- then the events; it returns whether the permit held its slot.
local function settle_op(r, src_i, permit, epoch, probe, verdict, floor, actual, success, hands, replica, lease, ti)
  local now = now_ms()
  if ti ~= 0 then
    t_release(ten(tconf(ti)), permit, actual, now)
  end
  local c = conf(src_i)
  local s = src(c)
  local b = s.b
  local released = q_release(s, permit, actual, now)
  local o = { permit = permit, epoch = epoch, probe = probe, verdict = verdict, floor = floor }
  -- A give-back (its probe flag and epoch unknown) of the permit that holds
  -- the probe ends the probe: the unique permit names the probe's round as
  -- surely as its epoch would.
  if not o.probe and o.verdict == V_NONE and b.state == HALF_OPEN and b.probe == o.permit then
    o.probe, o.epoch = true, b.epoch
  end
  local effect, evs
  if released or o.probe then
    effect, evs = b_settle(b, c, o, now)
  else
    effect, evs = b_stale(b, o)
  end
  if success then
    set_progress(now)
  end
  local handoff = ''
  if released and hands and not l_empty(s) then
    handoff = l_handoff(s, { replica = replica_or(replica), lease = lease }, now)
  end
  local n = #r
  r[n + 1], r[n + 2], r[n + 3], r[n + 4], r[n + 5], r[n + 6] = released and 1 or 0, effect, progress(), now, handoff, marker() or ''
  put_events(put_breaker(r, b, c, now), 1, c.name, evs)
  return released
end

local function settle(r, x, xi, a, ai)
  local src_i, epoch, probe, verdict, floor, actual, success, hands, lease, ti = unpack(x, xi + 1, xi + 10)
  settle_op(r, src_i, a[ai + 1], epoch, probe == 1, verdict, floor, actual, success == 1, hands == 1, a[ai + 2], lease, ti)
end

-- give_back settles, without a verdict, a permit whose Admit's reply was
-- lost, on each source the Admit could have granted it. Where none holds
-- it, the Admit may not have run yet (a stalled Redis runs it when it
-- resumes): a tombstone makes it grant nothing, so one give-back is
-- enough. Its reply: released.
local function give_back(r, x, xi, a, ai, nn)
  local permit, released, ti = a[ai + 1], 0, x[xi + 2]
  for i = xi + 3, xi + nn do
    if settle_op({}, x[i], permit, 0, false, V_NONE, 0, -1, false, false, '', 0, ti) then
      released = 1
    end
    ti = 0 -- (the tenant's slot freed once)
  end
  if released == 0 then
    tombstone(permit, now_ms() + x[xi + 1], now_ms())
  end
  r[#r + 1] = released
end

-- twin: inmem.(*Backend).Peek
-- Its reply: progress now marker, then per source put_breaker's, in_flight
-- requests tokens, the quota's verdict (reason retry), and l_read's when
-- the line is read, then per tenant t_view's.
local function peek(r, x, xi, a, ai, nn)
  local tokens, nc = x[xi + 1], x[xi + 6]
  local read, w, i, j = nil, nil, xi + 6, ai + 1 -- the candidates' numbers after x[i], places after a[j]
  if x[xi + 2] == 1 then
    read = { replica = replica_or(a[ai + 1]), lease = x[xi + 3], describe = x[xi + 4] == 1 }
  end
  if x[xi + 5] == 1 then
    w = read_waiter(x, i, a, j)
    i, j = i + 7, j + 3
  end
  local now = now_ms()
  local n = #r
  r[n + 1], r[n + 2], r[n + 3] = progress(), now, marker() or ''
  for k = 1, nc do
    local c = conf(x[i + 3 * k - 2])
    local s = src(c)
    local reason, wait = q_check(s, c, x[i + 3 * k - 1], tokens, now)
    put_breaker(r, s.b, c, now)
    local held, requests, used = q_view(s, now)
    n = #r
    r[n + 1], r[n + 2], r[n + 3], r[n + 4], r[n + 5] = held, requests, used, reason, wait
    if read then
      local jw = nil
      if w and x[i + 3 * k] == 1 then
        jw = w
        jw.place = a[j + k]
      end
      l_read(r, s, read, jw, now)
    end
  end
  for k = i + 3 * nc + 1, xi + nn do
    local tc = tconf(x[k])
    t_view(r, ten(tc), tc, tokens, now)
  end
end

-- twin: inmem.(*Backend).Override
-- Its reply: now marker, put_breaker's, in_flight requests tokens, events.
local function override(r, x, xi, a, ai)
  local now = now_ms()
  local c = conf(x[xi + 1])
  local s = src(c)
  local evs = b_apply(s.b, x[xi + 2], a[ai + 1], a[ai + 2], now)
  local n = #r
  r[n + 1], r[n + 2] = now, marker() or ''
  put_breaker(r, s.b, c, now)
  local held, requests, tokens = q_view(s, now)
  n = #r
  r[n + 1], r[n + 2], r[n + 3] = held, requests, tokens
  put_events(r, 1, c.name, evs)
end

-- twin: inmem.(*Backend).Leave
local function leave(r, x, xi, a, ai, nn)
  for i = xi + 1, xi + nn do
    l_leave(src(conf(x[i])), a[ai + 1])
  end
end

-- restore writes what a replica knows of a scope (loss.go) where Redis
-- lost it. The header's seen is the marker the replica last saw ("": none
-- yet). The same marker means Redis kept the scope, and nothing is written
-- (an override cleared there must not come back); a first look adopts the
-- marker. A missing marker (created from the token) or another one is a
-- loss: each record is written where Redis says less, OPEN where the
-- breaker is CLOSED and never opened since, the override where there is
-- none. Its reply: lost restored marker.
local function restore(r, x, xi, a, ai, nn)
  local m, seen = marker(), C.h.seen
  if m and (m == seen or seen == '') then
    local n = #r
    r[n + 1], r[n + 2], r[n + 3] = 0, 0, m
    return
  end
  if not m then
    m = a[ai + 1]
    redis.call('SET', C.keys[2], m)
    C.marker = m
  end
  local now, restored = now_ms(), 0
  for k = 1, nn / 8 do
    local g, left, ago, reopens, epoch, cause, override, since = unpack(x, xi + 8 * k - 7, xi + 8 * k)
    local b = src(conf(g)).b
    local wrote = false
    if left > 0 and b.state == CLOSED and b.reopens == 0 then
      b.state, b.reopens, b.cause = OPEN, reopens, cause
      if epoch > b.epoch then
        b.epoch = epoch
      end
      b.opened_at, b.open_until = now - ago, now + left
      wrote = true
    end
    if override ~= O_NONE and b.override == O_NONE then
      b.override, b.actor, b.why, b.override_at = override, a[ai + 2 * k], a[ai + 2 * k + 1], now - since
      wrote = true
    end
    if wrote then
      restored = restored + 1
    end
  end
  local lost = 0
  if seen ~= '' then
    lost = 1
  end
  local n = #r
  r[n + 1], r[n + 2], r[n + 3] = lost, restored, m
end

-- OPS are the ops by kind (wire.go's).
local OPS = {
  [K_ADMIT] = admit, [K_SETTLE] = settle, [K_GIVE_BACK] = give_back, [K_PEEK] = peek,
  [K_OVERRIDE] = override, [K_LEAVE] = leave, [K_RESTORE] = restore,
}

local function unknown()
  error('redisgate: unknown op')
end

-- run is the library's function: the ops after the header, in order, then
-- one write-back of what they changed. Each op's reply is its count of
-- values, then the values; an op that raises fails alone, as a call of its
-- own would (what it wrote before is kept): -1, then the error.
local function run(keys, argv)
  local x = doubles(argv[1])
  local h, xi, ai = header(x, argv)
  C = { keys = keys, src = {}, h = h }
  local r = {}
  while xi < #x do
    local kind, nn, ns = x[xi + 1], x[xi + 2], x[xi + 3]
    if xi + 3 + nn > #x or ai + ns > #argv then
      error('redisgate: an op past the arguments')
    end
    local at = #r + 1
    r[at] = 0
    local ok, err = pcall(OPS[kind] or unknown, r, x, xi + 3, argv, ai, nn)
    if ok then
      r[at] = #r - at
    else
      for k = #r, at + 1, -1 do
        r[k] = nil
      end
      if type(err) == 'table' then
        err = err.err or err.msg
      end
      r[at], r[at + 1] = -1, tostring(err)
    end
    xi, ai = xi + 3 + nn, ai + ns
  end
  flush()
  C = nil
  return r
end
