
-- leave.lua: gate.Backend.Leave (gate.(*Line).Leave).
--
-- keys: LINE_KEYS.   argv: LEAVE.   Reply: 1 if it was in line.
local function leave(keys, argv)
  local k = read(LINE_KEYS, keys, 0)
  local e = l_entry(k, read(LEAVE, argv, 0).waiter)
  if e == nil then
    return 0
  end
  l_remove(k, e)
  return 1
end
