#!/usr/bin/env bash
# usage: residency_integration_test.sh MER MER_RESIDENCY
# Synthesizes models, packs them, serves each through mer-residency (--ram-budget 10%) and requires
# `mer generate --store --residency` to print the same token ids as `mer generate --model`; checks
# from the daemon's counters that misses were served. Then: a flipped byte in experts.bin must make
# generation fail with DataLoss naming the expert (never print tokens), and a SIGKILLed daemon
# restarted mid-generation must be survived (same tokens), and so must a compute killed
# mid-generation (the daemon serves the next one). While each daemon runs, its Prometheus
# /metrics page (--metrics-listen, default 127.0.0.1:0) is fetched (curl, else bash's /dev/tcp),
# linted with `promtool check metrics` (skipped if promtool is absent), and its counters must equal
# the ones the daemon prints at exit. Always cleans up its processes and /dev/shm segments; every
# command runs under a timeout.
set -u
MER=$1
RES=$2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mer_integration.XXXXXX")
TAG="mer-it-$$"
PIDS=()
FAILURES=0
PROMPT=1,17,42,99,7,3
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -f /dev/shm/${TAG}-* 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
source "$(dirname "$0")/lib.sh"

# start_daemon STORE INSTANCE LOG [extra flags] -> sets DPID
start_daemon() {
  local store=$1 inst=$2 log=$3
  shift 3
  # exec: $! is mer-residency itself (so SIGKILL reaches it); the trap and ctest's TIMEOUT bound it.
  ( exec "$RES" --store "$store" --instance "$inst" --ram-budget 10% --check-invariants "$@" >"$log" 2>&1 ) &
  DPID=$!
  PIDS+=("$DPID")
  wait_log "$log" "ready" "$DPID"
}
stop_daemon() {  # PID LOG: SIGTERM, wait (bounded), require the counters line
  local pid=$1 log=$2
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}
counter() { grep -o "counters .*" "$2" | tail -1 | grep -o " $1=[0-9]*" | cut -d= -f2; }

# fetch_metrics LOG OUT: GET the /metrics URL the daemon printed.
fetch_metrics() {
  local url
  url=$(metrics_url "$1")
  [ -n "$url" ] || { echo "no metrics URL in $1"; return 1; }
  fetch "$url" "$2"
}

gen_model() { timeout 120 "$MER" generate --model "$1" --prompt-tokens $PROMPT --max-tokens 32 \
                --print-token-ids --ignore-eos --threads 2 2>"$2"; }
gen_store() { timeout 120 "$MER" generate --store "$1" --residency "$2" --prompt-tokens $PROMPT \
                --max-tokens 32 --print-token-ids --ignore-eos --threads 2 2>"$3"; }

