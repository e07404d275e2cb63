#!/usr/bin/env bash
# usage: hardening_test.sh MER MER_RESIDENCY MER_COMPUTE MER_GATEWAY
# The three daemons against a hostile or failing host:
#  1. another local user's segment under the instance's name (a valid segment of the right model,
#     made by a mer-residency run as `nobody`, mode 0666): mer-compute refuses to map it, naming
#     its owner; a mer-residency of this user then serves under a fallback name instead of
#     stopping with "File exists", and mer-compute finds it and generates the right ids (needs
#     root and setpriv to act as `nobody`; skipped with a note otherwise);
#  2. mer-residency SIGKILLed and left down: mer-compute logs that it is unreachable, the gateway's
#     health turns NOT_SERVING (and its HTTP /health 503) and a call fails at once with
#     UNAVAILABLE (an HTTP completion with 503) naming mer-residency; after a restart it serves
#     again;
#  3. a call without a deadline on a SIGSTOPped mer-compute ends at the gateway's maximum call
#     duration with DEADLINE_EXCEEDED saying so, over gRPC and over HTTP (504).
set -u
MER=$1
RES=$2
COMP=$3
GW=$4
source "$(dirname "$0")/lib.sh"
setup_work hard

start_residency() {  # LOG [INSTANCE]
  ( exec "$RES" --store "$WORK/store" --instance "${2:-$TAG}" --ram-budget 50% --metrics-listen off >"$1" 2>&1 ) &
  RPID=$!; PIDS+=("$RPID")
  wait_log "$1" "ready" "$RPID"
}
start_compute() {  # LOG
  ( exec "$COMP" --store "$WORK/store" --residency "$TAG" --listen "unix:$WORK/compute.sock" \
      --max-sequences 4 --ctx 4096 --threads 2 --metrics-listen off >"$1" 2>&1 ) &
  CPID=$!; PIDS+=("$CPID")
  wait_log "$1" "ready" "$CPID"
}

timeout 120 "$MER" synth --preset micro --quant q8_0 --threads 2 --out "$WORK/m.gguf" >/dev/null || { fail synth; exit 1; }
timeout 120 "$MER" pack --model "$WORK/m.gguf" --out "$WORK/store" --threads 2 >/dev/null || { fail pack; exit 1; }
chmod -R a+rX "$WORK"
WANT=$(timeout 60 "$MER" generate --model "$WORK/m.gguf" --prompt-tokens 5,6,7 --max-tokens 6 --ignore-eos \
         --print-token-ids --threads 1 2>/dev/null)

