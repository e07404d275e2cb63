#!/usr/bin/env bash
# usage: gateway_memory_test.sh MER MER_COMPUTE MER_GATEWAY
# The gateway's memory under hostile input, with real daemons (mer-compute on a micro model,
# mer-gateway in front, its HTTP API on too): 64 concurrent calls, each a 4 MB text prompt, over
# gRPC and then over the HTTP API (/v1/completions), must leave the gateway's peak RSS (VmHWM)
# under 200 MB, every call must end with a status naming its cause, and the gateway must then
# serve a normal request. Also: a text prompt that is not UTF-8 is INVALID_ARGUMENT naming the
# field and the byte, and counted in mer_requests_total.
set -u
MER=$1
COMP=$2
GW=$3
source "$(dirname "$0")/lib.sh"
setup_work gwmem

timeout 120 "$MER" synth --preset micro --quant q8_0 --threads 2 --out "$WORK/m.gguf" >/dev/null || { fail synth; exit 1; }
( exec "$COMP" --model "$WORK/m.gguf" --listen "unix:$WORK/compute.sock" --max-sequences 4 --ctx 4096 \
    --threads 1 --metrics-listen off >"$WORK/c.log" 2>&1 ) &
CPID=$!; PIDS+=("$CPID")
wait_log "$WORK/c.log" "ready" "$CPID" || { fail "mer-compute did not start"; exit 1; }
( exec "$GW" --compute "unix:$WORK/compute.sock" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
    >"$WORK/g.log" 2>&1 ) &
GPID=$!; PIDS+=("$GPID")
wait_log "$WORK/g.log" "mer-compute up" "$GPID" || { fail "mer-gateway did not see mer-compute"; exit 1; }
ADDR=$(grep -o 'listening on [0-9.:]*' "$WORK/g.log" | awk '{print $3}')
HTTP=$(grep -o 'http: http://[0-9.:]*' "$WORK/g.log" | awk '{print $2}')
kb() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$GPID/status"; }
echo "gateway up: RSS $(kb VmRSS) kB"

# flood OUT API ALLOWED [loadgen flags]: 64 concurrent 4 MB text prompts (4 000 000 bytes, under
# gRPC's 4 MiB message limit), loadgen's report in OUT: the gateway's peak RSS stays under 200 MB,
# it survives, and each call is refused with a status matching ALLOWED. API (empty for gRPC) ends
# the messages.
flood() {
  local out=$1 api=$2 allowed=$3 peak ok other
  shift 3
  timeout 300 "$MER" loadgen --addr "$ADDR" "$@" --concurrency 64 --requests 64 --prompt-bytes 4000000 \
    --max-tokens 1 --timeout-ms 120000 >"$out" 2>&1
  grep -E '^(loadgen|failed)' "$out"
  peak=$(kb VmHWM)
  echo "64 x 4 MB text prompts$api: gateway peak RSS $((peak / 1024)) MB, RSS after $(( $(kb VmRSS) / 1024 )) MB"
  [ -n "$peak" ] && [ "$peak" -lt $((200 * 1024)) ] || fail "gateway peak RSS ${peak} kB >= 200 MB$api"
  kill -0 "$GPID" 2>/dev/null || fail "the gateway died$api"
  ok=$(grep -o '([0-9]* ok)' "$out" | tr -dc 0-9)
  [ "$ok" == 0 ] || fail "$ok of the 4 MB prompts were served$api"
  other=$(grep '^failed:' "$out" | grep -cvE "$allowed")
  [ "$other" == 0 ] || fail "unexpected statuses$api: $(grep '^failed:' "$out")"
}

# Over gRPC each call is refused as INVALID_ARGUMENT (longer than the context) or
# RESOURCE_EXHAUSTED.
flood "$WORK/load.out" "" 'INVALID_ARGUMENT|RESOURCE_EXHAUSTED'
# The same over the HTTP API: each body is read, parsed and checked in the gateway's intake too.
flood "$WORK/http.out" " over HTTP" 'INVALID_ARGUMENT: HTTP ###: prompt: the text' --http "$HTTP"
timeout 30 "$MER" client --addr "$ADDR" --prompt $'\xe4\xbd' --max-tokens 2 >/dev/null 2>"$WORK/c0.err"
out=$(timeout 30 "$MER" client --addr "$ADDR" --prompt-tokens 1,2,3 --max-tokens 3 --ignore-eos \
        --print-token-ids 2>&1) || fail "a normal request after the flood: $out"

# Malformed text prompts.
grep -q "INVALID_ARGUMENT: prompt.text: not valid UTF-8 at byte 0" "$WORK/c0.err" ||
  fail "a truncated UTF-8 prompt: $(cat "$WORK/c0.err")"
timeout 30 "$MER" client --addr "$ADDR" --prompt $'ok \xff' --max-tokens 2 >/dev/null 2>"$WORK/c1.err"
grep -q "INVALID_ARGUMENT: prompt.text: not valid UTF-8 at byte 3" "$WORK/c1.err" ||
  fail "a prompt with byte 0xff: $(cat "$WORK/c1.err")"
metrics=$(metrics_url "$WORK/g.log")
fetch "$metrics" "$WORK/g.metrics" || fail "gateway /metrics"
invalid=$(metric 'mer_requests_total{daemon="gateway",status="INVALID_ARGUMENT"}' "$WORK/g.metrics")
want=$((2 + $(grep '^failed:.*INVALID_ARGUMENT' "$WORK/load.out" | awk '{s += $2} END {print s + 0}')))
[ "$invalid" == "$want" ] || fail "mer_requests_total{status=INVALID_ARGUMENT} = $invalid, want $want"
echo "malformed prompts: INVALID_ARGUMENT naming the field, counted ($invalid INVALID_ARGUMENT in all)"

finish
