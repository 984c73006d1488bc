-- breaker.lua: gate/breaker.go's state machine, function by function (each
-- names its Go twin). b is a source's record, p its configuration.

-- NONE is the empty list, shared: never appended to.
local NONE = {}

-- twin: gate.cooldownMs
local function cooldown_ms(base, max, reopens)
  local shift = reopens - 1
  if shift < 0 then
    shift = 0
  end
  if shift >= 62 or base > math.floor(max / 2 ^ shift) then
    return max
  end
  return base * 2 ^ shift
end

-- twin: gate.(*Breaker).event
local function b_event(b, kind, from, cause)
  return { kind = kind, from = from, to = b.state, cause = cause, epoch = b.epoch, reopens = b.reopens }
end

-- twin: gate.(*Breaker).check
local function b_check(b, now)
  local o = b.override
  if o == O_FORCED_OPEN then
    return R_FORCED_OPEN, 0
  elseif o == O_FORCED_CLOSED or o == O_DISABLED then
    return R_NONE, 0
  end
  if b.state == OPEN then
    if now < b.open_until then
      return R_CIRCUIT_OPEN, b.open_until - now
    end
  elseif b.state == HALF_OPEN then
    if b.probe ~= '' and now < b.probe_until then
      return R_PROBE_IN_FLIGHT, 0
    end
  end
  return R_NONE, 0
end

