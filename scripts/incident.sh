#!/usr/bin/env bash
# Reproduces the reference library's incident over the wire, against a
# sidecar started with scripts/incident.yaml:
#
#   go run ./cmd/sidecar --config scripts/incident.yaml --listen 127.0.0.1:50051 &
#   scripts/incident.sh 127.0.0.1:50051
#
# A single-source scope: failures open the breaker; with fail_fast the next
# call fails circuit_open with the remaining cooldown; during HALF_OPEN a
# second caller is told retry_after 0 (not the probe lease); with wait the
# caller sleeps (inside the sidecar) until the cooldown ends, then probes.
# Every step checks what it prints and the script exits non-zero on the first
# surprise. Needs grpcurl (GRPCURL, default bin/grpcurl: make grpcurl) and python3.
set -euo pipefail
ADDR=${1:?usage: incident.sh HOST:PORT}
GRPCURL=${GRPCURL:-bin/grpcurl}

rpc() { "$GRPCURL" -plaintext -d "$2" "$ADDR" "polygate.admission.v1.AdmissionService/$1"; }
# get PATH reads a dotted path (numbers index lists) from JSON on stdin;
# durations ("1.5s") are printed in whole milliseconds, absent values as "".
get() {
  python3 -c '
import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    v = v[int(k)] if isinstance(v, list) else (v or {}).get(k)
if isinstance(v, str) and v.endswith("s") and v[:-1].replace(".", "", 1).isdigit():
    v = round(float(v[:-1]) * 1000)
print("" if v is None else v)' "$1"
}
ms() { python3 -c 'import time; print(int(time.monotonic() * 1000))'; }
say() { printf '\n== %s\n' "$*"; }
check() { if ! eval "$1"; then echo "FAILED: $2 ($1)" >&2; exit 1; fi; echo "ok: $2"; }

# open SCOPE: three calls whose attempt fails with a 503 open the breaker.
open_breaker() {
  for _ in 1 2 3; do
    p=$(rpc Pick "{\"scope\":\"$1\"}")
    rpc RecordOutcome "{\"scope\":\"$1\",\"callId\":\"$(get callId <<<"$p")\",\"permitId\":\"$(get grant.permitId <<<"$p")\",\"outcome\":\"OUTCOME_TRANSIENT\",\"httpStatus\":503}" >/dev/null
  done
  state=$(rpc DescribeScope "{\"scope\":\"$1\"}" | get scope.sources.0.state)
  check '[ "$state" = BREAKER_STATE_OPEN ]' "$1: three 503s opened the breaker"
}

# config SCOPE: the scope's cooldown and poll interval (ms), as the sidecar
# runs them: every margin below is derived from them.
config() {
  local d; d=$(rpc DescribeScope "{\"scope\":\"$1\"}")
  cooldown=$(get scope.sources.0.config.breaker.cooldown <<<"$d")
  poll=$(get scope.config.pollInterval <<<"$d")
  echo "$1: cooldown ${cooldown}ms, poll_interval ${poll}ms"
}

S=incident-fail-fast
say "1. The relay browns out ($S)"
config $S
open_breaker $S

say "2. fail_fast: the next call fails circuit_open with the remaining cooldown, in milliseconds"
t0=$(ms)
p=$(rpc Pick "{\"scope\":\"$S\"}")
call=$(get callId <<<"$p")
reason=$(get noRunnable.perSourceReasons.0.reason <<<"$p")
check '[ "$reason" = REASON_COOLDOWN ] || [ "$reason" = REASON_CIRCUIT_OPEN ]' "Pick refused by the breaker ($reason)"
d=$(rpc OnNoRunnable "{\"scope\":\"$S\",\"callId\":\"$call\"}")
failed=$(get failure.reason <<<"$d"); retry=$(get failure.retryAfter <<<"$d")
remaining=$(rpc RetryAfter "{\"scope\":\"$S\"}" | get retryAfter)
t1=$(ms)
echo "circuit_open failure: retry_after ${retry}ms; RetryAfter a moment later: ${remaining}ms; both calls took $((t1 - t0))ms"
check '[ "$failed" = FAILURE_REASON_CIRCUIT_OPEN ]' "the call failed circuit_open"
check '[ "$retry" -gt 0 ] && [ "$retry" -le "$cooldown" ]' "retry_after is within the ${cooldown}ms cooldown"
check '[ "$retry" -ge "$remaining" ] && [ $((retry - remaining)) -le $((t1 - t0 + 1)) ]' "retry_after is the remaining cooldown"