# --- 1. Another user's segment under the name ---------------------------------------------------
if [ "$(id -u)" == 0 ] && command -v setpriv >/dev/null 2>&1; then
  ( exec setpriv --reuid 65534 --regid 65534 --clear-groups "$RES" --store "$WORK/store" --instance "$TAG" \
      --ram-budget 50% --metrics-listen off >"$WORK/nobody.log" 2>&1 ) &
  NPID=$!; PIDS+=("$NPID")
  if wait_log "$WORK/nobody.log" "ready" "$NPID"; then
    chmod 0666 "/dev/shm/$TAG"
    echo "segment of another user: $(stat -c '%U %a' "/dev/shm/$TAG") /dev/shm/$TAG, its residency alive"
    # mer-compute must not use it (it waits for a segment of its own user, then gives up).
    start=$(date +%s)
    timeout 60 "$COMP" --store "$WORK/store" --residency "$TAG" --listen "unix:$WORK/c0.sock" --threads 1 \
      --metrics-listen off >"$WORK/c0.log" 2>&1; rc=$?
    [ $rc -ne 0 ] || fail "mer-compute served from another user's segment"
    grep -q "belongs to uid 65534" "$WORK/c0.log" || fail "mer-compute's refusal does not name the owner: $(tail -2 "$WORK/c0.log")"
    echo "  mer-compute refused it after $(( $(date +%s) - start )) s: $(grep -o 'shm segment.*map it' "$WORK/c0.log" | head -1)"
    # This user's residency serves anyway, under a fallback name; compute finds it by its owner.
    if start_residency "$WORK/r0.log"; then
      grep -q "belongs to another user and is left alone; serving as /dev/shm/$TAG\." "$WORK/r0.log" ||
        fail "mer-residency did not say where it serves: $(cat "$WORK/r0.log")"
      [ "$(stat -c %u "/dev/shm/$TAG")" == 65534 ] || fail "the other user's segment was touched"
      got=$(timeout 60 "$MER" generate --store "$WORK/store" --residency "$TAG" --prompt-tokens 5,6,7 \
              --max-tokens 6 --ignore-eos --print-token-ids --threads 1 2>"$WORK/g0.err")
      [ -n "$WANT" ] && [ "$got" == "$WANT" ] || fail "generation beside a squatter: '$got' want '$WANT' $(cat "$WORK/g0.err")"
      echo "  squatted name: mer-residency serves as $(grep -o "serving as /dev/shm/[^ ]*" "$WORK/r0.log" | cut -d/ -f4), ids match=$([ "$got" == "$WANT" ] && echo yes || echo no)"
      kill -TERM "$RPID"; wait "$RPID"
    else
      fail "mer-residency did not start beside another user's segment (it used to stop with 'File exists')"
    fi
  else
    fail "mer-residency as nobody did not start"
  fi
  kill -TERM "$NPID" 2>/dev/null; wait "$NPID" 2>/dev/null
  rm -f "/dev/shm/$TAG"
else
  echo "  note: not root or no setpriv: the other-user segment checks are skipped (see shm_test)"
fi

# --- The three daemons ----------------------------------------------------------------------------
start_residency "$WORK/r1.log" || { fail "mer-residency did not start"; exit 1; }
start_compute "$WORK/c1.log" || { fail "mer-compute did not start"; exit 1; }
( exec "$GW" --compute "unix:$WORK/compute.sock" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
    --metrics-listen off --max-call-seconds 3 >"$WORK/g.log" 2>&1 ) &
