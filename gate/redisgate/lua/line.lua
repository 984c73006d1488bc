-- line.lua: gate/line.go's line of a source, function by function (each
-- names its Go twin). s.line is a ZSET of members (the waiter's key,
-- KEY_LEN characters, then its id; score 0: members order as text),
-- s.waiters a hash of the rest: w<id> the waiter's record
-- (member|replica|joined|prio|tenant), c<id> the end of the slot it was
-- handed, h<id> until when its place is kept without word from it (0: no
-- bound), r<replica> until when the replica is trusted, the share table
-- (t<tenant> the tenant's last share tag, k<tenant> its waiters in line,
-- u<tenant> when the configuration does not name it), v, seq and nt (the
-- buckets of tenants not named). An emptied line deletes the hash: shares,
-- v and seq start over.

-- A line's keys live LINE_TTL leases after the last write.
local LINE_TTL = 4

local function l_parse(r)
  local member, replica, joined, prio, tenant = string.match(r, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  if member == nil or #member <= KEY_LEN then
    return nil
  end
  return {
    member = member, id = string.sub(member, KEY_LEN + 1), replica = replica,
    joined = tonumber(joined) or 0, prio = tonumber(prio) or 0, tenant = tenant, called = 0,
  }
end

local function l_record(e)
  return e.member .. '|' .. e.replica .. '|' .. I(e.joined) .. '|' .. I(e.prio) .. '|' .. e.tenant
end

-- l_entry is the entry of waiter id, or nil.
local function l_entry(s, id)
  local v = redis.call('HMGET', s.waiters, 'w' .. id, 'c' .. id)
  if not v[1] then
    return nil
  end
  local e = l_parse(v[1])
  if e then
    e.called = tonumber(v[2]) or 0
  end
  return e
end

local function l_touch(s, lease)
  local ttl = lease * LINE_TTL + SLACK
  redis.call('PEXPIRE', s.line, ttl)
  redis.call('PEXPIRE', s.waiters, ttl)
end

-- l_empty says whether nobody waits, asked once per call.
local function l_empty(s)
  if s.lempty == nil then
    s.lempty = redis.call('EXISTS', s.line) == 0
  end
  return s.lempty
end

local function l_emptied(s)
  if redis.call('ZCARD', s.line) == 0 then
    redis.call('DEL', s.waiters)
    s.lempty = true
  end
end

-- l_count counts a waiter of tenant in or out of its bucket (gate.(*Line)
-- insert's and remove's share table): a bucket is made for its first
-- waiter (named: the configuration names the tenant) and freed with its
-- last.
local function l_count(s, tenant, share, named)
  if share then
    local last = redis.call('HGET', s.waiters, 't' .. tenant)
    if not last and not named and tenant ~= OVERFLOW_TENANT then
      redis.call('HSET', s.waiters, 'u' .. tenant, 1)
      redis.call('HINCRBY', s.waiters, 'nt', 1)
    end
    redis.call('HSET', s.waiters, 't' .. tenant, math.max(tonumber(last) or 0, share))
    redis.call('HINCRBY', s.waiters, 'k' .. tenant, 1)
  elseif redis.call('HINCRBY', s.waiters, 'k' .. tenant, -1) <= 0 then
    if redis.call('HDEL', s.waiters, 'u' .. tenant) == 1 then
      redis.call('HINCRBY', s.waiters, 'nt', -1)
    end
    redis.call('HDEL', s.waiters, 't' .. tenant, 'k' .. tenant)
  end
end

-- twin: gate.(*Line).remove
local function l_remove(s, e)
  redis.call('ZREM', s.line, e.member)
  redis.call('HDEL', s.waiters, 'w' .. e.id, 'c' .. e.id, 'h' .. e.id)
  l_count(s, e.tenant)
  l_emptied(s)
end

-- twin: gate.(*Line).live
local function l_live(s, replica, lease, now)
  if not l_empty(s) then
    redis.call('HSET', s.waiters, 'r' .. replica, now + lease)
    l_touch(s, lease)
  end
end

-- twin: gate.(*Line).dead
local function l_dead(s, replica, now)
  return (tonumber(redis.call('HGET', s.waiters, 'r' .. replica)) or 0) < now
end

-- l_front walks the line from its front, taking out each entry that
-- vanished (gate.(*Line).gone) as gate.(*Line).head does: next gives the
-- next entry left (nil past the end), done writes the removals. Pages
-- double from one: a live head costs one rank's reads, thousands of
-- vanished waiters a few commands a page.
local function l_front(s, now)
  local page, recs, pos, rank, size = {}, {}, 0, 0, 1
  local dead, gone_m, gone_f, gone_t, ended = {}, {}, {}, {}, false
  local function done()
    ended = true
    each_page(gone_m, function(...) redis.call('ZREM', s.line, ...) end)
    each_page(gone_f, function(...) redis.call('HDEL', s.waiters, ...) end)
    for _, tenant in ipairs(gone_t) do
      l_count(s, tenant)
    end
    if #gone_m > 0 then
      l_emptied(s)
    end
    gone_m, gone_f, gone_t = {}, {}, {}
  end
  local function next()
    while not ended do
      if pos == #page then
        page = redis.call('ZRANGE', s.line, rank, rank + size - 1)
        if #page == 0 then
          done()
          return nil
        end
        rank, pos, size = rank + #page, 0, math.min(2 * size, PAGE)
        local fields = {}
        for j, m in ipairs(page) do
          local id = string.sub(m, KEY_LEN + 1)
          fields[3 * j - 2], fields[3 * j - 1], fields[3 * j] = 'w' .. id, 'c' .. id, 'h' .. id
        end
        recs = redis.call('HMGET', s.waiters, unpack(fields))
      end
      pos = pos + 1
      local rec, called, due = recs[3 * pos - 2], tonumber(recs[3 * pos - 1]) or 0, tonumber(recs[3 * pos]) or 0
      local e = rec and l_parse(rec)
      if e then
        if dead[e.replica] == nil then
          dead[e.replica] = l_dead(s, e.replica, now)
        end
        if not dead[e.replica] and (called == 0 or called >= now) and (due == 0 or due >= now) then
          e.called = called
          return e
        end
        gone_t[#gone_t + 1] = e.tenant
      end
      local id = string.sub(page[pos], KEY_LEN + 1)
      gone_m[#gone_m + 1] = page[pos]
      gone_f[#gone_f + 1], gone_f[#gone_f + 2], gone_f[#gone_f + 3] = 'w' .. id, 'c' .. id, 'h' .. id
    end
  end
  return next, done
end

-- twin: gate.(*Line).head
local function l_head(s, now)
  local next, done = l_front(s, now)
  local e = next()
  done()
  return e
end

-- twin: gate.(*Line).key
local function l_key(s, w, now)
  local tenant, weight = w.tenant, w.weight
  local st = redis.call('HMGET', s.waiters, 'v', 'seq', 't' .. tenant, 'nt')
  if not st[3] and not w.named and (tonumber(st[4]) or 0) >= w.max_tenants then
    tenant, weight = OVERFLOW_TENANT, w.other_weight
    st[3] = redis.call('HGET', s.waiters, 't' .. tenant)
  end
  if weight < 1 then
    weight = 1
  end
  local v, last = tonumber(st[1]) or 0, tonumber(st[3]) or 0
  if last > v then
    v = last
  end
  local share = v + idiv(SHARE_SCALE, weight)
  local class = w.priority
  if w.aging > 0 then
    class = class - idiv(now, w.aging)
  end
  local key = string.format('%016d%016d%016d', CLASS_OFFSET - class, share, (tonumber(st[2]) or 0) + 1)
  return tenant, share, key
end

-- twin: gate.(*lineEntry).heard
local function l_heard(w, now)
  return w.due > 0 and now + w.due or 0
end

-- twin: gate.(*Line).enter
local function l_enter(s, w, now)
  local r = redis.call('HGET', s.waiters, 'w' .. w.id)
  if r then
    redis.call('HSET', s.waiters, 'h' .. w.id, l_heard(w, now))
    return r
  end
  if redis.call('ZCARD', s.line) >= LINE_CAP then
    l_head(s, now) -- those that vanished at the front; no scan of the whole line
    if redis.call('ZCARD', s.line) >= LINE_CAP then
      return ''
    end
  end
  local e = l_parse(w.place or '')
  if e == nil or e.id ~= w.id then
    local tenant, _, key = l_key(s, w, now)
    redis.call('HINCRBY', s.waiters, 'seq', 1)
    e = { member = key .. w.id, id = w.id, tenant = tenant, prio = w.priority, joined = now }
  end
  l_count(s, e.tenant, tonumber(string.sub(e.member, 17, 32)) or 0, w.named)
  e.replica = w.replica
  r = l_record(e)
  redis.call('ZADD', s.line, 0, e.member)
  redis.call('HSET', s.waiters, 'w' .. w.id, r, 'h' .. w.id, l_heard(w, now), 'r' .. w.replica, now + w.lease)
  s.lempty = false
  l_touch(s, w.lease)
  return r
end

-- twin: gate.(*Line).Check
-- The second result: the line was empty and w had no place in it.
local function l_check(s, w, now)
  if (w.place or '') == '' and l_empty(s) then
    return true, true
  end
  l_live(s, w.replica, w.lease, now)
  local e = l_entry(s, w.id)
  if e ~= nil then
    redis.call('HSET', s.waiters, 'h' .. w.id, l_heard(w, now))
  elseif (w.place or '') ~= '' then
    l_enter(s, w, now)
    e = l_entry(s, w.id)
  end
  local head = l_head(s, now)
  if head == nil then
    return true
  elseif e ~= nil then
    return e.id == head.id or e.called >= now
  end
  local _, _, key = l_key(s, w, now)
  return key < string.sub(head.member, 1, KEY_LEN)
end

-- twin: gate.CapacityRefused
local function l_capacity(reason)
  return reason == R_RATE_LIMITED or reason == R_ADAPTIVE_PACED or reason == R_QUEUED
end

-- twin: gate.(*Line).After
local function l_after(s, w, granted, capacity)
  local e = l_entry(s, w.id)
  if e == nil then
    return ''
  end
  if granted then
    local share = tonumber(string.sub(e.member, 17, 32))
    if share > (tonumber(redis.call('HGET', s.waiters, 'v')) or 0) then
      redis.call('HSET', s.waiters, 'v', share)
    end
    l_remove(s, e)
    return ''
  elseif capacity then
    redis.call('HDEL', s.waiters, 'c' .. w.id)
    return l_record(e)
  end
  l_remove(s, e)
  return ''
end

-- twin: gate.(*Line).Handoff
local function l_handoff(s, h, now)
  l_live(s, h.replica, h.lease, now)
  local next, done = l_front(s, now)
  while true do
    local e = next()
    if e == nil then
      return ''
    elseif e.called == 0 then
      done()
      redis.call('HSET', s.waiters, 'c' .. e.id, now + h.lease)
      return e.id
    end
  end
end

-- twin: gate.(*Line).Read
-- rd is the read (replica, lease, describe), w the waiter joining or nil.
-- It appends gate.LineView: length place head oldest, the count of waiters
-- to wake and their ids, the count of groups and each's priority tenant
-- waiting.
local function l_read(r, s, rd, w, now)
  local wake, groups = {}, {}
  local place, head, oldest = '', '', 0
  if w ~= nil or not l_empty(s) then
    l_live(s, rd.replica, rd.lease, now)
    if w then
      place = l_enter(s, w, now)
    end
    local next, done = l_front(s, now)
    local first = true -- no entry called before it
    while true do
      local e = next()
      if e == nil then
        break
      elseif e.called == 0 then
        if first and e.replica == rd.replica then
          head = e.id
        end
        break
      end
      if e.replica == rd.replica then
        wake[#wake + 1] = e.id
      end
      first = false
    end
    done()
  end
  if rd.describe and not l_empty(s) then
    -- The first DESCRIBE_MAX waiters: those whose replica is gone leave,
    -- the others are counted.
    local count, dead = {}, {}
    for _, m in ipairs(redis.call('ZRANGE', s.line, 0, DESCRIBE_MAX - 1)) do
      local e = l_entry(s, string.sub(m, KEY_LEN + 1))
      if e == nil then
        redis.call('ZREM', s.line, m)
        l_emptied(s)
      else
        if dead[e.replica] == nil then
          dead[e.replica] = l_dead(s, e.replica, now)
        end
        if dead[e.replica] then
          l_remove(s, e)
        else
          if now - e.joined > oldest then
            oldest = now - e.joined
          end
          local g = I(e.prio) .. '|' .. e.tenant
          if not count[g] then
            count[g] = 0
            groups[#groups + 1] = { e.prio, e.tenant, g }
          end
          count[g] = count[g] + 1
        end
      end
    end
    for _, g in ipairs(groups) do
      g[3] = count[g[3]]
    end
  end
  local length = 0
  if not l_empty(s) then
    length = redis.call('ZCARD', s.line)
  end
  local n = #r
  r[n + 1], r[n + 2], r[n + 3], r[n + 4], r[n + 5] = length, place, head, oldest, #wake
  for _, id in ipairs(wake) do
    r[#r + 1] = id
  end
  r[#r + 1] = #groups
  for _, g in ipairs(groups) do
    n = #r
    r[n + 1], r[n + 2], r[n + 3] = g[1], g[2], g[3]
  end
end

-- twin: gate.(*Line).Leave
local function l_leave(s, id)
  local e = l_entry(s, id)
  if e then
    l_remove(s, e)
  end
end
