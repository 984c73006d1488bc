-- lib.lua: the breaker and quota state machines of gate/breaker.go and
-- gate/quota.go, ported line by line. Every function that follows a Go
-- function says so with a "twin:" comment naming it (a test checks that
-- it exists); keep them in step. The constants (CLOSED, R_CIRCUIT_OPEN,
-- MINUTE, ...) and the layouts of arguments and replies (ADMIT, CAND,
-- EV, ...; see layout.go) come from a prelude that Go writes from its own
-- tables (see scripts.go). The library is prelude .. lib .. the bodies.
--
-- Times are whole Unix milliseconds. Lua numbers are doubles: every integer
-- here stays far below 2^53, and integers are written back to Redis with
-- I() so that no value is ever printed in exponent form.

local function I(n)
  return string.format('%d', n)
end

-- BYTE is string.byte(s, 1) of every one-byte string s, a table lookup
-- instead of a call: an op's map and cmap (one byte per source) are read
-- in every op of a batch. Made by the first batch (batch.lua: string is
-- missing while the library loads); the library-level local that
-- OC_NONE and OC_FORCED gave up (scripts.go).
local BYTE = nil

-- CALL is what the ops of one batch (batch.lua) share while it runs, nil
-- outside one: the server's TIME, read once (now), the scope's keys read
-- or written with GET and SET (got: key -> value, false for none, a number
-- once get_ms or set_ms had it; put: key -> the TTL of the value in got,
-- written once when the batch ends), the sources' state hashes (h: see
-- b_load), what the ops will read of each state hash (pre: key -> its
-- BATCH_PRE block, see b_first; argv, the batch's arguments), and the
-- batch's keys as tables (scope, src: see batch_src), and whether an
-- admit read the scope's marker and progress (scoped: see admit.lua's
-- scope_read). It is a
-- library-level local, which outlives a call: batch sets it at its start
-- and clears it at its end.
local CALL = nil

-- now_ms is the time of the decision: the server's TIME, or the time a test
-- clock passed in (0 in production; see the package documentation).
local function now_ms(arg)
  if arg == 0 and CALL and CALL.now then
    return CALL.now -- a batch's op, in production
  end
  if arg ~= 0 then -- (a test clock's; 0's tonumber is 0: the server's TIME)
    local n = tonumber(arg)
    if n ~= nil and n ~= 0 then
      return n
    end
  end
  if CALL and CALL.now then
    return CALL.now
  end
  -- TIME's seconds and microseconds, whole numbers as strings: Lua's
  -- arithmetic reads them as tonumber would, without its call, and the
  -- microseconds' whole milliseconds are exact as idiv's (no math.floor).
  local t = redis.call('TIME')
  local us = t[2] + 0
  local n = t[1] * 1000 + (us - us % 1000) / 1000
  if CALL then
    CALL.now = n
  end
  return n
end

-- get is GET key (false for none), read once per batch.
local function get(key)
  if not CALL then
    return redis.call('GET', key)
  end
  local v = CALL.got[key]
  if v == nil then
    v = redis.call('GET', key)
    CALL.got[key] = v
  end
  return v
end

-- get_ms is GET key as a number of milliseconds (0 for none), read once per
-- batch and kept as a number.
local function get_ms(key)
  if not CALL then
    return tonumber(redis.call('GET', key) or 0)
  end
  local v = CALL.got[key]
  if type(v) ~= 'number' then
    v = tonumber(get(key) or 0)
    CALL.got[key] = v
  end
  return v
end

-- set_ms is SET key ms PX ttl (both numbers), written once per batch (its
-- last value; get_ms reads it meanwhile).
local function set_ms(key, ms, ttl)
  if not CALL then
    redis.call('SET', key, I(ms), 'PX', I(ttl))
    return
  end
  CALL.got[key] = ms
  CALL.put[key] = ttl
end

-- PAGE_H bounds the fields one HSET or HDEL of a batch's write-back
-- carries (Lua's unpack has a limit).
local PAGE_H = 256

-- idiv is Go's integer division a / b for b > 0 (truncating toward zero),
-- exact even where a / b in floating point would round to the next integer.
-- For 0 <= a < 2^53 and b a whole number it is (a - a % b) / b, exact:
-- a % b (Lua's, a - floor(a / b) * b) is exact there, by Sterbenz's
-- lemma, and in [0, b). (a / b could only round up to the next integer,
-- making a % b negative, at a >= 2^53 or a fractional a; the r >= 0 test
-- sends any such case to the correction below, which the rest keeps.)
-- No call of math.floor: b_record does the same without the call of
-- idiv, its b a bucket width, whole. A fractional b, which only a hostile
-- argument holds, takes math.floor's way, whose quotient is whole (review
-- lua9r).
local function idiv(a, b)
  if a < 0 then
    return -idiv(-a, b)
  end
  local r = a % b
  if a < 2 ^ 53 and r >= 0 and r < b and b % 1 == 0 then
    return (a - r) / b
  end
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function gmax(a, b)
  if a > b then return a end
  return b
end

-- read returns the block of layout L that starts after argv[base] as a
-- table of its named fields: L.read, generated with the layout.
local function read(L, argv, base)
  return L.read(argv, base)
end

-- L.T is a binary layout's one table, refilled by every L.into_at(s, pos,
-- L.T): no table per op (a table of 19 named fields costs Redis more than
-- unpacking them). Only for the blocks an op reads once, at the top of its
-- run, and whose table nothing keeps past the op or a candidate's turn of
-- the walk: SETTLE for the settle's walk (b_settle's o), the scope's and
-- a lone call's sources' configurations (CONF_H, SRC_CONF; CONF_H.T is
-- also kept across calls, as conf_open's memo of the argument it holds,
-- CONF_H.HELD, which only conf_open refills). The ops'
-- heads on their common path (BATCH_OP, ADMIT, SETTLE) are unpacked into
-- locals instead, with the generated format (L.FMT): a table's field
-- written and read by name costs more than a register (docs/performance.md,
-- ninth session). The hot replies (ADMIT_R, SETTLE_R) are packed from their
-- fields' values, in layout order, through L.pack_memo, which keeps the
-- last record packed and its string (upvalues of its own: what a reply
-- already said, nothing of a call's state; layout.go's writeBin).