run_case() {  # NAME SYNTH_FLAGS...
  local name=$1
  shift
  local gguf=$WORK/$name.gguf store=$WORK/$name.store inst=${TAG}-$name
  timeout 300 "$MER" synth "$@" --threads 2 --out "$gguf" >/dev/null || { fail "$name: synth"; return; }
  timeout 300 "$MER" pack --model "$gguf" --out "$store" --threads 2 >/dev/null || { fail "$name: pack"; return; }
  local want got
  want=$(gen_model "$gguf" "$WORK/$name.model.err") || { fail "$name: generate --model"; cat "$WORK/$name.model.err"; return; }
  start_daemon "$store" "$inst" "$WORK/$name.daemon.log" || { fail "$name: daemon"; return; }
  got=$(gen_store "$store" "$inst" "$WORK/$name.store.err") || { fail "$name: generate --residency"; cat "$WORK/$name.store.err"; }
  local prom=$WORK/$name.metrics have_metrics=yes
  fetch_metrics "$WORK/$name.daemon.log" "$prom" || { fail "$name: fetching /metrics"; have_metrics=no; }
  stop_daemon "$DPID" "$WORK/$name.daemon.log"
  [ -e "/dev/shm/$inst" ] && fail "$name: segment /dev/shm/$inst left behind"
  if [ "$want" != "$got" ] || [ -z "$want" ]; then
    fail "$name: token ids differ"; echo "  model:     $want"; echo "  residency: $got"
  fi
  local misses bytes loads
  misses=$(counter misses "$WORK/$name.daemon.log")
  bytes=$(counter bytes_read "$WORK/$name.daemon.log")
  loads=$(counter loads "$WORK/$name.daemon.log")
  echo "$name: ids match=$([ "$want" == "$got" ] && echo yes || echo no) misses=$misses loads=$loads bytes_read=$bytes"
  echo "  daemon: $(grep -o 'RAM tier [0-9]* slots' "$WORK/$name.daemon.log")"
  echo "  client: $(grep '^residency:' "$WORK/$name.store.err")"
  if [ -z "$misses" ] || [ "$misses" -eq 0 ] || [ -z "$loads" ] || [ "$loads" -eq 0 ]; then
    fail "$name: the daemon served no misses"; cat "$WORK/$name.daemon.log"
  fi
  [ "$have_metrics" = yes ] || return
  lint_metrics "$name" "$prom"
  local m_misses m_bytes m_lookups blob
  m_misses=$(metric 'mer_expert_misses_total{tier="ram"}' "$prom")
  m_lookups=$(metric 'mer_expert_lookups_total{tier="ram"}' "$prom")
  m_bytes=$(metric 'mer_expert_read_bytes_total' "$prom")
  blob=$(grep -o 'experts of [0-9]* bytes' "$WORK/$name.daemon.log" | head -1 | grep -o '[0-9]*')
  echo "  /metrics: misses=$m_misses lookups=$m_lookups read_bytes=$m_bytes (blob $blob bytes)"
  [ "$m_misses" == "$misses" ] || fail "$name: mer_expert_misses_total=$m_misses, the daemon printed misses=$misses"
  [ "$m_bytes" == "$bytes" ] || fail "$name: mer_expert_read_bytes_total=$m_bytes, the daemon printed bytes_read=$bytes"
  if [ -n "$blob" ] && [ -n "$m_bytes" ] && [ -n "$m_misses" ]; then
    # No prefetch and no refetch here: every read is a miss's (coalesced misses share one).
    local reads=$((m_bytes / blob))
    if [ $((m_bytes % blob)) -ne 0 ] || [ "$reads" -lt 1 ] || [ "$reads" -gt "$m_misses" ]; then
      fail "$name: read bytes $m_bytes are not 1..misses ($m_misses) blobs of $blob bytes"
    fi
  fi
  [ -n "$m_lookups" ] && [ "$m_lookups" -ge "${m_misses:-0}" ] || fail "$name: lookups $m_lookups < misses $m_misses"
  grep -q '^mer_build_info{version="[^"]*"} 1$' "$prom" || fail "$name: no mer_build_info"
  grep -q '^mer_io_read_seconds_bucket{le="+Inf"} ' "$prom" || fail "$name: no mer_io_read_seconds histogram"
  local slots m_slots m_resident
  slots=$(grep -o 'RAM tier [0-9]* slots' "$WORK/$name.daemon.log" | grep -o '[0-9]*')
  m_slots=$(awk '/^mer_tier_slots\{/ { n += $2 } END { printf "%d", n }' "$prom")
  m_resident=$(metric 'mer_tier_slots{state="resident",tier="ram"}' "$prom")
  [ "$m_slots" == "$slots" ] || fail "$name: mer_tier_slots sum to $m_slots, the RAM tier has $slots"
  [ -n "$m_resident" ] && [ "$m_resident" -gt 0 ] || fail "$name: no resident slots in mer_tier_slots"
}

run_case micro_q8 --preset micro --quant q8_0
run_case tiny_q8 --preset tiny --quant q8_0
run_case tiny_f16 --preset tiny --quant f16
run_case tiny_e32 --preset tiny --quant q8_0 --experts 32 --experts-used 4

# Fault: a flipped byte in one blob must give DataLoss naming the expert, and no tokens.
if [ -d "$WORK/micro_q8.store" ]; then
  bad=$WORK/bad.store
  cp -r "$WORK/micro_q8.store" "$bad"
  # The first blob (layer 0, expert 0) starts at offset 0 of experts.bin.
  python3 - "$bad/experts.bin" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(100); b = f.read(1); f.seek(100); f.write(bytes([b[0] ^ 0xFF]))