-- twin: gate.(*Breaker).Enter
-- Returns allowed, probe, epoch, reason, retry and the events.
local function b_enter(b, p, permit, now)
  local reason, wait = b_check(b, now)
  if reason ~= R_NONE then
    return false, false, b.epoch, reason, wait, NONE
  end
  if b.override ~= O_NONE or b.state == CLOSED then
    return true, false, b.epoch, R_NONE, 0, NONE
  end
  local events = {}
  if b.state == OPEN then
    b.state = HALF_OPEN
    events[#events + 1] = b_event(b, E_TRANSITION, OPEN, C_COOLDOWN_ELAPSED)
  end
  if b.probe ~= '' then
    local e = b_event(b, E_PROBE_EXPIRED, HALF_OPEN, C_NONE)
    e.permit = b.probe
    events[#events + 1] = e
  end
  b.epoch = b.epoch + 1
  b.probe = permit
  b.probe_until = now + p.probe_ttl
  local e = b_event(b, E_PROBE_LEASED, HALF_OPEN, C_NONE)
  e.permit = permit
  events[#events + 1] = e
  return true, true, b.epoch, R_NONE, 0, events
end

-- twin: gate.(*Breaker).resetRound
local function b_reset_round(b)
  b.probe, b.probe_until = '', 0
  b.consecutive = 0
  b.bk = no_buckets()
end

-- twin: gate.bucketWidth
-- bucket_at is the bucket width and now's bucket's index, once per call.
local function bucket_at(p, now)
  if p.at ~= now then
    local w = idiv(p.window, WINDOW_BUCKETS)
    if w < 1 then
      w = 1
    end
    p.width, p.at, p.idx = w, now, idiv(now, w)
  end
  return p.width, p.idx
end

-- twin: gate.(*Breaker).record
-- (slot s = idx % WINDOW_BUCKETS + 1: store.lua's no_buckets)
local function b_record(b, p, now, fail)
  local w, idx = bucket_at(p, now)
  if b.width ~= w then
    b.bk = no_buckets()
    b.width = w
  end
  local bk, at = b.bk, 3 * (idx % WINDOW_BUCKETS) + 1
  if bk[at] ~= idx then
    bk[at], bk[at + 1], bk[at + 2] = idx, 0, 0
  end
  bk[at + 1] = bk[at + 1] + 1
  if fail then
    bk[at + 2] = bk[at + 2] + 1
  end
end

-- twin: gate.(*Breaker).Counts
local function b_counts(b, p, now)
  local w, idx = bucket_at(p, now)
  if b.width ~= w then
    return 0, 0
  end
  local bk, calls, fails = b.bk, 0, 0
  for at = 1, 3 * WINDOW_BUCKETS, 3 do
    if bk[at] > idx - WINDOW_BUCKETS and bk[at] <= idx then
      calls, fails = calls + bk[at + 1], fails + bk[at + 2]
    end
  end
  return calls, fails
end

-- twin: gate.(*Breaker).open
local function b_open(b, p, now, floor, cause)
  local from = b.state
  b_reset_round(b)
  b.reopens = b.reopens + 1
  b.state = OPEN
  b.opened_at = now
  b.cause = OC_FAILURES
  if cause == C_SOURCE_DEAD then
    b.cause = OC_SOURCE_DEAD
  end
  local cd = cooldown_ms(p.cooldown, p.max_cooldown, b.reopens)
  if floor > cd then
    cd = floor
  end
  b.open_until = now + cd
  local e = b_event(b, E_TRANSITION, from, cause)
  e.cooldown = cd
  return e
end

-- twin: gate.(*Breaker).stale
local function b_stale(b, o)
  local e = b_event(b, E_STALE_OUTCOME, b.state, C_NONE)
  e.permit = o.permit
  return F_STALE, { e }
end

-- twin: gate.(*Breaker).Settle
-- o is the outcome: permit, epoch, probe, verdict, floor (ms).
local function b_settle(b, p, o, now)
  if b.override == O_DISABLED then
    if o.probe and b.probe == o.permit and o.epoch == b.epoch then
      b.probe, b.probe_until = '', 0
    end
    return F_IGNORED, NONE
  end
  if o.epoch ~= b.epoch or (o.probe and (b.state ~= HALF_OPEN or b.probe ~= o.permit)) then
    return b_stale(b, o)
  end
  local v = o.verdict
  if o.probe then
    if v == V_SUCCESS then
      b_reset_round(b)
      b.reopens = 0
      b.state = CLOSED
      return F_APPLIED, { b_event(b, E_TRANSITION, HALF_OPEN, C_PROBE_SUCCEEDED) }
    elseif v == V_FAILURE or v == V_FORCE_OPEN then
      local cause = C_PROBE_FAILED
      if v == V_FORCE_OPEN then
        cause = C_SOURCE_DEAD
      end
      return F_APPLIED, { b_open(b, p, now, o.floor, cause) }
    end
    b.probe, b.probe_until = '', 0
    local e = b_event(b, E_PROBE_RELEASED, HALF_OPEN, C_NONE)
    e.permit = o.permit
    return F_NO_VERDICT, { e }
  end
  if b.state == CLOSED then
    if v == V_SUCCESS then
      b_record(b, p, now, false)
      b.consecutive = 0
      return F_APPLIED, NONE
    elseif v == V_FAILURE then
      b_record(b, p, now, true)
      b.consecutive = b.consecutive + 1
      if b.consecutive >= p.fail_threshold then
        return F_APPLIED, { b_open(b, p, now, o.floor, C_CONSECUTIVE_FAILURES) }
      end
      local calls, fails = b_counts(b, p, now)
      if calls >= p.min_calls and fails / calls >= p.fail_rate then
        return F_APPLIED, { b_open(b, p, now, o.floor, C_FAILURE_RATE) }
      end
      return F_APPLIED, NONE
    elseif v == V_FORCE_OPEN then
      return F_APPLIED, { b_open(b, p, now, o.floor, C_SOURCE_DEAD) }
    end
    return F_NO_VERDICT, NONE
  elseif b.state == OPEN and v == V_FORCE_OPEN then
    -- Admitted before the breaker opened: a dead source may make the
    -- opening longer, never shorter, and is no reopening.
    local untl = now + cooldown_ms(p.cooldown, p.max_cooldown, b.reopens)
    if now + o.floor > untl then
      untl = now + o.floor
    end
    if untl > b.open_until then
      b.open_until = untl
      b.cause = OC_SOURCE_DEAD
      local e = b_event(b, E_TRANSITION, OPEN, C_SOURCE_DEAD)
      e.cooldown = untl - now
      return F_APPLIED, { e }
    end
    return F_APPLIED, NONE
  end
  return b_stale(b, o)
end

-- twin: gate.(*Breaker).Apply
-- The action was checked by the caller (gate.CheckOverride); an unknown one
-- raises.
local function b_apply(b, action, actor, why, now)
  local events = {}
  if action == A_FORCE_OPEN then
    b.override = O_FORCED_OPEN
  elseif action == A_FORCE_CLOSED then
    b.override = O_FORCED_CLOSED
  elseif action == A_DISABLE then
    b.override = O_DISABLED
  elseif action == A_CLEAR then
    b.override = O_NONE
  elseif action == A_RESET then
    local from = b.state
    b.override = O_NONE
    b_reset_round(b)
    b.reopens = 0
    b.state = CLOSED
    b.epoch = b.epoch + 1
    if from ~= CLOSED then
      events[1] = b_event(b, E_TRANSITION, from, C_RESET)
    end
  else
    error('redisgate: unknown breaker action ' .. tostring(action))
  end
  b.actor, b.why, b.override_at = actor, why, now
  if b.override == O_NONE then
    b.actor, b.why = '', ''
  end
  local e = b_event(b, E_OVERRIDE, b.state, C_NONE)
  e.override, e.actor, e.why = b.override, actor, why
  table.insert(events, 1, e)
  return events
end

-- put_notable appends 0 for a breaker CLOSED without an override, else 1
-- and its state epoch reopens opened_at open_until cause probe probe_until
-- override actor why override_at.
local function put_notable(r, b)
  local n = #r
  if b.state == CLOSED and b.override == O_NONE then
    r[n + 1] = 0
    return r
  end
  r[n + 1], r[n + 2], r[n + 3], r[n + 4], r[n + 5], r[n + 6], r[n + 7] =
    1, b.state, b.epoch, b.reopens, b.opened_at, b.open_until, b.cause
  r[n + 8], r[n + 9], r[n + 10], r[n + 11], r[n + 12], r[n + 13] =
    b.probe, b.probe_until, b.override, b.actor, b.why, b.override_at
  return r
end

-- put_breaker appends what gate.Breaker.View needs: epoch reopens
-- consecutive, the window's calls and failures at now, put_notable's.
local function put_breaker(r, b, p, now)
  local calls, fails = b_counts(b, p, now)
  local n = #r
  r[n + 1], r[n + 2], r[n + 3], r[n + 4], r[n + 5] = b.epoch, b.reopens, b.consecutive, calls, fails
  return put_notable(r, b)
end

-- GROUP_REJECTION and GROUP_EVENT start the groups a reply may end with.
local GROUP_REJECTION, GROUP_EVENT = 1, 2

-- put_event appends GROUP_EVENT c kind from to cause epoch reopens
-- cooldown permit override actor why (c the event's candidate, from 1).
local function put_event(r, c, e)
  local n = #r
  r[n + 1], r[n + 2], r[n + 3], r[n + 4], r[n + 5], r[n + 6], r[n + 7] =
    GROUP_EVENT, c, e.kind, e.from, e.to, e.cause, e.epoch
  r[n + 8], r[n + 9], r[n + 10], r[n + 11], r[n + 12], r[n + 13] =
    e.reopens, e.cooldown or 0, e.permit or '', e.override or O_NONE, e.actor or '', e.why or ''
end

-- put_events appends each event, and announces to other replicas at once
-- a breaker that opened or closed and an operator's action, with the
-- scope's marker (loss.go; subscribe.go reads it).
local function put_events(r, c, source, evs)
  for _, e in ipairs(evs) do
    put_event(r, c, e)
    if e.kind == E_OVERRIDE or (e.kind == E_TRANSITION and (e.to == OPEN or e.to == CLOSED)) then
      local a = { 1, C.h.scope, source, marker() or '' }
      put_event(a, 1, e)
      redis.call('PUBLISH', C.h.channel, cjson.encode(a))
    end
  end
  return r
end
