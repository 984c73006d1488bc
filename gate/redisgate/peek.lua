
-- peek.lua: gate.Backend.Peek (inmem.Backend.Peek, with gate.SourceState.View
-- and gate.SourceState.Verdict per source). It changes no state: the only
-- writes are q_check's removals of leases and admissions already expired.
--
-- keys: SCOPE_KEYS, then SRC_KEYS per source, then LINE_KEYS per source.
-- argv: PEEK, then PEEK_SRC per source (n of them), then LINE_READ and
-- WAITER (the waiter joining, if on), then JOIN per source (whether the
-- waiter joins that source's line, and its place there).
-- Reply PEEK_R: sources are PEEK_SRC_R records (views, and Admit's verdict now).
-- twin: gate.(*SourceState).View
local function peek(keys, argv)
  local h = read(PEEK, argv, 0)
  local now = now_ms(h.now)
  local r = on_block(LINE_READ, argv, block(PEEK, PEEK_SRC, h.n + 1))
  local w
  if r then
    w = read(WAITER, argv, PEEK.WIDTH + PEEK_SRC.WIDTH * h.n + LINE_READ.WIDTH)
    if w.on ~= 1 then
      w = nil
    end
  end
  local out = {}
  for i = 1, h.n do
    local c = read(PEEK_SRC, argv, block(PEEK, PEEK_SRC, i))
    local q = op_src(keys, nil, i)
    local b = b_load(q.state, true)
    local v = { breaker = b_stored(b), window = b.win, quota = q_view(q, b, now) }
    -- SourceState.Verdict: the quota's refusal first, then the breaker's.
    v.reason, v.retry = q_check(q, b, c, c.ceiling, h.tokens, now)
    if v.reason == R_NONE then
      v.reason, v.retry = b_check(b, now)
    end
    v.line = pack(LINE_R, { length = 0, place = '', wake = {}, head = '', oldest = 0, groups = {} })
    if r then
      local k = op_line(keys, nil, h.n, i)
      local j = read(JOIN, argv, PEEK.WIDTH + PEEK_SRC.WIDTH * h.n + LINE_READ.WIDTH + WAITER.WIDTH + JOIN.WIDTH * (i - 1))
      local jw
      if w and j.on == 1 then
        w.place = j.place
        jw = w
      end
      v.line = l_read(k, r, jw, now)
    end
    out[i] = pack(PEEK_SRC_R, v)
  end
  local s = read(SCOPE_KEYS, keys, 0)
  return pack(PEEK_R, { progress = tonumber(redis.call('GET', s.progress) or 0), now = now, sources = out })
end