PY
  inst=${TAG}-bad
  if start_daemon "$bad" "$inst" "$WORK/bad.daemon.log"; then
    out=$(gen_store "$bad" "$inst" "$WORK/bad.err"); rc=$?
    if fetch_metrics "$WORK/bad.daemon.log" "$WORK/bad.metrics"; then
      lint_metrics corrupt "$WORK/bad.metrics"
      bad_crc=$(metric 'mer_checksum_failures_total' "$WORK/bad.metrics")
      [ -n "$bad_crc" ] && [ "$bad_crc" -gt 0 ] || fail "corrupt store: mer_checksum_failures_total=$bad_crc"
      echo "  /metrics: mer_checksum_failures_total=$bad_crc"
    else
      fail "corrupt store: fetching /metrics"
    fi
    stop_daemon "$DPID" "$WORK/bad.daemon.log"
    if [ $rc -eq 0 ] || [ -n "$(echo "$out" | tr -d '[:space:]')" ]; then
      fail "corrupt store: generation succeeded or printed tokens (rc=$rc): $out"
    fi
    if ! grep -qi "expert" "$WORK/bad.err" || ! grep -qi "checksum\|DataLoss\|DATA_LOSS\|crc" "$WORK/bad.err"; then
      fail "corrupt store: error does not name the expert / the checksum"; cat "$WORK/bad.err"
    fi
    echo "corrupt: rc=$rc error: $(grep 'mer generate' "$WORK/bad.err")"
    echo "  daemon: checksum_failures=$(counter checksum_failures "$WORK/bad.daemon.log") load_failures=$(counter load_failures "$WORK/bad.daemon.log")"
    [ "${bad_crc:-}" == "$(counter checksum_failures "$WORK/bad.daemon.log")" ] ||
      fail "corrupt store: mer_checksum_failures_total=${bad_crc:-} differs from the daemon's checksum_failures"
  else
    fail "corrupt store: daemon"
  fi
fi

# Prefetch end to end: compute's routed hints feed the daemon's predictor, which prefetches into a
# 25% RAM tier; on a model with skewed routing (as real routing is) some prefetches are used, and
# the ids stay the GGUF's.
pf=$WORK/skewed
if timeout 300 "$MER" synth --preset tiny --quant q8_0 --router-skew 0.5 --threads 2 --out "$pf.gguf" >/dev/null &&
   timeout 300 "$MER" pack --model "$pf.gguf" --out "$pf.store" --threads 2 >/dev/null; then
  inst=${TAG}-prefetch
  want=$(gen_model "$pf.gguf" "$WORK/pf.model.err")
  if start_daemon "$pf.store" "$inst" "$WORK/pf.log" --ram-budget 25% --prefetch; then
    got=$(gen_store "$pf.store" "$inst" "$WORK/pf.err") || { fail "prefetch: generate"; cat "$WORK/pf.err"; }
    fetch_metrics "$WORK/pf.log" "$WORK/pf.metrics" || fail "prefetch: fetching /metrics"
    stop_daemon "$DPID" "$WORK/pf.log"
    [ -n "$want" ] && [ "$want" == "$got" ] || fail "prefetch: ids differ from the GGUF's"
    issued=$(counter prefetch_issued "$WORK/pf.log")
    useful=$(counter prefetch_useful "$WORK/pf.log")
    hints=$(counter hints "$WORK/pf.log")
    m_issued=$(metric 'mer_prefetch_issued_total' "$WORK/pf.metrics")
    m_useful=$(metric 'mer_prefetch_useful_total' "$WORK/pf.metrics")
    echo "prefetch: ids match=$([ "$want" == "$got" ] && echo yes || echo no) hints=$hints issued=$issued useful=$useful wasted=$(counter prefetch_wasted "$WORK/pf.log") misses=$(counter misses "$WORK/pf.log")"
    [ -n "$hints" ] && [ "$hints" -gt 0 ] || fail "prefetch: the daemon received no hints"
    [ -n "$issued" ] && [ "$issued" -gt 0 ] || fail "prefetch: nothing prefetched"
    [ -n "$useful" ] && [ "$useful" -gt 0 ] || fail "prefetch: no prefetch was useful"
    # /metrics was read before the daemon stopped: its counts can only be behind the final ones.
    [ -n "$m_issued" ] && [ "$m_issued" -le "$issued" ] && [ -n "$m_useful" ] && [ "$m_useful" -le "$useful" ] ||
      fail "prefetch: /metrics issued=$m_issued useful=$m_useful exceed the daemon's final counters"
  else
    fail "prefetch: daemon"
  fi
