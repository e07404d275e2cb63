#!/usr/bin/env bash
# usage: soak_test.sh MER MER_RESIDENCY MER_COMPUTE MER_GATEWAY [SECONDS]
# Fault-injection soak, bounded (default 60 s of load): `mer loadgen` at 8 streams through the
# three daemons while each daemon is SIGKILLed and restarted twice and every read of the expert
# store may fail with EIO, come back short or come back with a flipped bit (mer-residency
# --io-faults). Required: every OK response has the ids the same prompt got before the faults,
# every failure has a status whose message names its cause (UNAVAILABLE, DATA_LOSS,
# DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED; nothing else), no call ends more than 2 s past its
# deadline, and the injected faults fired. Prints the counts.
set -u
MER=$1
RES=$2
COMP=$3
GW=$4
SECONDS_OF_LOAD=${5:-60}
source "$(dirname "$0")/lib.sh"
setup_work soak
FAULTS="seed=7,eio=0.01,short=0.05,flip=0.01"

N=0  # restarts so far, for log names
start_residency() {  # [extra flags]
  N=$((N + 1))
  ( exec "$RES" --store "$WORK/store" --instance "$TAG" --ram-budget 10% --metrics-listen off --check-invariants "$@" >"$WORK/r$N.log" 2>&1 ) &
  RPID=$!; PIDS+=("$RPID")
  wait_log "$WORK/r$N.log" "ready" "$RPID" || fail "mer-residency did not start"
}
start_compute() {
  N=$((N + 1))
  ( exec "$COMP" --store "$WORK/store" --residency "$TAG" --listen "unix:$WORK/compute.sock" --max-sequences 8 \
      --max-batch-tokens 64 --ctx 256 --threads 2 --metrics-listen off >"$WORK/c$N.log" 2>&1 ) &
  CPID=$!; PIDS+=("$CPID")
  wait_log "$WORK/c$N.log" "ready" "$CPID" || fail "mer-compute did not start"
}
start_gateway() {  # ADDRESS
  N=$((N + 1))
  ( exec "$GW" --compute "unix:$WORK/compute.sock" --listen "$1" --http-listen 127.0.0.1:0 --metrics-listen off \
      --max-call-seconds 30 >"$WORK/g$N.log" 2>&1 ) &
  GPID=$!; PIDS+=("$GPID")
  wait_log "$WORK/g$N.log" "ready" "$GPID" || fail "mer-gateway did not start"
  GLOG=$WORK/g$N.log
}
loadgen() {  # ARGS...: 8 streams over 64 prompts of 8 tokens, 16 greedy tokens each
  timeout $((SECONDS_OF_LOAD + 120)) "$MER" loadgen --addr "$ADDR" --concurrency 8 --prompts 64 --prompt-len 8 \
    --max-tokens 16 --seed 3 "$@"
}

timeout 300 "$MER" synth --preset tiny --quant q8_0 --threads 2 --out "$WORK/m.gguf" >/dev/null &&
  timeout 300 "$MER" pack --model "$WORK/m.gguf" --out "$WORK/store" --threads 2 >/dev/null || { fail "synth/pack"; exit 1; }

# The reference: each prompt's ids, without faults.
start_residency
start_compute
start_gateway 127.0.0.1:0
ADDR=$(grep -o 'listening on [0-9.:]*' "$GLOG" | awk '{print $3}')
loadgen --requests 64 --record "$WORK/ref.ids" --timeout-ms 60000 >"$WORK/ref.out" 2>&1 ||
  { fail "reference run: $(cat "$WORK/ref.out")"; exit 1; }
echo "reference: $(grep -c . "$WORK/ref.ids") prompts recorded without faults"
kill -TERM "$RPID"; wait "$RPID"
start_residency --io-faults "$FAULTS"

# The soak: load for SECONDS_OF_LOAD, a SIGKILL and restart every SECONDS_OF_LOAD/7 seconds.
loadgen --requests 1000000 --duration-seconds "$SECONDS_OF_LOAD" --expect "$WORK/ref.ids" --timeout-ms 15000 \
  >"$WORK/soak.out" 2>&1 &
LPID=$!; PIDS+=("$LPID")
step=$(awk -v s="$SECONDS_OF_LOAD" 'BEGIN { printf "%.1f", s / 7 }')
kills=()
for victim in residency compute gateway residency compute gateway; do
  sleep "$step"
  kill -0 "$LPID" 2>/dev/null || break
  case $victim in
    residency) kill -KILL "$RPID"; wait "$RPID" 2>/dev/null; sleep 0.5; start_residency --io-faults "$FAULTS" ;;
    compute) kill -KILL "$CPID"; wait "$CPID" 2>/dev/null; sleep 0.5; start_compute ;;
    gateway) kill -KILL "$GPID"; wait "$GPID" 2>/dev/null; sleep 0.5; start_gateway "$ADDR" ;;
  esac
  kills+=("$victim")
done
wait "$LPID"
grep -E '^(loadgen|throughput|failed|checked|deadlines)' "$WORK/soak.out"
echo "SIGKILLed and restarted: ${kills[*]}"
[ "${#kills[@]}" == 6 ] || fail "only ${#kills[@]} of 6 kills happened during the load"

# Every OK response had the reference ids; every call ended within its deadline; every failure
# names its cause with one of the expected codes.
ok=$(sed -n 's/^checked: *\([0-9]*\) ok calls.*/\1/p' "$WORK/soak.out")
differ=$(sed -n 's/^checked:.*: \([0-9]*\) with other ids/\1/p' "$WORK/soak.out")
overdue=$(sed -n 's/^deadlines: *\([0-9]*\) calls.*/\1/p' "$WORK/soak.out")
silent=$(sed -n 's/.*; \([0-9]*\) failures without a message/\1/p' "$WORK/soak.out")
[ -n "$ok" ] && [ "$ok" -gt 0 ] || fail "no call succeeded during the soak"
[ "$differ" == 0 ] || fail "$differ OK responses had other ids than the reference"
[ "$overdue" == 0 ] || fail "$overdue calls ended more than 2 s past their deadline"
[ "$silent" == 0 ] || fail "$silent failures had no message"
unexpected=$(grep '^failed:' "$WORK/soak.out" | grep -vE '^failed: +[0-9]+ (UNAVAILABLE|DATA_LOSS|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED): .')
[ -z "$unexpected" ] || fail "failures with unexpected statuses: $unexpected"

# The faults fired (the last residency's count; the earlier ones were SIGKILLed before printing).
kill -TERM "$RPID"; wait "$RPID"
line=$(grep -o 'injected faults: .*' "$WORK/r$(ls "$WORK" | sed -n 's/^r\([0-9]*\)\.log$/\1/p' | sort -n | tail -1).log")
echo "last mer-residency: $line"
fired=$(echo "$line" | awk -F'[ =]' '{ for (i = 1; i < NF; ++i) if ($i == "errors" || $i == "short_reads" || $i == "bit_flips") n += $(i + 1) } END { print n + 0 }')
[ "$fired" -gt 0 ] || fail "no fault was injected: $line"
failures=$(cat "$WORK"/r*.log | grep -c "fails its checksum\|Input/output error")
echo "residency logs: $failures load failures or checksum mismatches reported"

finish
