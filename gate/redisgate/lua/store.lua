-- store.lua: what one call of the library shares, and where a source's
-- state lives in Redis.
--
-- C is the call while it runs: its header (C.h, wire.go's), its keys, the
-- server's time read once, and the sources' records, each read once and
-- written back once when the call ends (flush).
--
-- Keys (wire.go's): KEYS[1] the scope's progress, KEYS[2] its marker
-- (ops.lua's restore), KEYS[3] its tombstones (permit -> until; ops.lua's
-- give_back), then each source's and tenant's, by role (SOURCE, TENANT):
--   state    the record (cmsgpack): breaker, window, quota counts, budget
--   leases   hash: permit -> end of its lease, one field per slot held
--   minute   zset: permit -> when it was admitted, for RPM and TPM
--   tokens   hash: permit -> the tokens it is charged, for TPM
--   line     zset and waiters hash: the source's waiting line (line.lua)
--   spent    hash: permit -> its charge to the budget (tenant.lua)
-- Times are Unix milliseconds; every integer stays below 2^53, which I()
-- writes in full into a string.

local C = nil
local SOURCE = { 'state', 'leases', 'minute', 'tokens', 'line', 'waiters' }
local TENANT = { 'state', 'leases', 'minute', 'tokens', 'spent' }
-- SLACK is how long (ms) a key of the minute outlives the minute it holds.
local SLACK = 1000
local TOMBSTONES = 1000

local function I(n)
  return string.format('%d', n)
end

-- idiv is Go's a / b for integers a >= 0, b >= 1: math.floor(a / b) may be
-- one off where a / b rounds to the next integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- now_ms is the time of the call's decisions: the server's clock, or the
-- test clock's time when the header carries one.
local function now_ms()
  if not C.now then
    local n = C.h.now
    if n == 0 then
      local t = redis.call('TIME')
      n = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
    end
    C.now = n
  end
  return C.now
end

-- FRESH is the record of a source Redis knows nothing of: a CLOSED breaker,
-- no lease held, nothing in the minute. A record of another RECORD_VERSION
-- gets what it lacks (src).
local RECORD_VERSION = 1
local FRESH = {
  v = RECORD_VERSION, state = CLOSED, epoch = 0, reopens = 0, opened_at = 0, open_until = 0, cause = OC_NONE,
  probe = '', probe_until = 0, consecutive = 0, width = 0,
  override = O_NONE, actor = '', why = '', override_at = 0,
  held = 0, lease_min = 0, mtokens = 0, moldest = 0,
}

-- no_buckets is an empty window: b.bk[3s - 2], b.bk[3s - 1], b.bk[3s] are
-- the index, calls and failures of the bucket in slot s (breaker.lua).
local function no_buckets()
  local bk = {}
  for i = 1, 3 * WINDOW_BUCKETS do
    bk[i] = 0
  end
  return bk
end

-- doubles is the list of float64s packed in s (wire.go's pack).
local function doubles(s)
  local n = #s / 8
  local x = { struct.unpack('<' .. string.rep('d', n), s) }
  x[n + 1] = nil -- (unpack's last result: the position after)
  return x
end

-- header reads wire.go's header from the numbers x and strings a, and
-- returns it with the positions its ops start after.
local function header(x, a)
  local h = { now = x[1], ttl = x[2], scope = a[2], channel = a[3], seen = a[4], replica = a[5], src = {}, ten = {} }
  local n, m = x[3], x[4]
  for k = 1, n do
    local base, mc, rpm, tpm, lease, ft, minc, rate, win, cd, mcd, pttl = unpack(x, 12 * k - 7, 12 * k + 4)
    h.src[k] = {
      base = base, name = a[5 + k], max_concurrency = mc, rpm = rpm, tpm = tpm, lease = lease, fail_threshold = ft,
      min_calls = minc, fail_rate = rate, window = win, cooldown = cd, max_cooldown = mcd, probe_ttl = pttl,
    }
  end
  for k = 1, m do
    local base, mc, rpm, tpm, budget, win = unpack(x, 4 + 12 * n + 6 * k - 5, 4 + 12 * n + 6 * k)
    if mc <= 0 then
      mc = 2 ^ 53 -- (gate's unlimited)
    end
    h.ten[k] = {
      base = base, name = a[5 + n + k], max_concurrency = mc, rpm = rpm, tpm = tpm, budget = budget,
      width = math.max(idiv(win, BUDGET_BUCKETS), 1), ttl = math.max(x[2], win + MINUTE),
    }
  end
  return h, 4 + 12 * n + 6 * m, 5 + n + m
end

-- conf is the i-th source configuration of the header (from 1), tconf
-- the i-th tenant's.
local function conf(i)
  local c = C.h.src[i]
  if c == nil then
    error('redisgate: no source configuration ' .. tostring(i))
  end
  return c
end

local function tconf(i)
  local c = C.h.ten[i]
  if c == nil then
    error('redisgate: no tenant configuration ' .. tostring(i))
  end
  return c
end

-- group is the keys after KEYS[base], named by roles, and their record
-- (s.b), read on first use.
local function group(base, roles)
  local s = C.src[base]
  if s then
    return s
  end
  if base < 3 or base % 1 ~= 0 or base + #roles > #C.keys then
    error('redisgate: no keys after ' .. tostring(base))
  end
  s = {}
  for i, role in ipairs(roles) do
    s[role] = C.keys[base + i]
  end
  s.raw = redis.call('GET', s.state)
  local b = {}
  if s.raw then
    b = cmsgpack.unpack(s.raw)
    if type(b) ~= 'table' then
      error('redisgate: the record of ' .. s.state .. ' is not a table')
    end
  end
  if b.v ~= RECORD_VERSION then
    for f, v in pairs(FRESH) do
      if type(b[f]) ~= type(v) then
        b[f] = v
      end
    end
    b.bk = no_buckets()
  end
  s.b = b
  C.src[base] = s
  return s
end

-- src is a source's state (from its configuration), ten a tenant's.
local function src(c)
  return group(c.base, SOURCE)
end

local function ten(tc)
  local t = group(tc.base, TENANT)
  t.ttl = tc.ttl
  return t
end

-- scope reads the scope's progress and marker, once per call.
local function scope()
  local v = redis.call('MGET', C.keys[1], C.keys[2])
  C.marker = v[2]
  if not C.progress_set then
    C.progress = tonumber(v[1]) or 0
  end
end

-- marker is the scope's marker (false: none).
local function marker()
  if C.marker == nil then
    scope()
  end
  return C.marker
end

-- progress is the scope's last success (0: never).
local function progress()
  if C.progress == nil then
    scope()
  end
  return C.progress
end

local function set_progress(now)
  C.progress, C.progress_set = now, true
end

-- each_page calls f with the items of list, PAGE at a time (unpack's limit).
local PAGE = 1000
local function each_page(list, f)
  for i = 1, #list, PAGE do
    f(unpack(list, i, math.min(i + PAGE - 1, #list)))
  end
end

-- keep_until writes field = value into hash k (the value starts with
-- until, in ms): k lives until then at least, and past TOMBSTONES fields
-- the ones whose until passed are forgotten.
local function keep_until(k, field, value, untl, now)
  redis.call('HSET', k, field, value)
  if redis.call('PTTL', k) < untl - now then
    redis.call('PEXPIRE', k, untl - now)
  end
  if redis.call('HLEN', k) > TOMBSTONES then
    local all, old = redis.call('HGETALL', k), {}
    for i = 1, #all, 2 do
      if (tonumber(string.match(all[i + 1], '^%-?%d+')) or 0) <= now then
        old[#old + 1] = all[i]
      end
    end
    each_page(old, function(...) redis.call('HDEL', k, ...) end)
  end
end

-- flush writes back what the call changed: each record that differs from
-- what was read (persisted unless CLOSED without an override: an OPEN
-- breaker must never expire into a fresh CLOSED one), the TTLs of the keys
-- the quota wrote, and the scope's progress.
local function flush()
  local ttl = C.h.ttl
  for _, s in pairs(C.src) do
    local b = s.b
    if s.took then
      redis.call('PEXPIRE', s.leases, ttl)
    end
    local raw = cmsgpack.pack(b)
    if raw ~= s.raw then
      if b.state == CLOSED and b.override == O_NONE then
        redis.call('SET', s.state, raw, 'PX', s.ttl or ttl)
      else
        redis.call('SET', s.state, raw)
      end
    end
    if s.logged then
      local m = MINUTE + SLACK
      redis.call('PEXPIRE', s.minute, m)
      redis.call('PEXPIRE', s.tokens, m)
    end
  end
  if C.progress_set then
    redis.call('SET', C.keys[1], C.progress, 'PX', ttl)
  end
end