else
  fail "prefetch: synth/pack of the skewed model"
fi

# Restart: SIGKILL the daemon while a long generation runs, start a new one; same tokens.
if [ -d "$WORK/tiny_q8.store" ]; then
  inst=${TAG}-restart
  store=$WORK/tiny_q8.store
  want=$(timeout 120 "$MER" generate --model "$WORK/tiny_q8.gguf" --prompt-tokens $PROMPT --max-tokens 200 \
           --print-token-ids --ignore-eos --threads 2 2>/dev/null)
  if start_daemon "$store" "$inst" "$WORK/r1.log" --metrics-listen off; then
    grep -q '^metrics: ' "$WORK/r1.log" && fail "--metrics-listen off: the daemon still serves metrics"
    timeout 120 "$MER" generate --store "$store" --residency "$inst" --prompt-tokens $PROMPT --max-tokens 200 \
      --print-token-ids --ignore-eos --threads 2 >"$WORK/r.out" 2>"$WORK/r.err" &
    GPID=$!
    PIDS+=("$GPID")
    sleep 0.3
    kill -KILL "$DPID"; wait "$DPID" 2>/dev/null
    start_daemon "$store" "$inst" "$WORK/r2.log" || fail "restart: second daemon"
    wait "$GPID"; rc=$?
    stop_daemon "$DPID" "$WORK/r2.log"
    got=$(cat "$WORK/r.out")
    if [ $rc -ne 0 ] || [ "$want" != "$got" ]; then
      fail "restart: rc=$rc, ids match: $([ "$want" == "$got" ] && echo yes || echo no)"; cat "$WORK/r.err"
    fi
    grep -q "reconnects=[1-9]" "$WORK/r.err" || echo "  note: generation did not see the restart (it finished first)"
    echo "restart: rc=$rc ids match=$([ "$want" == "$got" ] && echo yes || echo no) $(grep '^residency:' "$WORK/r.err")"
  else
    fail "restart: daemon"
  fi
fi

# Compute killed: SIGKILL a generation mid-stream; the daemon stays up and serves the next
# compute (the dead one's pins stop counting with its incarnation) with the same tokens.
if [ -d "$WORK/tiny_q8.store" ]; then
  inst=${TAG}-ckill
  store=$WORK/tiny_q8.store
  want=$(gen_model "$WORK/tiny_q8.gguf" "$WORK/ck.model.err")
  if start_daemon "$store" "$inst" "$WORK/ck.log" --metrics-listen off; then
    # exec, not timeout: the SIGKILL must reach mer itself (ctest's TIMEOUT bounds the test).
    ( exec "$MER" generate --store "$store" --residency "$inst" --prompt-tokens $PROMPT --max-tokens 400 \
      --print-token-ids --ignore-eos --threads 2 >/dev/null 2>"$WORK/ck1.err" ) &
    GPID=$!
    PIDS+=("$GPID")
    sleep 0.3
    kill -KILL "$GPID"; wait "$GPID" 2>/dev/null
    grep -q "generated" "$WORK/ck1.err" && echo "  note: the first generation finished before the kill"
    kill -0 "$DPID" 2>/dev/null || fail "compute killed: the daemon died with it"
    got=$(gen_store "$store" "$inst" "$WORK/ck2.err") || { fail "compute killed: next generation failed"; cat "$WORK/ck2.err"; }
    kill -0 "$DPID" 2>/dev/null || fail "compute killed: the daemon is gone after the second compute"
    stop_daemon "$DPID" "$WORK/ck.log"
    [ -n "$want" ] && [ "$want" == "$got" ] || fail "compute killed: ids differ after the restart"
    echo "compute killed: daemon survived, next compute's ids match=$([ "$want" == "$got" ] && echo yes || echo no)"
  else
    fail "compute killed: daemon"
  fi
fi

if [ $FAILURES -ne 0 ]; then echo "$FAILURES failure(s)"; exit 1; fi
echo "all passed"