GPID=$!; PIDS+=("$GPID")
wait_log "$WORK/g.log" "ready" "$GPID" || { fail "mer-gateway did not start"; exit 1; }
ADDR=$(grep -o 'listening on [0-9.:]*' "$WORK/g.log" | awk '{print $3}')
HTTP=$(grep -o 'http: http://[0-9.:]*' "$WORK/g.log" | awk '{print $2}')
# http_status PATH [BODY]: the HTTP status of a GET (or of a POST of BODY); the body in $WORK/h.out.
http_status() {
  if [ $# -gt 1 ]; then
    timeout 30 curl -s -o "$WORK/h.out" -w '%{http_code}' -H 'Content-Type: application/json' -d "$2" "$HTTP$1"
  else
    timeout 30 curl -s -o "$WORK/h.out" -w '%{http_code}' "$HTTP$1"
  fi
}
wait_health SERVING
[ "$(http_status /health)" == 200 ] || fail "HTTP /health while serving: $(cat "$WORK/h.out")"
out=$(client --prompt-tokens 5,6,7 --max-tokens 6 --ignore-eos --print-token-ids 2>&1)
[ "$out" == "$WANT" ] || fail "first call: '$out'"

# --- 2. A residency outage is visible and fails fast ------------------------------------------------
kill -KILL "$RPID"; wait "$RPID" 2>/dev/null
t0=$(date +%s.%N)
wait_health NOT_SERVING
seen=$(awk -v t0="$t0" -v now="$(date +%s.%N)" 'BEGIN { printf "%.1f", now - t0 }')
grep -q "mer-residency instance '$TAG' is unreachable" "$WORK/c1.log" || fail "mer-compute logged nothing: $(tail -3 "$WORK/c1.log")"
t1=$(date +%s.%N)
client --prompt-tokens 1,2,3 --max-tokens 4 --ignore-eos >/dev/null 2>"$WORK/down.err"
took=$(awk -v t0="$t1" -v now="$(date +%s.%N)" 'BEGIN { printf "%.2f", now - t0 }')
grep -q "UNAVAILABLE: .*mer-residency instance '$TAG' is unreachable" "$WORK/down.err" ||
  fail "residency down: $(cat "$WORK/down.err")"
awk -v t="$took" 'BEGIN { exit !(t < 2) }' || fail "residency down: the call took $took s"
echo "residency down: health NOT_SERVING after $seen s; a call failed in $took s: $(grep -o 'UNAVAILABLE.*' "$WORK/down.err" | cut -c1-110)"
code=$(http_status /health)
[ "$code" == 503 ] && grep -q "mer-residency instance '$TAG' is unreachable" "$WORK/h.out" ||
  fail "HTTP /health with the residency down: $code $(cat "$WORK/h.out")"
code=$(http_status /v1/completions '{"prompt": [1, 2, 3], "max_tokens": 4}')
[ "$code" == 503 ] && grep -q "mer-residency instance '$TAG' is unreachable" "$WORK/h.out" ||
  fail "HTTP completion with the residency down: $code $(cat "$WORK/h.out")"
echo "  HTTP: /health $(http_status /health), a completion $code: $(cut -c1-110 "$WORK/h.out")"
grep "unreachable" "$WORK/c1.log" | head -1 | sed 's/^/  compute: /'
start_residency "$WORK/r2.log" || fail "residency restart"
wait_health SERVING
grep -q "mer-residency instance '$TAG' is reachable again" "$WORK/c1.log" || fail "mer-compute did not log the residency's return"
[ "$(http_status /health)" == 200 ] || fail "HTTP /health after the residency restart: $(cat "$WORK/h.out")"
out=$(client --prompt-tokens 5,6,7 --max-tokens 6 --ignore-eos --print-token-ids 2>&1)
[ "$out" == "$WANT" ] || fail "after the residency restart: '$out'"

# --- 3. The server's maximum call duration ------------------------------------------------------------
# The call goes to mer-compute before the gateway's poll (GetInfo, 2 s timeout) can notice it stopped.
kill -STOP "$CPID"
t1=$(date +%s.%N)
( exec "$MER" client --addr "$ADDR" --prompt-tokens 1,2,3 --max-tokens 200 --ignore-eos >"$WORK/long.out" 2>"$WORK/long.err" ) &
LP=$!
( exec timeout 15 curl -s -o "$WORK/hlong.out" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"prompt": [1, 2, 3], "max_tokens": 200, "ignore_eos": true}' "$HTTP/v1/completions" >"$WORK/hlong.code" ) &
HP=$!
for _ in $(seq 1 150); do kill -0 "$LP" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$LP" 2>/dev/null; then fail "a call on a stopped mer-compute still runs 15 s later"; kill -KILL "$LP"; fi
wait "$LP"
took=$(awk -v t0="$t1" -v now="$(date +%s.%N)" 'BEGIN { printf "%.1f", now - t0 }')
grep -q "DEADLINE_EXCEEDED: the call reached the server's maximum call duration" "$WORK/long.err" ||
  fail "stopped compute: $(cat "$WORK/long.err")"
echo "compute SIGSTOPped: a call without a deadline ended $took s later: $(grep -o 'DEADLINE_EXCEEDED.*' "$WORK/long.err")"
wait "$HP"
[ "$(cat "$WORK/hlong.code")" == 504 ] && grep -q "maximum call duration" "$WORK/hlong.out" ||
  fail "stopped compute over HTTP: $(cat "$WORK/hlong.code") $(cat "$WORK/hlong.out")"
echo "  HTTP: $(cat "$WORK/hlong.code") $(cut -c1-120 "$WORK/hlong.out")"
kill -CONT "$CPID"
wait_health SERVING
out=$(client --prompt-tokens 5,6,7 --max-tokens 6 --ignore-eos --print-token-ids 2>&1)
[ "$out" == "$WANT" ] || fail "after SIGCONT: '$out'"

finish
