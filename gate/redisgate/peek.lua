-- peek.lua: gate.Backend.Peek (inmem.Backend.Peek, with gate.SourceState.View
-- and gate.SourceState.Verdict per source). It changes no state: the only
-- writes are q_check's removals of leases and admissions already expired.
--
-- KEYS[1]        the scope's progress
-- KEYS[2+4(i-1)] source i: breaker, leases, log, data
-- ARGV  1 now_ms (0: TIME)  2 n  3 tokens, then 6 per source i from
--       4+6(i-1): window_ms, ceiling, max_concurrency, rpm, tpm, lease_ms
-- Reply {progress_ms, now_ms, {breaker view, quota view, verdict} per
--        source}; a verdict is {reason, retry_ms}, Admit's answer now.
local now = now_ms(ARGV[1])
local n = tonumber(ARGV[2])
local tokens = tonumber(ARGV[3])
local out = {}
for i = 1, n do
  local k = 2 + 4 * (i - 1)
  local a = 4 + 6 * (i - 1)
  local b = b_load(KEYS[k])
  local q = q_keys(k + 1)
  local view = { b_view(b, { window = tonumber(ARGV[a]) }, now), q_view(q, now) }
  -- SourceState.Verdict: the quota's refusal first, then the breaker's.
  local reason, wait = q_check(q, limits(a + 2), tonumber(ARGV[a + 1]), tokens, now)
  if reason == R_NONE then
    reason, wait = b_check(b, now)
  end
  view[3] = { reason, wait }
  out[i] = view
end
return { tonumber(redis.call('GET', KEYS[1]) or 0), now, out }
