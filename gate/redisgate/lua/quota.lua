-- quota.lua: gate/quota.go's limits of a source s (store.lua's src) under
-- configuration c. The record keeps what spares a scan: held, the slots
-- held (set right by a scan); lease_min, at most the earliest end of a
-- lease; mtokens, the tokens admitted in the minute; moldest, the oldest
-- admission in the minute (0: none).

-- twin: gate.addTokens
local function tadd(sum, n)
  local t = sum + n
  if t < 0 then
    return 0
  elseif t > MAX_TOKEN_SUM then
    return MAX_TOKEN_SUM
  end
  return t
end

-- q_held is the number of slots held at now, forgetting the leases that
-- ended (Quota.expire's first half: a scan only once lease_min has passed).
local function q_held(s, now)
  local b = s.b
  if b.held > 0 and now >= b.lease_min then
    local all = redis.call('HGETALL', s.leases)
    local ended, soonest = {}, 0
    for i = 1, #all, 2 do
      local e = tonumber(all[i + 1])
      if e == nil or now >= e then
        ended[#ended + 1] = all[i]
      elseif soonest == 0 or e < soonest then
        soonest = e
      end
    end
    each_page(ended, function(...) redis.call('HDEL', s.leases, ...) end)
    b.held = #all / 2 - #ended
    b.lease_min = soonest
  end
  return b.held
end

-- q_minute forgets the admissions that left the minute (Quota.expire's
-- second half) and returns how many remain (0 unless counted).
local function q_minute(s, now, count)
  local b = s.b
  if b.moldest == 0 then
    return 0
  end
  if b.moldest + MINUTE <= now then
    local cut = now - MINUTE
    local old = redis.call('ZRANGEBYSCORE', s.minute, '-inf', cut)
    each_page(old, function(...)
      for _, t in ipairs(redis.call('HMGET', s.tokens, ...)) do
        b.mtokens = tadd(b.mtokens, -(tonumber(t) or 0))
      end
      redis.call('HDEL', s.tokens, ...)
    end)
    redis.call('ZREMRANGEBYSCORE', s.minute, '-inf', cut)
    local first = redis.call('ZRANGE', s.minute, 0, 0, 'WITHSCORES')
    if first[2] then
      b.moldest = tonumber(first[2])
    else
      b.moldest, b.mtokens = 0, 0 -- (the keys expired with the minute)
    end
  end
  if count and b.moldest ~= 0 then
    return redis.call('ZCARD', s.minute)
  end
  return 0
end

-- twin: gate.QuotaView.refusal
local function q_refusal(c, ceiling, held, requests, mtokens, tokens)
  if ceiling < c.max_concurrency and held >= ceiling then
    return R_ADAPTIVE_PACED
  elseif held >= c.max_concurrency or (c.rpm > 0 and requests >= c.rpm) or (c.tpm > 0 and mtokens + tokens > c.tpm) then
    return R_RATE_LIMITED
  end
  return R_NONE
end

-- twin: gate.(*Quota).check
local function q_check(s, c, ceiling, tokens, now)
  local held = q_held(s, now)
  local requests = q_minute(s, now, c.rpm > 0)
  local b = s.b
  local reason = q_refusal(c, ceiling, held, requests, b.mtokens, tokens)
  if reason ~= R_RATE_LIMITED or held >= c.max_concurrency then
    return reason, 0 -- a slot may free at any moment
  end
  if c.rpm > 0 and requests >= c.rpm then
    -- The (requests - rpm)-th oldest admission must leave the minute first.
    local e = redis.call('ZRANGE', s.minute, requests - c.rpm, requests - c.rpm, 'WITHSCORES')
    return reason, tonumber(e[2]) + MINUTE - now
  elseif tokens > c.tpm then
    return reason, 0 -- never fits this source
  end
  local excess = b.mtokens + tokens - c.tpm
  -- The oldest admissions whose tokens must leave the minute first.
  local all = redis.call('ZRANGE', s.minute, 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 * PAGE do
    local permits, ats = {}, {}
    for j = i, math.min(i + 2 * PAGE - 1, #all), 2 do
      permits[#permits + 1], ats[#ats + 1] = all[j], tonumber(all[j + 1])
    end
    local ts = redis.call('HMGET', s.tokens, unpack(permits))
    for j = 1, #permits do
      excess = excess - (tonumber(ts[j]) or 0)
      if excess <= 0 then
        return reason, ats[j] + MINUTE - now
      end
    end
  end
  return reason, 0
end

-- twin: gate.(*Quota).take
local function q_take(s, c, permit, tokens, now)
  local b = s.b
  local e = now + c.lease
  if b.held == 0 or e < b.lease_min then
    b.lease_min = e
  end
  if redis.call('HSET', s.leases, permit, e) == 1 then
    b.held = b.held + 1
  end
  s.took = true
  if c.rpm == 0 and c.tpm == 0 then
    return
  end
  tokens = tadd(0, tokens)
  redis.call('ZADD', s.minute, now, permit)
  redis.call('HSET', s.tokens, permit, tokens)
  b.mtokens = tadd(b.mtokens, tokens)
  if b.moldest == 0 then
    b.moldest = now
  end
  s.logged = true
end

-- twin: gate.(*Quota).release
-- It settles the permit's tokens to actual (< 0: the estimate) and says
-- whether the permit held its slot, freed last: a release that raises
-- keeps it for the settle repeated.
local function q_release(s, permit, actual, now)
  q_held(s, now)
  q_minute(s, now, false)
  local b = s.b
  if actual >= 0 and b.moldest ~= 0 then
    local old = tonumber(redis.call('HGET', s.tokens, permit))
    if old then
      actual = tadd(0, actual)
      b.mtokens = tadd(b.mtokens, actual - old)
      redis.call('HSET', s.tokens, permit, actual)
      s.logged = true
    end
  end
  local held = redis.call('HDEL', s.leases, permit) == 1
  if held then
    b.held = math.max(b.held - 1, 0)
  end
  return held
end

-- q_view is the quota's counts at now (gate.QuotaView), as a reply.
local function q_view(s, now)
  local held = q_held(s, now)
  local requests = q_minute(s, now, true)
  return held, requests, s.b.mtokens
end