say "3. HALF_OPEN: after the cooldown A gets the probe; B is told retry_after 0, not the 60s probe lease"
sleep "$(python3 -c "print($retry / 1000)")"
a=$(rpc Pick "{\"scope\":\"$S\"}")
check '[ "$(get grant.probe <<<"$a")" = True ]' "A got the probe"
b=$(rpc Pick "{\"scope\":\"$S\"}")
check '[ "$(get noRunnable.perSourceReasons.0.reason <<<"$b")" = REASON_PROBE_IN_FLIGHT ]' "B refused: probe_in_flight"
ra=$(get noRunnable.perSourceReasons.0.retryAfter <<<"$b")
check '[ "${ra:-0}" = 0 ]' "B's retry_after is 0"
bd=$(rpc OnNoRunnable "{\"scope\":\"$S\",\"callId\":\"$(get callId <<<"$b")\"}")
ra=$(get failure.retryAfter <<<"$bd")
check '[ "$(get failure.reason <<<"$bd")" = FAILURE_REASON_CIRCUIT_OPEN ] && [ "${ra:-0}" = 0 ]' "B fails fast with retry_after 0"
r=$(rpc RecordOutcome "{\"scope\":\"$S\",\"callId\":\"$(get callId <<<"$a")\",\"permitId\":\"$(get grant.permitId <<<"$a")\",\"outcome\":\"OUTCOME_SUCCESS\",\"httpStatus\":200}")
check '[ "$(get breakerState <<<"$r")" = BREAKER_STATE_CLOSED ]' "A's probe succeeded: the breaker closed"
c=$(rpc Pick "{\"scope\":\"$S\"}")
check '[ "$(get grant.source <<<"$c")" = relay ]' "the next call gets the relay at once (the cooldown memo kept nothing)"

S=incident-wait
say "4. wait ($S): the caller sleeps until the cooldown ends, then gets the probe"
config $S
open_breaker $S
remaining=$(rpc RetryAfter "{\"scope\":\"$S\"}" | get retryAfter)
w=$(rpc Pick "{\"scope\":\"$S\"}")
call=$(get callId <<<"$w")
d=$(rpc OnNoRunnable "{\"scope\":\"$S\",\"callId\":\"$call\"}")
slept=$(get wait.slept <<<"$d")
echo "the sidecar held the caller ${slept}ms (the remaining cooldown was ${remaining}ms just before)"
check '[ -n "$slept" ] && [ "$(get wait.woken <<<"$d")" != True ]' "a Wait, slept inside the sidecar"
check '[ "$slept" -le $((remaining + poll)) ]' "never longer than the remaining cooldown plus one poll interval of jitter"
p=$(rpc Pick "{\"scope\":\"$S\",\"callId\":\"$call\"}")
check '[ "$(get grant.probe <<<"$p")" = True ]' "the same call then got the probe: the wait lasted until the cooldown ended"
r=$(rpc RecordOutcome "{\"scope\":\"$S\",\"callId\":\"$call\",\"permitId\":\"$(get grant.permitId <<<"$p")\",\"outcome\":\"OUTCOME_SUCCESS\",\"httpStatus\":200}")
check 'python3 -c "import json,sys; sys.exit(0 if \"done\" in json.loads(sys.argv[1]) else 1)" "$r"' "and succeeded"

say "incident reproduced: fail_fast fails fast with the true cooldown, HALF_OPEN says 0, wait rides it out"