-- op_block is the position in s of the k-th block (from 1) of an op's one
-- argument (admit's, settle's: layout.go's opArg), which starts at
-- position p0 of s: the positions of its blocks, 4 bytes each, then the
-- blocks, read with L.into_at(s, pos, t) and the like.
local function op_block(s, p0, k)
  return p0 + S_UNPACK('<I4', s, p0 + 4 * (k - 1))
end

-- op_check raises unless an op's argument holds the n blocks its head
-- names: the first block's position (at, from p0) is the size of the
-- position table, 4 bytes per block. (A position past the argument's end
-- raises where a block is read there.)
local function op_check(at, p0, n)
  if at - p0 ~= 4 * n then
    error('redisgate: an op argument of ' .. I((at - p0) / 4) .. ' blocks, want ' .. I(n))
  end
end

-- The CONF argument of the call that runs (layout.go's confArgs): what
-- its ops share, its blocks one after another, the scope's CONF_H and then
-- SRC_CONF blocks. The scope's block is read into CONF_H.T. In a batch
-- CONF_SRC holds every SRC_CONF block read, by number; in a call of its
-- own (CONF_SRC nil) its op reads them in order, the first into
-- CONF_H.ONE_T (op_conf's memo, kept across calls of the same argument),
-- the others each into SRC_CONF.T, and CONF_S is the argument, CONF_I the number of the block read last and
-- CONF_AT where the next starts. Set by conf_open at the start of every
-- admit and settle called alone and of every batch; library-level locals,
-- as CALL.
local CONF_S, CONF_I, CONF_AT, CONF_SRC = nil, 0, 0, nil

-- conf_open reads the call's CONF argument s: the scope's block, and in a
-- batch (batch true) every SRC_CONF block, at most max (the ops' sources).
-- What the same argument's bytes would give again is not read again (one
-- scope's calls send the same argument while its configuration stays):
-- CONF_H.HELD is the argument whose scope block CONF_H.T holds (HELD_AT
-- where its first SRC_CONF starts), CONF_H.LAST the last batch's argument
-- and CONF_H.LAST_SRC its SRC_CONF blocks, which nothing writes into but
-- bucket_width's memo of their own window (and LAST_MAX, the max they
-- were read within). Fields of CONF_H, not library-level locals: the chunk
-- is at Lua 5.1's 200. The last ones only: bounded. Each is forgotten
-- before it is refilled and named again only once whole (the key stored
-- last, a statement of its own: Lua 5.1 stores a multiple assignment right
-- to left), so that an error between (a kill's hook) leaves no key paired
-- with another argument's tables.
local function conf_open(s, batch, max)
  if type(s) ~= 'string' then
    error('redisgate: no CONF argument')
  end
  local at = CONF_H.HELD_AT
  if s ~= CONF_H.HELD then
    CONF_H.HELD = nil -- (CONF_H.T refilled: held again once read whole)
    local _
    _, at = CONF_H.into_at(s, 1, CONF_H.T)
    CONF_H.HELD_AT = at
    CONF_H.HELD = s
  end
  CONF_S, CONF_I, CONF_AT, CONF_SRC = s, 0, at, nil
  if batch then
    if s == CONF_H.LAST and max == CONF_H.LAST_MAX then
      CONF_SRC = CONF_H.LAST_SRC
      return
    end
    CONF_H.LAST = nil
    local src = {}
    while at <= #s do
      if #src == max then
        error('redisgate: a CONF argument of more than ' .. I(max) .. ' source configurations')
      end
      src[#src + 1], at = SRC_CONF.read_next(s, at)
    end
    CONF_SRC = src
    CONF_H.LAST_SRC, CONF_H.LAST_MAX = src, max
    CONF_H.LAST = s
  end
end

-- op_conf is the SRC_CONF block of an op's i-th source (from 1): in a
-- batch the one its cmap names, read once per batch and shared by its ops
-- and by every later batch of the same CONF argument (conf_open's memo:
-- nothing writes into it but bucket_width's memo of its own window); in a
-- call of its own the i-th of the call's,
-- in SRC_CONF.T, which the next op_conf refills: an op keeps it no longer
-- than its source's turn (as CAND.T, see L.T) and asks for its sources in
-- order. A lone call's first source is read into CONF_H.ONE_T instead, and
-- not read again while the calls send the same argument (CONF_H.ONE, its
-- argument, ONE_AT where the second starts: a memo as conf_open's, kept
-- the same way; fields of CONF_H, as conf_open's: a settle alone and an
-- admit of one candidate read only that one: docs/performance.md, "less
-- Lua per lone script call").
local function op_conf(cmap, i)
  if cmap then
    local t = CONF_SRC[string.byte(cmap, i) or 0]
    if not t then
      error('redisgate: an op names source configuration ' .. tostring(string.byte(cmap, i)) .. ' of ' .. I(#CONF_SRC))
    end
    return t
  end
  if i == 1 and CONF_I == 0 and CONF_S == CONF_H.ONE then
    CONF_I, CONF_AT = 1, CONF_H.ONE_AT
    return CONF_H.ONE_T
  end
  if i < CONF_I then
    error('redisgate: source configuration ' .. I(i) .. ' asked for after ' .. I(CONF_I))
  end
  while CONF_I < i do
    if CONF_AT > #CONF_S then
      error('redisgate: an op names source configuration ' .. I(i) .. ' of ' .. I(CONF_I))
    end
    if CONF_I == 0 then
      CONF_H.ONE = nil -- (ONE_T refilled: held again once read whole)
      local t = CONF_H.ONE_T or {}
      CONF_H.ONE_T = t
      local _, at = SRC_CONF.into_at(CONF_S, CONF_AT, t)
      CONF_I, CONF_AT, CONF_H.ONE_AT = 1, at, at
      CONF_H.ONE = CONF_S
    else
      local _, at = SRC_CONF.into_at(CONF_S, CONF_AT, SRC_CONF.T)
      CONF_I, CONF_AT = CONF_I + 1, at
    end
  end
  return CONF_I == 1 and CONF_H.ONE_T or SRC_CONF.T
end

-- block is the base of the i-th block (from 1) of layout L after a head of
-- layout H: read(L, argv, block(H, L, i)).
local function block(H, L, i)
  return H.WIDTH + L.WIDTH * (i - 1)
end

-- pack is the reply record of layout L from t's named fields: L.pack,
-- generated with the layout. A packed record (admit's and settle's replies,
-- events, rejections; see layout.go's packedReply) is one
-- string, its numbers and strings in layout order, a list of them their
-- concatenation; another record is an array. Every field is a number, a
-- string or an array: a boolean would not survive the reply.
local function pack(L, t)
  return L.pack(t)
end

---------------------------------------------------------------- breaker

-- twin: gate.cooldownMs
-- base << (reopens-1), capped at max, without overflow.
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

-- A source's state is one hash (SRC_KEYS.state): the record BREC in field
-- BREC.FIELD (the breaker's scalars and the count of its leases), the window
-- WIN in field WIN.FIELD (a table of BUCKETS rows: index, calls, fails), and
-- one field LEASE .. permit per lease (its end, packed as a double). Records
-- are read whole with one struct.unpack and written with one struct.pack,
-- the window a row at a time (see layout.go). A missing hash is the zero
-- Breaker, CLOSED at epoch 0, with no lease. A script reads the window only
-- when it counts (Admit never does) and writes back, in one HSET, only the
-- records that changed.

-- b_keep marks the breaker of the cache entry c as saved: what a call of
-- its own would have written to Redis by now (b_save, q_sweep). An op of a
-- batch that raises leaves the breakers as they were saved (call_restore),
-- as a call of its own that raises leaves what it wrote: the changes it
-- made to the table after its last save are not written back.
-- The copy is into the same table each time (no garbage), and of the
-- breaker's own fields only when they may have changed since the last
-- (b.bdirty, which every function that sets one of them sets: b_enter,
-- b_reset_round, b_record, b_open, b_settle, b_apply, restore.lua); the
-- fields aside (the lease counts, the TTL's mark), which most ops change,
-- every time. A copy of the whole record per save was ~5 k instructions,
-- a tenth of a settle's (docs/performance.md). c.saved starts with the
-- fields aside alone where b_first read the record (c.srec, the record's
-- string, nil for none: the other fields are its), and holds every field
-- from the first copy of a changed breaker on (c.srec false).
-- With now, it is also b_save's TTL mark for a CLOSED breaker without an
-- override (idle_ttl, set again once an eighth of it has passed): the
-- whole of b_save in the batch's cache for the early exits' case
-- (admit.lua, settle.lua), which write their lease field themselves.
local function b_keep(c, now, idle_ttl)
  local b = c.b
  if now and (b.expire_at == 0 or now - b.expire_at >= idle_ttl / 8) then
    b.expire_at, c.ttl, c.idle_ttl = now, 1, idle_ttl
  end
  if b.bdirty then
    BREC.copy(b, c.saved)
    b.bdirty, c.vdirty, c.srec = false, true, false
  else
    local d = c.saved
    d.held, d.lease_min, d.expire_at = b.held, b.lease_min, b.expire_at -- (BREC.copy_aside's)
  end
  c.saved_win, c.saved_wold = b.win, b.wold
end

-- call_restore sets every breaker of the batch back to its last b_keep,
-- after an op raised. (A settle run's successes counted and not yet in
-- the window are not in the window b_keep saved either: settle_run and
-- BATCH_RUNS.flush record them and set saved_win again.)
local function call_restore()
  for _, c in pairs(CALL.h) do
    local b = c.b
    if c.srec ~= false then -- (saved holds the fields aside alone: the others are the record read, b_first)
      for k, v in pairs(BREC.read(c.srec)) do
        b[k] = v
      end
    end
    for k, v in pairs(c.saved) do
      b[k] = v
    end
    b.win, b.wold, b.lease_f, b.lease_v = c.saved_win, c.saved_wold, false, false
    b.bdirty, c.vdirty = false, true
  end
end

-- b_cached is b_load within a batch (CALL), where each state hash is a
-- write-back cache, CALL.h[key]:
-- the breaker b loaded once (the same table for every op of the batch),
-- the hash's fields read or written (f: field -> value, false for none),
-- those to write (dirty), and the TTL to give it (ttl, as b_save's); b_load
-- reads only the fields it lacks, b_save and h_del only change the cache,
-- and h_flush writes it back, when the batch ends and before anything reads
-- the hash whole (q_sweep).
-- admit.lua's and settle.lua's early exits repeat this for their cases: change all three.
local function b_cached(key, window, lease)
  local c = CALL.h[key]
  local b = c.b
  local field = lease and LEASE .. lease
  local need_lease, need_window = field and c.f[field] == nil, window and not b.win
  local win
  if need_lease and need_window then
    local v = redis.call('HMGET', key, field, WIN.FIELD)
    c.f[field], win = v[1], v[2]
  elseif need_lease then
    c.f[field] = redis.call('HGET', key, field)
  elseif need_window then
    win = redis.call('HGET', key, WIN.FIELD)
  end
  if need_window then
    b.wold = win
    b.win = win or WIN.ZERO
  end
  b.lease_of, b.lease_k = field and c.f[field] or false, field
  b.lease_f, b.lease_v = false, false
  return b
end

-- b_first is a batch's first load of the state hash key: the breaker and,
-- in the same HMGET, what the batch's ops will read of the hash (pre, the
-- source's BATCH_PRE block: the window if a settle of the batch counts, and
-- the lease field of each op's permit, argv[pre.from .. pre.to]), into the
-- hash's cache, where b_cached finds them.
local function b_first(key, pre)
  local argv = CALL.argv
  local v, at
  if pre.window == 1 then
    v = redis.call('HMGET', key, BREC.FIELD, WIN.FIELD, unpack(argv, pre.from, pre.to))
    at = 2 -- v[at + 1] is the first lease's
  else
    v = redis.call('HMGET', key, BREC.FIELD, unpack(argv, pre.from, pre.to))
    at = 1
  end
  local b = BREC.read(v[1] or nil)
  b.key = key
  b.raw = v[1]
  b.bdirty = false -- (saved below as b_keep would: its fields aside, the others srec's)
  if pre.window == 1 then
    b.wold = v[2]
    b.win = v[2] or WIN.ZERO
  end
  local f = {}
  -- (saved as b_keep copies aside, its other fields the record read, srec:
  -- the breaker's record is not unpacked twice; the first b_keep of a
  -- changed breaker copies it whole, srec false)
  local c = {
    b = b, f = f, dirty = {}, ttl = 0, idle_ttl = 0, saved = { held = b.held, lease_min = b.lease_min,
    expire_at = b.expire_at }, srec = v[1] or nil, saved_win = b.win, saved_wold = b.wold, vrec = false, vdirty = true,
  }
  for i = pre.from, pre.to do
    f[argv[i]] = v[at + i - pre.from + 1]
  end
  CALL.h[key] = c
end

-- b_load reads the breaker: with window (a script that will count), its
-- window too, and with lease a permit's lease field, in the same HMGET; the
-- lease's value is b.lease_of (false when the permit holds none). Within a
-- batch, the first load of a hash makes its cache (b_first, b_cached).
local function b_load(key, window, lease)
  if CALL and not CALL.h[key] and CALL.pre[key] then
    b_first(key, CALL.pre[key])
  end
  if CALL and CALL.h[key] then
    return b_cached(key, window, lease)
  end
  local v
  if window and lease then
    v = redis.call('HMGET', key, BREC.FIELD, LEASE .. lease, WIN.FIELD)
  elseif window then
    v = redis.call('HMGET', key, BREC.FIELD, WIN.FIELD)
    v[3] = v[2]
    v[2] = false
  elseif lease then
    v = redis.call('HMGET', key, BREC.FIELD, LEASE .. lease)
  else
    v = { redis.call('HGET', key, BREC.FIELD) }
  end
  local b = BREC.read(v[1] or nil)
  b.key = key
  b.raw = v[1]
  b.bdirty = true -- (for the first b_keep, in a batch)
  b.lease_of, b.lease_k = v[2] or false, lease and LEASE .. lease
  if window then
    b.wold = v[3]
    b.win = v[3] or WIN.ZERO
  end
  if CALL then
    local c = {
      b = b, f = {}, dirty = {}, ttl = 0, idle_ttl = 0, saved = BREC.read(nil), srec = false, saved_win = false,
      saved_wold = false, vrec = false, vdirty = true,
    }
    if lease then
      c.f[LEASE .. lease] = v[2]
    end
    b_keep(c)
    CALL.h[key] = c
  end
  return b
end

-- b_buckets makes the window b.win readable.
local function b_buckets(b)
  if b.win then
    return
  end
  b.wold = redis.call('HGET', b.key, WIN.FIELD)
  b.win = b.wold or WIN.ZERO
end

-- b_clear_buckets zeroes every bucket, without reading them first.
local function b_clear_buckets(b)
  if b.wold == nil then
    b.wold = true -- unknown: written whatever it was
  end
  b.win = WIN.ZERO
end

-- b_changed appends to set the fields of b's hash that changed since they
-- were read or last written (the breaker record, its window), and takes
-- them as written. A missing record saved unchanged writes nothing.
local function b_changed(b, set)
  local rec = BREC.pack(b)
  if rec ~= (b.raw or BREC.pack(BREC.read(nil))) then
    set[#set + 1] = BREC.FIELD
    set[#set + 1] = rec
    b.raw = rec
  end
  if b.win and b.win ~= b.wold and (b.wold or b.win ~= WIN.ZERO) then
    set[#set + 1] = WIN.FIELD
    set[#set + 1] = b.win
    b.wold = b.win
  end
end

-- b_save writes back what changed, with the lease q_take queued (the field
-- b.lease_f, its value b.lease_v; false when none), in one HSET. A CLOSED breaker without an override gets the idle
-- TTL (garbage collection of abandoned sources), set again once an eighth
-- of it has passed (b.expire_at; without now, every time); an OPEN or
-- HALF_OPEN one, or one an operator set, is PERSISTed: its state must never
-- expire into a fresh CLOSED breaker.
-- admit.lua's and settle.lua's early exits do this for their case (a
-- breaker CLOSED without an override, in the batch's cache) with
-- b_keep(c, now, idle_ttl): change both.
local function b_save(b, idle_ttl, now)
  local lf, lv = b.lease_f, b.lease_v
  b.lease_f, b.lease_v = false, false
  local ttl = 0 -- 1: PEXPIRE, -1: PERSIST
  if b.state == CLOSED and b.override == NO_OVERRIDE then
    if not now or b.expire_at == 0 or now - b.expire_at >= idle_ttl / 8 then
      ttl, b.expire_at = 1, now or 1
    end
  elseif b.expire_at ~= 0 or not now then
    ttl, b.expire_at = -1, 0
  end
  local c = CALL and CALL.h[b.key]
  if c and c.b == b then
    -- In a batch: into the cache, written by h_flush.
    if lf then
      c.f[lf] = lv
      c.dirty[lf] = true
    end
    if ttl ~= 0 then
      c.ttl, c.idle_ttl = ttl, idle_ttl
    end
    b_keep(c)
    return
  end
  local set = {}
  if lf then
    set[1], set[2] = lf, lv
  end
  b_changed(b, set)
  if #set == 0 then
    return
  end
  redis.call('HSET', b.key, unpack(set))
  if ttl == 1 then
    redis.call('PEXPIRE', b.key, I(idle_ttl))
  elseif ttl == -1 then
    redis.call('PERSIST', b.key)
  end
end

-- h_flush writes back what a batch changed in the state hash key (c =
-- CALL.h[key]): the fields set and deleted, the breaker and its window
-- where they changed, and the TTL of the last b_save that set one. With
-- last (the batch's end, call_flush: c is not used again) c keeps its
-- list of fields to write, not made again empty.
local function h_flush(key, c, last)
  local b, set, del, cf, ns, nd = c.b, {}, {}, c.f, 0, 0
  for f in pairs(c.dirty) do
    local v = cf[f]
    if v then
      set[ns + 1], set[ns + 2], ns = f, v, ns + 2
    else
      del[nd + 1], nd = f, nd + 1
    end
  end
  if not last then
    c.dirty = {}
  end
  b_changed(b, set)
  ns = #set
  -- (one command each where it holds every field: a batch's common case,
  -- without the pages' math.min)
  if nd > PAGE_H then
    for i = 1, nd, PAGE_H do
      redis.call('HDEL', key, unpack(del, i, math.min(i + PAGE_H - 1, nd)))
    end
  elseif nd > 0 then
    redis.call('HDEL', key, unpack(del))
  end
  if ns > 2 * PAGE_H then
    for i = 1, ns, 2 * PAGE_H do
      redis.call('HSET', key, unpack(set, i, math.min(i + 2 * PAGE_H - 1, ns)))
    end
  elseif ns > 0 then
    redis.call('HSET', key, unpack(set))
  end
  if ns > 0 and c.ttl ~= 0 then
    if c.ttl == 1 then
      redis.call('PEXPIRE', key, I(c.idle_ttl))
    else
      redis.call('PERSIST', key)
    end
  end
  c.ttl = 0
end

-- call_flush writes what the batch kept: the state hashes (h_flush) and
-- what set_ms set.
local function call_flush()
  for key, c in pairs(CALL.h) do
    h_flush(key, c, true)
  end
  for key, ttl in pairs(CALL.put) do
    redis.call('SET', key, I(CALL.got[key]), 'PX', I(ttl))
  end
end

-- h_del deletes field of the state hash key (through the batch's cache)
-- and says whether it was there.
-- settle.lua's early exit repeats this for its case (a batch's common success): change both.
local function h_del(key, field)
  local c = CALL and CALL.h[key]
  if not c then
    return redis.call('HDEL', key, field) == 1
  end
  local v = c.f[field]
  if v == nil then
    v = redis.call('HGET', key, field)
  end
  c.f[field] = false
  c.dirty[field] = true
  return v and true or false
end

-- NO_EVENTS is the event list of a transition that caused none: shared,
-- never appended to (callers only read event lists).
local NO_EVENTS = {}

-- twin: gate.(*Breaker).event
local function b_event(b, kind, from, cause)
  return {
    kind = kind, from = from, to = b.state, cause = cause, epoch = b.epoch, reopens = b.reopens,
    cooldown = 0, permit = '', override = NO_OVERRIDE, actor = '', why = '',
  }
end

-- twin: gate.(*Breaker).check
local function b_check(b, now)
  if b.override == FORCED_OPEN then
    return R_FORCED_OPEN, 0
  elseif b.override == FORCED_CLOSED or b.override == DISABLED then
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
-- Returns the gate.Entry's fields (allowed, probe, epoch, reason, wait),
-- and the events.
-- admit.lua's early exit repeats this for its case (a batch's common admit): change both.
local function b_enter(b, p, permit, now)
  local reason, wait = b_check(b, now)
  if reason ~= R_NONE then
    return false, false, b.epoch, reason, wait, NO_EVENTS
  end
  if b.override ~= NO_OVERRIDE or b.state == CLOSED then
    return true, false, b.epoch, R_NONE, 0, NO_EVENTS
  end
  b.bdirty = true
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
  b.bdirty = true
  b.probe, b.probe_until = '', 0
  b.consecutive = 0
  b_clear_buckets(b)
end

-- twin: gate.bucketWidth
-- p keeps it for its window (p.wid for p.wwin): a batch's SRC_CONF is
-- one table for all its ops and the later batches of its argument
-- (conf_open), a lone call's first source's is kept across the calls of
-- its argument (op_conf's CONF_H.ONE_T), its others refilled per source;
-- p.wid stays right across a refill, since it is keyed by p.wwin ==
-- p.window.
local function bucket_width(p)
  if p.wwin ~= p.window then
    p.wwin, p.wid = p.window, gmax(idiv(p.window, BUCKETS), 1)
  end
  return p.wid
end

-- twin: gate.(*Breaker).record
-- (bucket_width, b_buckets and idiv inline where they would return at
-- once: a settle's cost is its Lua calls, docs/performance.md.)
-- k outcomes at once (1 per settle; settle_run's run of successes at one
-- now, one bucket, records its count once: its calls + k, one row).
local function b_record(b, p, now, fail, k)
  local w = p.wwin == p.window and p.wid or bucket_width(p)
  if b.width ~= w then
    b_clear_buckets(b)
    b.width, b.bdirty = w, true
  end
  if not b.win then
    b_buckets(b)
  end
  local r, idx = now % w, nil
  if now >= 0 and now < 2 ^ 53 and r >= 0 and r < w then -- idiv(now, w)'s first case
    idx = (now - r) / w
  else
    idx = idiv(now, w)
  end
  local slot = idx % BUCKETS -- idx - idiv(idx, BUCKETS) * BUCKETS, as idiv's first case
  if not (idx >= 0 and idx < 2 ^ 53 and slot >= 0) then
    slot = idx - idiv(idx, BUCKETS) * BUCKETS
  end
  local was, oi, oc, of = b.win, WIN.get(b.win, slot)
  local index, calls, fails = oi, oc, of
  if index ~= idx then
    index, calls, fails = idx, 0, 0
  end
  calls = calls + k
  if fail then
    fails = fails + k
  end
  b.win = WIN.put(b.win, slot, index, calls, fails)
  if b.cwin == was and b.cidx == idx then
    -- b_counts' memo, carried over this change of one row: the new row
    -- counts at idx, the old one did if it was in range.
    if oi > idx - BUCKETS and oi <= idx then
      calls, fails = calls - oc, fails - of
    end
    b.cwin, b.ccalls, b.cfails = b.win, b.ccalls + calls, b.cfails + fails
  end
end

-- twin: gate.(*Breaker).Counts
-- The counts are a function of the window (b.win, a string) and the
-- bucket index idx alone; b keeps the last (b.cwin, b.cidx: b.ccalls,
-- b.cfails, not stored), which b_record carries over its own change, so
-- that the settles of a batch (one window, one TIME) count the window's
-- rows once, not once per settle.
local function b_counts(b, p, now)
  local w = bucket_width(p)
  if b.width ~= w then
    return 0, 0
  end
  b_buckets(b)
  local idx = idiv(now, w)
  if b.cwin == b.win and b.cidx == idx then
    return b.ccalls, b.cfails
  end
  local calls, fails = 0, 0
  local v = WIN.all(b.win)
  for at = 0, (BUCKETS - 1) * WIN.COLS, WIN.COLS do
    local i = v[at + WIN.INDEX]
    if i > idx - BUCKETS and i <= idx then
      calls = calls + v[at + WIN.CALLS]
      fails = fails + v[at + WIN.FAILS]
    end
  end
  b.cwin, b.cidx, b.ccalls, b.cfails = b.win, idx, calls, fails
  return calls, fails
end

-- twin: gate.(*Breaker).open
local function b_open(b, p, now, floor, cause)
  local from = b.state
  b_reset_round(b) -- (b.bdirty)
  b.reopens = b.reopens + 1
  b.state = OPEN
  b.opened_at = now
  b.open_cause = OC_FAILURES
  if cause == C_SOURCE_DEAD then
    b.open_cause = OC_SOURCE_DEAD
  end
  b.open_until = now + gmax(cooldown_ms(p.cooldown, p.max_cooldown, b.reopens), floor)
  local e = b_event(b, E_TRANSITION, from, cause)
  e.cooldown = b.open_until - now
  return e
end

-- twin: gate.(*Breaker).stale
local function b_stale(b, o)
  local e = b_event(b, E_STALE, b.state, C_NONE)
  e.permit = o.permit
  return F_STALE, { e }
end

-- twin: gate.(*Breaker).Settle
-- o = {permit, epoch, probe, verdict, floor}.
-- settle.lua's early exit repeats this for its case (a batch's common success): change both.
local function b_settle(b, p, o, now)
  if b.override == DISABLED then
    if o.probe and b.probe == o.permit and o.epoch == b.epoch then
      b.probe, b.probe_until, b.bdirty = '', 0, true
    end
    return F_IGNORED, NO_EVENTS
  end
  if o.epoch ~= b.epoch or (o.probe and (b.state ~= HALF_OPEN or b.probe ~= o.permit)) then
    return b_stale(b, o)
  end
  local floor = o.floor
  if o.probe then
    if o.verdict == V_SUCCESS then
      b_reset_round(b) -- (b.bdirty)
      b.reopens = 0
      b.state = CLOSED
      return F_APPLIED, { b_event(b, E_TRANSITION, HALF_OPEN, C_PROBE_SUCCEEDED) }
    elseif o.verdict == V_FAILURE or o.verdict == V_FORCE_OPEN then
      local cause = C_PROBE_FAILED
      if o.verdict == V_FORCE_OPEN then
        cause = C_SOURCE_DEAD
      end
      return F_APPLIED, { b_open(b, p, now, floor, cause) }
    end
    b.probe, b.probe_until, b.bdirty = '', 0, true
    local e = b_event(b, E_PROBE_RELEASED, HALF_OPEN, C_NONE)
    e.permit = o.permit
    return F_NO_VERDICT, { e }
  end
  if b.state == CLOSED then
    if o.verdict == V_SUCCESS then
      b_record(b, p, now, false, 1)
      if b.consecutive ~= 0 then
        b.consecutive, b.bdirty = 0, true
      end
      return F_APPLIED, NO_EVENTS
    elseif o.verdict == V_FAILURE then
      b_record(b, p, now, true, 1)
      b.consecutive, b.bdirty = b.consecutive + 1, true
      if b.consecutive >= p.fail_threshold then
        return F_APPLIED, { b_open(b, p, now, floor, C_CONSECUTIVE_FAILURES) }
      end
      local calls, fails = b_counts(b, p, now)
      if calls >= p.min_calls and fails / calls >= p.fail_rate then
        return F_APPLIED, { b_open(b, p, now, floor, C_FAILURE_RATE) }
      end
      return F_APPLIED, NO_EVENTS
    elseif o.verdict == V_FORCE_OPEN then
      return F_APPLIED, { b_open(b, p, now, floor, C_SOURCE_DEAD) }
    end
    return F_NO_VERDICT, NO_EVENTS
  elseif b.state == OPEN then
    -- Admitted before the breaker opened: only a dead-source verdict may
    -- make the opening longer, never shorter, never another reopening.
    if o.verdict == V_FORCE_OPEN then
      local untl = gmax(now + cooldown_ms(p.cooldown, p.max_cooldown, b.reopens), now + floor)
      if untl > b.open_until then
        b.open_until, b.bdirty = untl, true
        b.open_cause = OC_SOURCE_DEAD
        local e = b_event(b, E_TRANSITION, OPEN, C_SOURCE_DEAD)
        e.cooldown = untl - now
        return F_APPLIED, { e }
      end
      return F_APPLIED, NO_EVENTS
    end
  end
  return b_stale(b, o)
end

-- b_stored is b's state record as b_save last left it, for a reply: Go
-- reads the breaker from it and its window (b.win) and makes the view with
-- gate.(*Breaker).View itself (layout.go's breakerAt). Outside a batch
-- that is b.raw, which b_save's b_changed keeps ('' for a record missing
-- and unchanged: the zero breaker). Within one, the record packed the last
-- time the breaker's fields changed (c.vrec, packed again when b_keep or
-- call_restore marked them changed since, c.vdirty, or they changed after
-- the last b_keep, b.bdirty): its lease counts and TTL mark, which Go does
-- not read, may be those of an earlier op.
local function b_stored(b)
  local c = CALL and CALL.h[b.key]
  if not c then
    return b.raw or ''
  end
  if not c.vrec or c.vdirty or b.bdirty then
    c.vrec, c.vdirty = BREC.pack(b), false
  end
  return c.vrec
end

-- twin: gate.(*Breaker).Apply
-- nil for an unknown action.
local function b_apply(b, action, actor, why, now)
  b.bdirty = true
  local events = {}
  if action == A_FORCE_OPEN then
    b.override = FORCED_OPEN
  elseif action == A_FORCE_CLOSED then
    b.override = FORCED_CLOSED
  elseif action == A_DISABLE then
    b.override = DISABLED
  elseif action == A_CLEAR then
    b.override = NO_OVERRIDE
  elseif action == A_RESET then
    local from = b.state
    b.override = NO_OVERRIDE
    b_reset_round(b)
    b.reopens = 0
    b.state = CLOSED
    b.epoch = b.epoch + 1
    if from ~= CLOSED then
      events[#events + 1] = b_event(b, E_TRANSITION, from, C_RESET)
    end
  else
    return nil -- unknown: the script answers with an error
  end
  b.actor, b.why, b.override_at = actor, why, now
  if b.override == NO_OVERRIDE then
    b.actor, b.why = '', ''
  end
  local e = b_event(b, E_OVERRIDE, b.state, C_NONE)
  e.override, e.actor, e.why = b.override, actor, why
  table.insert(events, 1, e)
  return events
end

---------------------------------------------------------------- events

-- ev_reply is an event as the reply record EV; the source is the index of
-- the candidate (Admit) or 1.
local function ev_reply(src, e)
  e.src = src
  return pack(EV, e)
end

-- announce publishes, in the same script, the events other replicas must
-- hear at once: a breaker that opens or closes, and operators' changes.
-- The payload is the record ANN as a JSON array.
local function announce(channel, scope, source, e)
  if e.kind == E_OVERRIDE or (e.kind == E_TRANSITION and (e.to == OPEN or e.to == CLOSED)) then
    local a = { version = 1, scope = scope, source = source }
    for k, v in pairs(e) do
      a[k] = v
    end
    redis.call('PUBLISH', channel, cjson.encode(pack(ANN, a)))
  end
end

---------------------------------------------------------------- quota

-- A source's quota is its leases, in the state hash with the breaker (see
-- b_load: one field LEASE .. permit per held slot, and the record's held
-- and lease_min), and, where a limit per minute is set, two keys more
-- (under the scope's hash tag):
--   log:    ZSET seq -> admission time (ms)             (Quota.log)
--   data:   HASH t<seq> tokens, p<seq> permit, i<permit> seq (Quota.index),
--           sum (Quota.tokens), next (the last seq handed out)
-- seq is zero-padded so that admissions of the same millisecond sort in
-- admission order, as in Go's log.
local SLACK = 1000 -- ms a quota key outlives the minute it holds


-- twin: gate.addTokens
-- A token count saturating at [0, MAX_TOKEN_SUM], so that no
-- report can wrap the minute's sum (or print it in exponent form).
local function tadd(sum, n)
  local s = sum + n
  if s < 0 then return 0 end
  if s > MAX_TOKEN_SUM then return MAX_TOKEN_SUM end
  return s
end

local function q_sum(q)
  return tonumber(redis.call('HGET', q.data, 'sum') or 0)
end

-- PAGE bounds how many log entries or leases one Redis call reads or
-- deletes, so that a long minute never overflows Lua's unpack.
local PAGE = 256

-- q_sweep forgets the leases that ended by now, and counts the rest: b.held
-- and b.lease_min become exact. It runs only once lease_min has passed, so
-- about once per lease length while slots are taken and given back, and
-- saves the counts at once (HSET keeps the hash's TTL).
local function q_sweep(q, b, now)
  local c = CALL and CALL.h[q.state]
  if c then
    h_flush(q.state, c) -- the hash as the batch has it
  end
  local all = redis.call('HGETALL', q.state)
  local held, min, gone = 0, 0, {}
  for i = 1, #all, 2 do
    if string.byte(all[i], 1) == LEASE_BYTE then
      local e = S_UNPACK('<d', all[i + 1])
      if e <= now then
        gone[#gone + 1] = all[i]
        if all[i] == b.lease_k then
          b.lease_of = false -- the op's permit holds none now
        end
      else
        held = held + 1
        if min == 0 or e < min then
          min = e
        end
      end
    end
  end
  for i = 1, #gone, PAGE do
    redis.call('HDEL', q.state, unpack(gone, i, math.min(i + PAGE - 1, #gone)))
  end
  b.held, b.lease_min = held, min
  if c then
    for _, f in ipairs(gone) do
      c.f[f] = false
    end
    b_keep(c)
    return -- the breaker: written by h_flush
  end
  local rec = BREC.pack(b)
  if rec ~= b.raw and b.raw then
    redis.call('HSET', q.state, BREC.FIELD, rec)
    b.raw = rec
  end
end

-- twin: gate.(*Quota).expire
-- The log (and the minute's sum) is expired only when log is true: by the
-- walks that count it (a limit per minute). Elsewhere its expired entries
-- wait; every reading of the log skips them by time, and the keys' TTL
-- bounds them.
-- admit.lua's and settle.lua's early exits repeat this for their cases: change all three.
local function q_expire(q, b, now, log)
  if b.held > 0 and now >= b.lease_min then
    q_sweep(q, b, now)
  end
  if not log then
    return
  end
  local sum, changed = nil, false
  while true do
    local old = redis.call('ZRANGEBYSCORE', q.log, '-inf', I(now - MINUTE), 'LIMIT', 0, PAGE)
    if #old == 0 then
      break
    end
    sum = sum or q_sum(q)
    local fields = {}
    for _, m in ipairs(old) do
      fields[#fields + 1] = 't' .. m
      fields[#fields + 1] = 'p' .. m
    end
    local vals = redis.call('HMGET', q.data, unpack(fields))
    for k = 1, #fields, 2 do
      sum = tadd(sum, -tonumber(vals[k] or 0))
      if vals[k + 1] then
        fields[#fields + 1] = 'i' .. vals[k + 1]
      end
    end
    redis.call('HDEL', q.data, unpack(fields))
    redis.call('ZREM', q.log, unpack(old))
    changed = true
    if #old < PAGE then
      break
    end
  end
  if changed then
    redis.call('HSET', q.data, 'sum', I(sum))
  end
end

-- twin: gate.(*Quota).check
-- admit.lua's early exit repeats this for its case (a batch's common admit): change both.
local function q_check(q, b, l, ceiling, tokens, now)
  q_expire(q, b, now, l.rpm > 0 or l.tpm > 0)
  local in_flight = b.held
  if ceiling < l.max_concurrency and in_flight >= ceiling then
    return R_ADAPTIVE_PACED, 0
  end
  if in_flight >= l.max_concurrency then
    return R_RATE_LIMITED, 0
  end
  local live = 0
  if l.rpm > 0 then
    live = redis.call('ZCARD', q.log)
  end
  if l.rpm > 0 and live >= l.rpm then
    -- The (len-RPM)-th oldest admission must leave the minute first.
    local e = redis.call('ZRANGE', q.log, I(live - l.rpm), I(live - l.rpm), 'WITHSCORES')
    return R_RATE_LIMITED, tonumber(e[2]) + MINUTE - now
  end
  if l.tpm > 0 then
    local sum = q_sum(q)
    if sum + tokens > l.tpm then
      if tokens > l.tpm then
        return R_RATE_LIMITED, 0
      end
      local excess = sum + tokens - l.tpm
      -- Walk the minute oldest first, a page at a time.
      local start = 0
      while true do
        local es = redis.call('ZRANGE', q.log, start, start + PAGE - 1, 'WITHSCORES')
        if #es == 0 then
          break
        end
        local fields = {}
        for i = 1, #es, 2 do
          fields[#fields + 1] = 't' .. es[i]
        end
        local toks = redis.call('HMGET', q.data, unpack(fields))
        for i = 1, #es, 2 do
          excess = excess - tonumber(toks[(i + 1) / 2] or 0)
          if excess <= 0 then
            return R_RATE_LIMITED, tonumber(es[i + 1]) + MINUTE - now
          end
        end
        start = start + PAGE
      end
    end
  end
  return R_NONE, 0
end

-- twin: gate.(*Quota).take
-- The lease is queued on b (lease_f, lease_v), for b_save's HSET. A permit that already holds
-- one (b_load's lease_of) is not counted twice.
-- admit.lua's early exit repeats this for its case (a batch's common admit): change both.
local function q_take(q, b, l, permit, tokens, now)
  local e = now + l.lease
  local logged = l.rpm > 0 or l.tpm > 0
  local v = S_PACK('<d', e)
  if logged then
    v = v .. LEASE_LOGGED
  end
  b.lease_f, b.lease_v = LEASE .. permit, v
  if not b.lease_of then
    b.held = b.held + 1
    b.lease_of = true
  end
  if b.held == 1 or e < b.lease_min then
    b.lease_min = e
  end
  if not logged then
    return
  end
  tokens = tadd(0, tokens)
  local m = string.format('%016d', redis.call('HINCRBY', q.data, 'next', 1))
  redis.call('ZADD', q.log, I(now), m)
  redis.call('HSET', q.data, 't' .. m, I(tokens), 'p' .. m, permit, 'i' .. permit, m, 'sum', I(tadd(q_sum(q), tokens)))
  redis.call('PEXPIRE', q.log, I(MINUTE + SLACK))
  redis.call('PEXPIRE', q.data, I(MINUTE + SLACK))
end

-- twin: gate.(*Quota).release
-- Frees the permit's slot, settles its tokens to actual
-- (actual < 0 keeps the estimate), and says whether the slot was held.
-- The log is not expired here (see q_expire): an admission older than the
-- minute that is still stored gets its actual tokens, which leave the sum
-- with it. b_load read the permit's lease (b.lease_of): the log is read only
-- if the lease says its admission is there, or if the lease has ended.
-- settle.lua's early exit repeats this for its case (a batch's common success): change both.
local function q_release(q, b, permit, actual, now)
  q_expire(q, b, now, false)
  local lease = b.lease_of
  -- The minute's data first, then the lease's HDEL: a settle that raises
  -- on the data (a broken key) keeps its lease, and its slot, for the
  -- give-back to free, instead of a slot held without a lease.
  local m = nil
  if actual >= 0 and (not lease or #lease > 8) then
    m = redis.call('HGET', q.data, 'i' .. permit)
  end
  if m then
    local old = tonumber(redis.call('HGET', q.data, 't' .. m) or 0)
    actual = tadd(0, actual)
    redis.call('HSET', q.data, 't' .. m, I(actual), 'sum', I(tadd(q_sum(q), actual - old)))
  end
  local held = lease and h_del(q.state, LEASE .. permit)
  if held and b.held > 0 then
    b.held = b.held - 1
  end
  return held
end

-- twin: gate.(*Quota).view
-- As the reply record QV. It changes nothing but what q_expire forgets
-- (leases ended by now): admissions older than the minute that are still
-- stored are left out.
local function q_view(q, b, now)
  q_expire(q, b, now, false)
  local in_flight = b.held
  local requests = redis.call('ZCOUNT', q.log, '(' .. I(now - MINUTE), '+inf')
  local tokens, offset = q_sum(q), 0
  while true do
    local old = redis.call('ZRANGEBYSCORE', q.log, '-inf', I(now - MINUTE), 'LIMIT', offset, PAGE)
    if #old == 0 then
      break
    end
    local fields = {}
    for _, m in ipairs(old) do
      fields[#fields + 1] = 't' .. m
    end
    for _, t in ipairs(redis.call('HMGET', q.data, unpack(fields))) do
      tokens = tadd(tokens, -tonumber(t or 0))
    end
    offset = offset + PAGE
  end
  return pack(QV, { in_flight = in_flight, requests = requests, tokens = tokens })
end

---------------------------------------------------------------- line

-- A source's line of callers waiting for its capacity: gate/line.go's
-- Line, function by function (the rank and the rules are described there).
-- Keys (LINE_KEYS, one block per source after every other key of a call,
-- named beside the source's own keys):
--   line: ZSET of members, all scored 0, so ordered as text: a member is the
--         waiter's key (class, share, arrival: KEY_LEN digits) and its id
--   w:    HASH w<id> -> the record member|replica|joined|prio|tenant,
--         c<id> -> called until (ms), r<replica> -> heard of until (ms)
--   s:    HASH v, seq, t<tenant> -> the tenant's last share tag
-- An empty line has no keys; the keys live LINE_TTL leases past the last
-- word of a replica.
local LINE_TTL = 4

-- The keys of an op (admit, settle, peek) are, in a call of its own,
-- SCOPE_KEYS, then SRC_KEYS per source, then LINE_KEYS per source (n
-- sources). In a batch they are the batch's: SCOPE_KEYS once, then each
-- source of the batch once, SRC_KEYS and LINE_KEYS (BATCH_SRC), read into
-- tables once per batch; an op's map is a string of one byte per source of
-- the op, its number among the batch's (nil in a call of its own).

-- BATCH_RUNS runs a batch's ops by kind, a run at a time (batch_ops):
-- admit_run and settle_run (admit.lua, settle.lua; a table, not two locals:
-- the library's chunk holds at most 200).
local BATCH_RUNS = {}

-- BATCH_RUNS.src is what a run of an op's one source shares (admit_run's
-- and settle_run's, looked up once per run): the op's map and cmap bytes
-- (j, cj), the source's keys (bs, false past the batch's sources: bsrc's
-- metatable would raise), its cache entry (hc) and breaker (b), and its
-- configuration (nil where any is missing). (A field, not a local: the
-- main function has 200 at most.)
BATCH_RUNS.src = function(map, cmap)
  local bsrc = CALL.src
  local j, cj = BYTE[map] or string.byte(map, 1) or 0, BYTE[cmap] or string.byte(cmap, 1) or 0
  local bs = j >= 1 and j <= #bsrc and bsrc[j]
  local hc = bs and CALL.h[bs.q.state]
  return j, cj, bs, hc, hc and hc.b, CONF_SRC[cj]
end

-- BATCH_RUNS.first is a settle run's first load of its source's state hash
-- key (b_first; its cache entry and breaker, nil where the batch did not
-- name the key: b_load's own way), where the walk would load it: after the
-- op's head (its argument args from p0: SETTLE's position and fields)
-- reads, so that an op whose head does not read raises as settle would
-- (nothing loaded: settle raises, op_check). Every settle of a batch's
-- first run walked before (its hash not yet in CALL.h), ~400 bytecodes a
-- call (docs/performance.md, twelfth session).
BATCH_RUNS.first = function(key, args, p0)
  local pre = CALL.pre[key]
  if not pre then
    return nil, nil
  end
  local at = p0 + S_UNPACK('<I4', args, p0) -- (op_block's)
  if at ~= p0 + 8 then
    return nil, nil
  end
  S_UNPACK(SETTLE.FMT, args, at) -- (raises where settle's does, before its b_load)
  b_first(key, pre)
  local c = CALL.h[key]
  return c, c.b
end

-- BATCH_RUNS.flush (run_flush) records a settle run's successes counted and not yet
-- recorded (settle_run: CALL.rc its cache entry, rpc its configuration,
-- rnow their time, rfrom..rk the ops, rt the reply table of the last one
-- answered) into the window, that reply's window set: at the run's end
-- (k 0), and on batch_run's error path after call_restore (k the op that
-- raised), so that an op raising mid-run leaves the window and the op
-- before's reply as the ops one at a time would. The op k, if counted (it
-- raised after its b_keep: its handoff's reads), is recorded after that
-- reply's window, as its own.
BATCH_RUNS.flush = function(k) -- run_flush (a field, not a local: the main function has 200 at most)
  local C = CALL
  local c = C.rc
  if not c then
    return
  end
  C.rc = false
  local b, last = c.b, C.rk
  local n = last - C.rfrom + 1
  -- (k 0 is the run's end, no op: a run from the batch's first op that
  -- counted none has rk 0 too, BATCH_RUNS.first's case)
  local own = k ~= 0 and last == k
  if own then
    n = n - 1
  end
  if n > 0 then
    b_record(b, C.rpc, C.rnow, false, n)
    C.rt[3] = b.win
  end
  if own then
    b_record(b, C.rpc, C.rnow, false, 1)
  end
  c.saved_win = b.win
end

-- NO_BATCH_SRC is the metatable of a batch's sources (CALL.src, by
-- number): an op whose map names a source the batch does not have (a byte
-- past its sources, or past the map's end) fails naming it. A lookup that
-- finds its source never reaches it: nothing on the ops' path.
local NO_BATCH_SRC = {
  __index = function(src, j)
    error('redisgate: an op names batch source ' .. tostring(j) .. ' of ' .. I(#src))
  end,
}

-- batch_src is the j-th source of the batch: {q = SRC_KEYS, l = LINE_KEYS}.
local function batch_src(keys, j)
  local t = rawget(CALL.src, j)
  if not t then
    local base = block(SCOPE_KEYS, BATCH_SRC, j)
    t = { q = read(SRC_KEYS, keys, base), l = read(LINE_KEYS, keys, base + SRC_KEYS.WIDTH) }
    CALL.src[j] = t
  end
  return t
end

-- op_scope is an op's SCOPE_KEYS.
local function op_scope(keys, map)
  if not map then
    return SCOPE_KEYS.read(keys, 0) -- (read's and block's answers without their calls, as below)
  end
  if not CALL.scope then
    CALL.scope = read(SCOPE_KEYS, keys, 0)
  end
  return CALL.scope
end

-- op_src is the SRC_KEYS of an op's i-th source (from 1): its q.
local function op_src(keys, map, i)
  if map then
    return batch_src(keys, string.byte(map, i)).q
  end
  return SRC_KEYS.read(keys, SCOPE_KEYS.WIDTH + SRC_KEYS.WIDTH * (i - 1))
end

-- op_line is the LINE_KEYS of an op's i-th source, of n.
local function op_line(keys, map, n, i)
  if map then
    return batch_src(keys, string.byte(map, i)).l
  end
  return LINE_KEYS.read(keys, SCOPE_KEYS.WIDTH + SRC_KEYS.WIDTH * n + LINE_KEYS.WIDTH * (i - 1))
end

-- on_block is the block of layout L that starts after argv[base] when its
-- field on is 1 (L.on reads that field alone), nil otherwise.
local function on_block(L, argv, base)
  if not L.on(argv, base) then
    return nil
  end
  return read(L, argv, base)
end

local function l_parse(r)
  local member, replica, joined, prio, tenant = string.match(r, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  if member == nil or #member <= KEY_LEN then
    return nil
  end
  return {
    member = member, id = string.sub(member, KEY_LEN + 1), replica = replica,
    joined = tonumber(joined), prio = tonumber(prio), tenant = tenant, called = 0,
  }
end

local function l_record(e)
  return e.member .. '|' .. e.replica .. '|' .. I(e.joined) .. '|' .. I(e.prio) .. '|' .. e.tenant
end

-- l_entry is the waiter id's entry, or nil.
local function l_entry(k, id)
  local v = redis.call('HMGET', k.line_w, 'w' .. id, 'c' .. id)
  if not v[1] then
    return nil
  end
  local e = l_parse(v[1])
  if e then
    e.called = tonumber(v[2] or 0)
  end
  return e
end

local function l_touch(k, lease)
  local ttl = I(lease * LINE_TTL + SLACK)
  redis.call('PEXPIRE', k.line, ttl)
  redis.call('PEXPIRE', k.line_w, ttl)
  redis.call('PEXPIRE', k.line_s, ttl)
end

-- l_empty says whether the line k has nobody (no ZSET), kept on k (a
-- batch's table of the line's keys, or a call's own: k.empty) so that a
-- batch asks Redis once per line, not once per op, and a caller that tested
-- before a twin that tests again asks once. What changes it keeps it exact:
-- l_enter's ZADD (not empty), l_remove's or l_front's emptying the line
-- (empty). An empty line that fills is always seen.
local function l_empty(k)
  if k.empty == nil then
    k.empty = redis.call('EXISTS', k.line) == 0
  end
  return k.empty
end

-- twin: gate.(*Line).remove
local function l_remove(k, e)
  redis.call('ZREM', k.line, e.member)
  redis.call('HDEL', k.line_w, 'w' .. e.id, 'c' .. e.id)
  if redis.call('ZCARD', k.line) == 0 then
    redis.call('DEL', k.line_w, k.line_s)
    k.empty = true
  end
end

-- twin: gate.(*Line).live
local function l_live(k, replica, lease, now)
  if redis.call('ZCARD', k.line) > 0 then
    redis.call('HSET', k.line_w, 'r' .. replica, I(now + lease))
    l_touch(k, lease)
  end
end

-- twin: gate.(*Line).dead
local function l_dead(k, e, now)
  return tonumber(redis.call('HGET', k.line_w, 'r' .. e.replica) or 0) < now
end

-- l_front walks the line from its front as reading it rank by rank would,
-- taking out (l_remove) each entry that vanished: its replica silent, or
-- called and not asking in time (gate.(*Line).dead, called). The walker
-- it returns gives the next entry that has not vanished (nil past the end),
-- having taken out those that vanished on the way (and members without a
-- record). It reads the members and their records in pages that double
-- from one (a live head costs what one rank costs; a replica's thousands of
-- waiters, gone at once, cost a few commands per page, not six per waiter),
-- a replica's liveness once, and writes what it took out at the end: at
-- nil, or when done is called. Either ends the walk (the walker gives nil
-- from then on); nothing else may change the line meanwhile.
local function l_front(k, now)
  local page, fields, recs, pos, rank, size = {}, {}, {}, 0, 0, 1
  local dead, out_m, out_f, ended = {}, {}, {}, false
  local function done()
    ended = true
    for i = 1, #out_m, PAGE_H do
      redis.call('ZREM', k.line, unpack(out_m, i, math.min(i + PAGE_H - 1, #out_m)))
    end
    for i = 1, #out_f, PAGE_H do
      redis.call('HDEL', k.line_w, unpack(out_f, i, math.min(i + PAGE_H - 1, #out_f)))
    end
    if #out_m > 0 and redis.call('ZCARD', k.line) == 0 then
      redis.call('DEL', k.line_w, k.line_s)
      k.empty = true
    end
    out_m, out_f = {}, {}
  end
  local function next()
    while not ended do
      if pos == #page then
        page = redis.call('ZRANGE', k.line, rank, rank + size - 1)
        if #page == 0 then
          done()
          return nil
        end
        rank, pos, size = rank + #page, 0, math.min(2 * size, PAGE)
        fields = {}
        for j, m in ipairs(page) do
          local id = string.sub(m, KEY_LEN + 1)
          fields[2 * j - 1], fields[2 * j] = 'w' .. id, 'c' .. id
        end
        recs = redis.call('HMGET', k.line_w, unpack(fields))
      end
      pos = pos + 1
      -- Only an entry kept is parsed whole: a vanished one needs its
      -- replica (the record's second field) and its call time.
      local rec, called = recs[2 * pos - 1], tonumber(recs[2 * pos] or 0)
      local replica = rec and string.match(rec, '^[^|]*|([^|]*)|')
      local e
      if replica then
        if dead[replica] == nil then
          dead[replica] = l_dead(k, { replica = replica }, now)
        end
        if not dead[replica] and (called == 0 or called >= now) then
          e = l_parse(rec)
        end
      end
      if e then
        e.called = called
        return e
      end
      out_m[#out_m + 1] = page[pos]
      if replica then
        out_f[#out_f + 1] = fields[2 * pos - 1]
        out_f[#out_f + 1] = fields[2 * pos]
      end
    end
  end
  return next, done
end

-- twin: gate.(*Line).head
local function l_head(k, now)
  local next, done = l_front(k, now)
  local e = next()
  done()
  return e
end

-- twin: gate.(*Line).key
local function l_key(k, w, now)
  local tenant, weight = w.tenant, w.weight
  local s = redis.call('HMGET', k.line_s, 'v', 'seq', 't' .. tenant, 'nt')
  if not s[3] and tonumber(s[4] or 0) >= w.max_tenants then
    tenant, weight = OVERFLOW_TENANT, w.other_weight
    s[3] = redis.call('HGET', k.line_s, 't' .. tenant)
  end
  local share = gmax(tonumber(s[1] or 0), tonumber(s[3] or 0)) + idiv(SHARE_SCALE, gmax(1, weight))
  local class = w.priority
  if w.aging > 0 then
    class = class - idiv(now, w.aging)
  end
  local key = string.format('%016d%016d%016d', CLASS_OFFSET - class, share, tonumber(s[2] or 0) + 1)
  return tenant, share, key
end

-- twin: gate.(*Line).enter
local function l_enter(k, w, now)
  local r = redis.call('HGET', k.line_w, 'w' .. w.waiter)
  if r then
    return r
  end
  if redis.call('ZCARD', k.line) >= LINE_CAP then
    l_head(k, now) -- those that vanished at the front; no scan of the whole line
    if redis.call('ZCARD', k.line) >= LINE_CAP then
      return ''
    end
  end
  local e = l_parse(w.place)
  if e == nil or e.id ~= w.waiter then
    local tenant, share, key = l_key(k, w, now)
    if redis.call('HSETNX', k.line_s, 't' .. tenant, I(share)) == 1 then
      redis.call('HINCRBY', k.line_s, 'nt', 1)
    else
      redis.call('HSET', k.line_s, 't' .. tenant, I(share))
    end
    redis.call('HINCRBY', k.line_s, 'seq', 1)
    e = { member = key .. w.waiter, id = w.waiter, tenant = tenant, prio = w.priority, joined = now }
  end
  e.replica = w.replica
  r = l_record(e)
  k.empty = false
  redis.call('ZADD', k.line, 0, e.member)
  redis.call('HSET', k.line_w, 'w' .. w.waiter, r, 'r' .. w.replica, I(now + w.lease))
  l_touch(k, w.lease)
  return r
end

-- twin: gate.(*Line).Check
-- The second result says the line was empty and w had no place: w is not
-- in line after the walk either (admit skips l_after).
local function l_check(k, w, now)
  if w.place == '' and l_empty(k) then
    return true, true
  end
  l_live(k, w.replica, w.lease, now)
  local e = l_entry(k, w.waiter)
  if e == nil and w.place ~= '' then
    l_enter(k, w, now)
    e = l_entry(k, w.waiter)
  end
  local head = l_head(k, now)
  if head == nil then
    return true
  elseif e ~= nil then
    return e.id == head.id or e.called >= now
  end
  local _, _, key = l_key(k, w, now)
  return key < string.sub(head.member, 1, KEY_LEN)
end

-- twin: gate.CapacityRefused
-- (of one rejection's reason)
local function l_capacity(reason)
  return reason == R_RATE_LIMITED or reason == R_ADAPTIVE_PACED or reason == R_QUEUED
end

-- twin: gate.(*Line).After
local function l_after(k, w, granted, capacity)
  local e = l_entry(k, w.waiter)
  if e == nil then
    return ''
  end
  if granted then
    local share = tonumber(string.sub(e.member, 17, 32))
    if share > tonumber(redis.call('HGET', k.line_s, 'v') or 0) then
      redis.call('HSET', k.line_s, 'v', I(share))
    end
    l_remove(k, e)
    return ''
  elseif capacity then
    redis.call('HDEL', k.line_w, 'c' .. w.waiter)
    return l_record(e)
  end
  l_remove(k, e)
  return ''
end

-- twin: gate.(*Line).Handoff
local function l_handoff(k, h, now)
  if l_empty(k) then
    return ''
  end
  l_live(k, h.replica, h.lease, now)
  local next, done = l_front(k, now)
  while true do
    local e = next()
    if e == nil then
      return ''
    elseif e.called == 0 then
      done()
      redis.call('HSET', k.line_w, 'c' .. e.id, I(now + h.lease))
      return e.id
    end
  end
end

-- twin: gate.(*Line).Read
-- As the reply record LINE_R.
local function l_read(k, r, w, now)
  local v = { length = 0, place = '', wake = {}, head = '', oldest = 0, groups = {} }
  if w == nil and l_empty(k) then
    return pack(LINE_R, v) -- an empty line, nobody joining: one command per source read
  end
  l_live(k, r.replica, r.lease, now)
  if w then
    v.place = l_enter(k, w, now)
  end
  local next, done = l_front(k, now)
  local first = true -- no entry called before it
  while true do
    local e = next()
    if e == nil then
      break
    elseif e.called == 0 then
      if first and e.replica == r.replica then
        v.head = e.id
      end
      break
    end
    if e.replica == r.replica then
      v.wake[#v.wake + 1] = e.id
    end
    first = false
  end
  done()
  if r.describe == 1 then
    -- The first DESCRIBE_MAX waiters: those whose replica is gone leave,
    -- the others are counted (a replica's liveness read once).
    local count, order, dead = {}, {}, {}
    for _, m in ipairs(redis.call('ZRANGE', k.line, 0, DESCRIBE_MAX - 1)) do
      local e = l_entry(k, string.sub(m, KEY_LEN + 1))
      if e and dead[e.replica] == nil then
        dead[e.replica] = l_dead(k, e, now)
      end
      if e == nil then
        redis.call('ZREM', k.line, m)
      elseif dead[e.replica] then
        l_remove(k, e)
      else
        v.oldest = gmax(v.oldest, now - e.joined)
        local g = I(e.prio) .. '|' .. e.tenant
        if not count[g] then
          count[g] = 0
          order[#order + 1] = { priority = e.prio, tenant = e.tenant, g = g }
        end
        count[g] = count[g] + 1
      end
    end
    for _, g in ipairs(order) do
      v.groups[#v.groups + 1] = pack(LINE_GROUP, { priority = g.priority, tenant = g.tenant, waiting = count[g.g] })
    end
  end
  v.length = redis.call('ZCARD', k.line)
  return pack(LINE_R, v)
end
