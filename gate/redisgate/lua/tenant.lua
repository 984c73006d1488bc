-- tenant.lua: gate/tenant.go's limits of a tenant over a scope's sources.
-- t is a tenant's state (store.lua's ten): a quota's keys and record, the
-- budget's slices in the record (b.bb[2s - 1], b.bb[2s]: the index and
-- tokens of slot s, counted b.bwidth ms wide) and t.spent, permit ->
-- 'until:index:tokens', each permit's charge. tc is its configuration.

local function no_spends()
  local bb = {}
  for i = 1, 2 * BUDGET_BUCKETS do
    bb[i] = 0
  end
  return bb
end

-- twin: gate.(*Budget).used
local function t_used(t, tc, now)
  local b = t.b
  if tc.budget <= 0 or b.bwidth ~= tc.width then
    return 0
  end
  local idx, sum = idiv(now, tc.width), 0
  for i = 1, 2 * BUDGET_BUCKETS, 2 do
    if b.bb[i] > idx - BUDGET_BUCKETS and b.bb[i] <= idx then
      sum = tadd(sum, b.bb[i + 1])
    end
  end
  return sum
end

-- twin: gate.(*Budget).check
local function t_budget(t, tc, tokens, now)
  if tc.budget <= 0 then
    return true, 0
  end
  local used = t_used(t, tc, now)
  if tadd(used, tokens) <= tc.budget then
    return true, 0
  elseif tokens > tc.budget then
    return false, 0
  end
  local excess, w = tadd(used, tokens) - tc.budget, t.b.bwidth
  local idx = idiv(now, w)
  for k = idx - BUDGET_BUCKETS + 1, idx do
    local at = 2 * (k % BUDGET_BUCKETS) + 1
    if t.b.bb[at] == k then
      excess = excess - t.b.bb[at + 1]
      if excess <= 0 then
        return false, (k + BUDGET_BUCKETS) * w - now
      end
    end
  end
  return false, 0
end

-- twin: gate.(*Tenant).Verdict
local function t_verdict(t, tc, tokens, now)
  local ok, wait = t_budget(t, tc, tokens, now)
  if not ok then
    return R_TENANT_BUDGET, wait
  end
  local reason
  reason, wait = q_check(t, tc, tc.max_concurrency, tokens, now)
  if reason ~= R_NONE then
    return R_TENANT_LIMIT, wait
  end
  return R_NONE, 0
end

-- twin: gate.(*Tenant).Take
local function t_take(t, tc, permit, tokens, lease, now)
  q_take(t, { max_concurrency = tc.max_concurrency, rpm = tc.rpm, tpm = tc.tpm, lease = lease }, permit, tokens, now)
  if tc.budget <= 0 then
    return
  end
  local b, untl = t.b, now + lease
  if b.bwidth ~= tc.width or type(b.bb) ~= 'table' then
    b.bb, b.bwidth = no_spends(), tc.width
    redis.call('DEL', t.spent)
  end
  local idx = idiv(now, tc.width)
  local at = 2 * (idx % BUDGET_BUCKETS) + 1
  if b.bb[at] ~= idx then
    b.bb[at], b.bb[at + 1] = idx, 0
  end
  tokens = tadd(0, tokens)
  b.bb[at + 1] = tadd(b.bb[at + 1], tokens)
  keep_until(t.spent, permit, I(untl) .. ':' .. I(idx) .. ':' .. I(tokens), untl, now)
end

-- twin: gate.(*Tenant).Release
local function t_release(t, permit, actual, now)
  q_release(t, permit, actual, now)
  local v = redis.call('HGET', t.spent, permit)
  if not v then
    return
  end
  redis.call('HDEL', t.spent, permit)
  local untl, idx, tokens = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+)$')
  untl, idx, tokens = tonumber(untl), tonumber(idx), tonumber(tokens)
  if idx == nil or now >= untl or actual < 0 or type(t.b.bb) ~= 'table' then
    return
  end
  local at = 2 * (idx % BUDGET_BUCKETS) + 1
  if t.b.bb[at] == idx then
    t.b.bb[at + 1] = tadd(t.b.bb[at + 1], tadd(0, actual) - tokens)
  end
end

-- t_view appends the tenant's gate.TenantView (after its name): in_flight
-- requests tokens budget_used reason retry.
local function t_view(r, t, tc, tokens, now)
  local reason, wait = t_verdict(t, tc, tokens, now)
  local held, requests, used = q_view(t, now)
  local n = #r
  r[n + 1], r[n + 2], r[n + 3], r[n + 4], r[n + 5], r[n + 6] = held, requests, used, t_used(t, tc, now), reason, wait
end
