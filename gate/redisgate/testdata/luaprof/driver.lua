-- driver.lua: replays recorded FCALLs (luaprof_test.go's recording) against
-- the library in a standalone Lua 5.1, with redis.call an in-memory
-- emulator of the commands the attempt cycle uses; profiling only (see
-- profile.sh and docs/performance.md), never part of the sidecar.
--
--   lua5.1 driver.lua LIB CALLS [LINE [incl]]   replay; with LINE, profile
--                                               the library's function
--                                               defined there (lprof)
--   lua5.1 driver.lua LIB CALLS count           calls per function (line)
--   lua5.1 driver.lua LIB CALLS 0|1 [incl] cal  the hook's calibration
--   lua5.1 driver.lua LIB CALLS ops             per function (line): calls,
--                                               bytecodes executed while it
--                                               is the innermost Lua frame,
--                                               and the C functions it calls
--                                               (struct, string.sub, ...):
--                                               one run, no valgrind
--   lua5.1 driver.lua LIB CALLS gc              replay with the collector
--                                               running (as in Redis)
--   lua5.1 driver.lua LIB CALLS alloc           per function (line): calls,
--                                               and the net bytes of the Lua
--                                               heap it allocated while it
--                                               was the innermost Lua frame
--                                               (its tables, strings and the
--                                               C functions it calls: what
--                                               the collector later sweeps);
--                                               line 0: the emulated
--                                               redis.call's replies
--
-- LUA_CPATH must find struct.so (Redis's deps/lua/src/lua_struct.c built
-- as a module), cjson (lua-cjson) and lprof.so (lprof.c).
struct = require "struct"
cjson = require "cjson"
local LIB, CALLS, TARGET, INCL = arg[1], arg[2], arg[3], arg[4] == "incl"

-- The emulator: strings and hashes, TIME a clock that moves 50 µs a call.
local db, clock = {}, 1764600000000000
local function hash(k)
  local e = db[k]
  if not e then
    e = { v = {} }
    db[k] = e
  end
  return e.v
end
local cmds = {}
cmds.TIME = function()
  clock = clock + 50
  return { tostring(math.floor(clock / 1e6)), tostring(clock % 1e6) }
end
cmds.GET = function(k) local e = db[k]; return e and e.v or false end
cmds.MGET = function(...)
  local o = {}
  for i, k in ipairs({ ... }) do local e = db[k]; o[i] = e and e.v or false end
  return o
end
cmds.SET = function(k, v) db[k] = { v = v }; return { ok = 'OK' } end
cmds.HGET = function(k, f) local e = db[k]; return e and e.v[f] or false end
cmds.HMGET = function(k, ...)
  local e, o = db[k], {}
  for i, f in ipairs({ ... }) do o[i] = e and e.v[f] or false end
  return o
end
cmds.HSET = function(k, ...)
  local h, a, n = hash(k), { ... }, 0
  for i = 1, #a, 2 do
    if h[a[i]] == nil then n = n + 1 end
    h[a[i]] = a[i + 1]
  end
  return n
end
cmds.HDEL = function(k, ...)
  local e, n = db[k], 0
  if not e then return 0 end
  for _, f in ipairs({ ... }) do
    if e.v[f] ~= nil then n = n + 1; e.v[f] = nil end
  end
  if next(e.v) == nil then db[k] = nil end
  return n
end
cmds.HGETALL = function(k)
  local e, o = db[k], {}
  if e then for f, v in pairs(e.v) do o[#o + 1] = f; o[#o + 1] = v end end
  return o
end
cmds.EXISTS = function(...)
  local n = 0
  for _, k in ipairs({ ... }) do if db[k] then n = n + 1 end end
  return n
end
cmds.DEL = function(...)
  local n = 0
  for _, k in ipairs({ ... }) do if db[k] then n = n + 1; db[k] = nil end end
  return n
end
cmds.PEXPIRE = function(k) return db[k] and 1 or 0 end
cmds.PERSIST = function() return 0 end
cmds.ZCARD = function() return 0 end -- the cycle's lines stay empty
cmds.PUBLISH = function() return 0 end
local function rcall(name, ...)
  local f = cmds[string.upper(name)]
  if not f then error("emulator: no command " .. name) end
  return f(...)
end
local fns = {}
redis = {
  call = rcall,
  pcall = function(...)
    local ok, r = pcall(rcall, ...)
    if ok then return r end
    return { err = tostring(r) }
  end,
  error_reply = function(s) return { err = s } end,
  status_reply = function(s) return { ok = s } end,
  register_function = function(name, fn) fns[name:match("_([a-z]+)$")] = fn end,
}
local src = io.open(LIB):read("*a"):gsub("^#![^\n]*\n", "\n") -- (line numbers kept)
assert(loadstring(src, "=polygate"))()

-- The recording: per call its count of strings, then each as a 4-byte
-- length and its bytes (FCALL, the function, numkeys, keys, arguments).
local data = io.open(CALLS, "rb"):read("*a")
local pos, calls = 1, {}
local function u32() local v; v, pos = struct.unpack("<I4", data, pos); return v end
while pos <= #data do
  local a = {}
  for i = 1, u32() do
    local l = u32()
    a[i] = string.sub(data, pos, pos + l - 1)
    pos = pos + l
  end
  calls[#calls + 1] = a
end

-- Lua's collector stopped: the emulator's garbage would otherwise be
-- collected in the library's functions (in Redis the collector is ~2% of a
-- cycle: docs/performance.md).
-- With TARGET gc, it runs (the replay's whole cost, collection included, for
-- comparing two libraries on one recording: callgrind's total).
if TARGET ~= "gc" then
  collectgarbage("stop")
end
local lprof = tonumber(TARGET) and require "lprof"
if arg[5] == "cal" then
  -- An empty function called 100 000 times, collected by hand (0) and by
  -- the hook (1, incl): the difference per event is the hook's own cost.
  local function inner() end
  local function loop() for _ = 1, 100000 do inner() end end
  if TARGET == "0" then lprof.toggle(); loop(); lprof.toggle(); return end
  lprof.start(debug.getinfo(1, "S").source, debug.getinfo(loop, "S").linedefined, INCL, -2)
  loop()
  print("PROF", lprof.stop())
  return
end
local counts = {}
if TARGET == "count" then
  debug.sethook(function()
    local i = debug.getinfo(2, "S")
    if i.source == "=polygate" then counts[i.linedefined] = (counts[i.linedefined] or 0) + 1 end
  end, "c")
elseif TARGET == "ops" then
  -- ops[line] = {calls, bytecodes, C calls}; the emulator's own work (a
  -- function of this file) counts nowhere.
  local ops, getinfo = {}, debug.getinfo
  local function at(level)
    local i = getinfo(level, "S")
    if not i or i.source ~= "=polygate" then return nil end
    local o = ops[i.linedefined]
    if not o then o = { 0, 0, 0 }; ops[i.linedefined] = o end
    return o
  end
  debug.sethook(function(ev)
    -- (levels as at sees them: 1 at, 2 this hook, 3 the running function)
    if ev == "count" then
      local o = at(3)
      if o then o[2] = o[2] + 1 end
    elseif getinfo(2, "S").what == "C" then
      local o = at(4)
      if o then o[3] = o[3] + 1 end
    else
      local o = at(3)
      if o then o[1] = o[1] + 1 end
    end
  end, "c", 1)
  COUNT_OPS = ops
elseif TARGET == "alloc" then
  -- allocs[line] = {calls, KB}: the heap's growth between two hook events
  -- is the function's that ran between them (the innermost Lua frame at
  -- the first; a C function's is its Lua caller's, whose bytecode called
  -- it, a tail call's too), the hook's own taken out (its count read after
  -- its own work). Line 0 is the emulator's.
  local allocs, getinfo, gc = {}, debug.getinfo, collectgarbage
  local function entry(line)
    local o = allocs[line]
    if not o then o = { 0, 0 }; allocs[line] = o end
    return o
  end
  local last, base = nil, 0
  local function at(level)
    local i = getinfo(level, "S")
    if not i then return nil end
    if i.source ~= "=polygate" then return entry(0) end
    return entry(i.linedefined)
  end
  debug.sethook(function(ev)
    local k = gc("count")
    if last then last[2] = last[2] + (k - base) end
    if ev == "count" then
      last = at(3)
    elseif getinfo(2, "S").what ~= "C" then
      last = at(3)
      if last then last[1] = last[1] + 1 end
    end -- (a C function's: its caller's, which ran the call's bytecode)
    if k > 262144 then gc("collect"); gc("stop") end
    base = gc("count")
  end, "c", 1)
  COUNT_ALLOC = allocs
elseif lprof then
  lprof.start("=polygate", tonumber(TARGET), INCL, debug.getinfo(rcall, "S").linedefined)
end
local errs = 0
for _, a in ipairs(calls) do
  local nk = tonumber(a[3])
  local keys, argv = {}, {}
  for i = 1, nk do keys[i] = a[3 + i] end
  for i = 4 + nk, #a do argv[#argv + 1] = a[i] end
  local ok, r = pcall(fns[a[2]:match("_([a-z]+)$")], keys, argv)
  if not ok or (type(r) == "table" and r.err) then errs = errs + 1 end
end
if TARGET == "count" then
  debug.sethook()
  for l, n in pairs(counts) do print("COUNT", l, n) end
elseif TARGET == "ops" then
  debug.sethook()
  for l, o in pairs(COUNT_OPS) do print("OPS", l, o[1], o[2], o[3]) end
elseif TARGET == "alloc" then
  debug.sethook()
  for l, o in pairs(COUNT_ALLOC) do print("ALLOC", l, o[1], string.format("%.0f", o[2] * 1024)) end
elseif lprof then
  print("PROF", lprof.stop())
end
io.stderr:write(#calls, " calls, ", errs, " answered with an error\n")
