
-- leave.lua: gate.Backend.Leave (gate.(*Line).Leave).
--
-- keys: LINE_KEYS per source left.   argv: LEAVE.   Reply: how many lines it
-- was in.
local function leave(keys, argv)
  local id, n = read(LEAVE, argv, 0).waiter, 0
  for i = 1, #keys / LINE_KEYS.WIDTH do
    local k = read(LINE_KEYS, keys, LINE_KEYS.WIDTH * (i - 1))
    local e = l_entry(k, id)
    if e ~= nil then
      l_remove(k, e)
      n = n + 1
    end
  end
  return n
end
