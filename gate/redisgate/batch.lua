
-- batch.lua: the Admits and Settles of one scope that met while another
-- call of the scope was in flight (batch.go), run in the order sent (its
-- settles first, then its admits), a run of one kind, source and
-- configuration at a time (batch_ops: admit_run, settle_run, each op the
-- early exit or its own function, admit.lua, settle.lua): one atomic run
-- that is the same as the ops run as separate calls back to back. What the
-- ops share is read
-- once (CALL in lib.lua): the server's TIME, the scope's marker and its
-- progress, and each source's state hash (its breaker and the leases the
-- ops touch), all written back once, at the end.
--
-- keys: SCOPE_KEYS, then BATCH_SRC per source of the batch.
-- argv: BATCH, the CONF argument (CONF_H and each distinct SRC_CONF of the
-- ops, once: see op_conf), then per source BATCH_PRE and its lease fields,
-- then per op one: its BATCH_OP block and then the op's own argument (opArg).
-- Reply: an array with each op's reply (ADMIT_R, SETTLE_R; or 1 for a
-- settle whose reply is the next op's, one call fewer: settle_run) or its error: an
-- op that raises an error answers with it and does not stop the others (what
-- it wrote before the error stays, as in a call of its own: its Redis
-- commands and what it saved, b_save, but not the changes to a breaker it
-- made after its last save; see b_keep).
-- batch_ops runs the ops from the from-th (its argument argv[ao + 1]) to
-- the n-th, each one's reply into out, in runs: an op and those after it of
-- the same kind, map and cmap (admit_run, settle_run: their early exits,
-- with what the ops share looked up once per run). st[1] is the op running
-- once its head (BATCH_OP) is read, 0 between two: which op raised, for
-- batch_run.
local function batch_ops(keys, argv, ao, from, n, out, st)
  local i = from
  while i <= n do
    local at = ao + 1
    local s = argv[at] -- (op_arg's, without its call)
    local kind, map, cmap, p0 = S_UNPACK(BATCH_OP.FMT, s, 1) -- (BATCH_OP.into_at's)
    local run = BATCH_RUNS[kind]
    st[1] = i
    if not run then
      error('unknown op kind ' .. tostring(kind), 0)
    end
    local k = run(keys, argv, ao, i, n, out, st, s, map, cmap, p0) -- its argument read in place, from p0
    st[1] = 0
    ao, i = ao + k - i, k
  end
end

local function batch_run(keys, argv)
  -- BATCH's and BATCH_PRE's fields unpacked in place (BATCH.read's,
  -- BATCH_PRE.read's), no table each to read them from.
  local hnow, hn, hsrcs = S_UNPACK(BATCH.FMT, op_arg(argv, 0), 1)
  now_ms(hnow)
  conf_open(op_arg(argv, BATCH.WIDTH), true, 255) -- (a cmap byte numbers them)
  local ao = BATCH.WIDTH + 1
  -- What the ops will read of each source's state hash (b_first): its
  -- BATCH_PRE block, then its lease fields, argv[p.from .. p.to].
  for j = 1, hsrcs do
    local window, leases = S_UNPACK(BATCH_PRE.FMT, op_arg(argv, ao), 1)
    ao = ao + BATCH_PRE.WIDTH
    CALL.pre[batch_src(keys, j).q.state] = { window = window, leases = leases, from = ao + 1, to = ao + leases }
    ao = ao + leases
  end
  op_scope(keys, true) -- CALL.scope, which the ops look up
  local out, st, i = {}, { 0 }, 1
  -- One pcall around the ops (batch_ops), not one per op: where an op
  -- raises, what it changed and did not save is not written (call_restore)
  -- and the ops after it run in a pcall of their own. An op's head that
  -- does not read (st[1] 0: no op running) is the batch's error, as before.
  while i <= hn do
    local ok, r = pcall(batch_ops, keys, argv, ao + i - 1, i, hn, out, st)
    if ok then
      break
    end
    local k = st[1]
    if k == 0 then
      BATCH_RUNS.flush(0) -- (what ran is written, call_flush: its count too)
      error(r, 0)
    end
    st[1] = 0
    call_restore()
    BATCH_RUNS.flush(k) -- (a settle run's count kept in CALL)
    if type(r) == 'table' and r.err then
      out[k] = r
    else
      out[k] = redis.error_reply(tostring(r))
    end
    i = k + 1
  end
  return out
end

local function batch(keys, argv)
  if not BYTE then
    BYTE = {}
    for i = 0, 255 do
      BYTE[string.char(i)] = i
    end
  end
  -- (every field CALL gets, now and scope too: its table made once at its
  -- size, not grown)
  CALL = {
    got = {}, put = {}, h = {}, src = setmetatable({}, NO_BATCH_SRC), pre = {}, argv = argv, scoped = false,
    now = false, scope = false, rc = false, rpc = false, rnow = false, rt = false, rfrom = 0, rk = 0,
  }
  local ok, out = pcall(batch_run, keys, argv)
  local flushed, err = pcall(call_flush) -- what ran is written, as in calls of their own
  CALL, CONF_S, CONF_SRC = nil, nil, nil
  if not ok then
    error(out)
  elseif not flushed then
    error(err)
  end
  return out
end
