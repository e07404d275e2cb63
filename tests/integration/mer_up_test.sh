#!/usr/bin/env bash
# usage: mer_up_test.sh MER
# `mer up` as a developer uses it: on a fresh model it packs the store, starts the three daemons
# and prints the gRPC address once the gateway serves (health SERVING at once); `mer client` gets
# the same greedy ids as `mer generate --model`; a SIGKILLed mer-compute is restarted and serving
# resumes; SIGTERM stops all three and mer up exits 0; a second `mer up` reuses the packed store;
# a SIGSTOPped (wedged) mer-compute misses its watchdog and is killed and restarted; a SIGKILLed
# mer up leaves no daemon, segment or run directory behind. Every wait is bounded; processes are
# cleaned up.
set -u
MER=$1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mer_up.XXXXXX")
FAILURES=0
UPID=
source "$(dirname "$0")/lib.sh"
trap cleanup_up EXIT

# start_up LOG [mer up flags]: runs mer up in the background, waits for its address; sets UPID and ADDR.
start_up() {
  local log=$1; shift
  "$MER" up --model "$WORK/m.gguf" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --ram-budget 50% --threads 2 "$@" >"$log.out" 2>"$log.err" &
  UPID=$!
  wait_up "$log" && return 0
  echo "mer up did not come up:"; cat "$log.out" "$log.err"; return 1
}
# client: the call this test repeats, its errors kept in client.err (it replaces lib.sh's client).
client() { timeout 60 "$MER" client --addr "$ADDR" --prompt-tokens 1,17,42,99,7,3 --max-tokens 24 \
             --ignore-eos --print-token-ids 2>>"$WORK/client.err"; }

timeout 120 "$MER" synth --preset micro --quant q8_0 --threads 2 --out "$WORK/m.gguf" >/dev/null || { fail synth; exit 1; }
want=$(timeout 60 "$MER" generate --model "$WORK/m.gguf" --prompt-tokens 1,17,42,99,7,3 --max-tokens 24 \
         --ignore-eos --print-token-ids --threads 2 2>/dev/null)

if start_up "$WORK/up1"; then
  h=$(health)
  [ "$h" == SERVING ] || fail "health right after the ready line: $h"
  grep -q "packing" "$WORK/up1.err" || fail "first mer up did not pack the store"
  got=$(client) || fail "mer client failed: $(tail -2 "$WORK/client.err")"
  [ -n "$want" ] && [ "$got" == "$want" ] || fail "ids through mer up differ: '$got' vs '$want'"
  echo "mer up: serving on $ADDR; ids match=$([ "$got" == "$want" ] && echo yes || echo no)"

  # A dead compute is restarted by mer up; the next request is served.
  cpid=$(pgrep -f "mer-compute --store $WORK/m.gguf.store" | head -1)
  if [ -n "$cpid" ]; then
    kill -KILL "$cpid"
    for _ in $(seq 1 300); do grep -q "mer-compute exited" "$WORK/up1.err" && break; sleep 0.1; done
    grep -q "mer-compute exited" "$WORK/up1.err" || fail "mer up did not notice mer-compute's death"
    got=
    for _ in $(seq 1 60); do got=$(client) && break; sleep 0.5; done
    [ "$got" == "$want" ] || fail "after the compute restart: '$got'"
    echo "compute SIGKILLed: restarted, ids match=$([ "$got" == "$want" ] && echo yes || echo no)"
  else
    fail "no mer-compute process found"
  fi

  kill -TERM "$UPID"
  for _ in $(seq 1 200); do kill -0 "$UPID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$UPID" 2>/dev/null; then fail "mer up still running 20 s after SIGTERM"; fi
  wait "$UPID"; rc=$?
  UPID=
  [ $rc -eq 0 ] || fail "mer up exited $rc after SIGTERM"
  left=$(pgrep -f "$WORK/m.gguf.store" | wc -l)
  [ "$left" -eq 0 ] || fail "$left daemon(s) left running after mer up stopped"
  echo "SIGTERM: mer up exited $rc, daemons left: $left"
else
  fail "first mer up"
fi

if start_up "$WORK/up2"; then
  grep -q "packing" "$WORK/up2.err" && fail "second mer up packed the store again"
  got=$(client) || fail "second mer up: client failed"
  [ "$got" == "$want" ] || fail "second mer up: ids differ"
  kill -INT "$UPID"; wait "$UPID"; rc=$?; UPID=
  [ $rc -eq 0 ] || fail "mer up exited $rc after SIGINT"
  echo "second mer up: reused the store, ids match=$([ "$got" == "$want" ] && echo yes || echo no), SIGINT exit $rc"
else
  fail "second mer up"
fi

# A wedged mer-compute (SIGSTOP) sends no watchdog ping: mer up kills and restarts it.
if start_up "$WORK/up3" --watchdog-seconds 2; then
  cpid=$(pgrep -f "mer-compute --store $WORK/m.gguf.store" | head -1)
  kill -STOP "$cpid"
  for _ in $(seq 1 150); do grep -q "mer-compute exited" "$WORK/up3.err" && break; sleep 0.1; done
  grep -q "mer up: mer-compute sent no watchdog ping for" "$WORK/up3.err" || fail "no watchdog kill: $(tail -3 "$WORK/up3.err")"
  got=
  for _ in $(seq 1 60); do got=$(client) && break; sleep 0.5; done
  [ "$got" == "$want" ] || fail "after the watchdog restart: '$got'"
  echo "compute SIGSTOPped: $(grep -o 'mer-compute sent no watchdog ping.*' "$WORK/up3.err" | head -1); served again=$([ "$got" == "$want" ] && echo yes || echo no)"
  kill -TERM "$UPID"; wait "$UPID"; UPID=
else
  fail "mer up with a watchdog"
fi

# mer up SIGKILLed: its daemons stop and its segment and run directory go.
if start_up "$WORK/up4"; then
  kill -KILL "$UPID"; wait "$UPID" 2>/dev/null
  upid=$UPID; UPID=
  for _ in $(seq 1 150); do
    n=$(pgrep -f "$WORK/m.gguf.store" | wc -l)
    [ "$n" -eq 0 ] && ! ls /dev/shm/mer-up-$upid* >/dev/null 2>&1 && ! ls -d "${TMPDIR:-/tmp}"/mer-up-$upid-* >/dev/null 2>&1 && break
    sleep 0.1
  done
  n=$(pgrep -f "$WORK/m.gguf.store" | wc -l)
  [ "$n" -eq 0 ] || fail "$n daemon(s) still running 15 s after mer up was SIGKILLed"
  ls /dev/shm/mer-up-$upid* >/dev/null 2>&1 && fail "segment left: $(ls /dev/shm/mer-up-$upid*)"
  ls -d "${TMPDIR:-/tmp}"/mer-up-$upid-* >/dev/null 2>&1 && fail "run directory left: $(ls -d "${TMPDIR:-/tmp}"/mer-up-$upid-*)"
  echo "mer up SIGKILLed: daemons left $n, segment and run directory removed"
else
  fail "mer up for the SIGKILL"
fi

if [ $FAILURES -ne 0 ]; then echo "$FAILURES failure(s)"; exit 1; fi
echo "all passed"
