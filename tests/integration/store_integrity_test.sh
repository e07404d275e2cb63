#!/usr/bin/env bash
# usage: store_integrity_test.sh MER MER_RESIDENCY MER_COMPUTE
# Every byte served from an expert store is checked, and replacing a store never breaks it:
#  1. 64 KiB of random bytes in dense.gguf's tensor data: mer-compute refuses the store at load,
#     naming dense.gguf's checksum and the fix, instead of serving wrong ids;
#  2. `mer pack --force` SIGKILLed midway leaves the store as it was (it verifies, and generates
#     its own ids); the next pack clears what the killed one left;
#  3. a store without its manifest (what an older mer's interrupted pack left) is refused as
#     "incomplete store (interrupted pack)";
#  4. `mer pack --force` of another model over the store a live mer-residency serves: a generation
#     in flight (misses read experts.bin all along) finishes with the old store's ids.
set -u
MER=$1
RES=$2
COMP=$3
source "$(dirname "$0")/lib.sh"
setup_work store

start_residency() {  # STORE LOG
  ( exec "$RES" --store "$1" --instance "$TAG" --ram-budget 10% >"$2" 2>&1 ) &
  RPID=$!; PIDS+=("$RPID")
  wait_log "$2" "ready" "$RPID"
}
generate() {  # STORE MAX_TOKENS
  timeout 120 "$MER" generate --store "$1" --residency "$TAG" --prompt-tokens 1,17,42,99,7,3 --max-tokens "$2" \
    --ignore-eos --print-token-ids --threads 2
}

timeout 300 "$MER" synth --preset tiny --quant q8_0 --threads 2 --seed 1 --out "$WORK/a.gguf" >/dev/null &&
  timeout 300 "$MER" synth --preset tiny --quant q8_0 --threads 2 --seed 2 --out "$WORK/b.gguf" >/dev/null &&
  timeout 300 "$MER" pack --model "$WORK/a.gguf" --out "$WORK/a.store" --threads 2 >/dev/null || { fail "synth/pack"; exit 1; }
WANT_A=$(timeout 120 "$MER" generate --model "$WORK/a.gguf" --prompt-tokens 1,17,42,99,7,3 --max-tokens 200 \
           --ignore-eos --print-token-ids --threads 2 2>/dev/null)
[ -n "$WANT_A" ] || { fail "reference ids"; exit 1; }

# --- 1. dense.gguf damaged ----------------------------------------------------------------------------
cp -r "$WORK/a.store" "$WORK/bad.store"
size=$(stat -c %s "$WORK/bad.store/dense.gguf")
head -c 65536 /dev/urandom | dd of="$WORK/bad.store/dense.gguf" bs=1 seek=$((size - 100000)) conv=notrunc status=none
if start_residency "$WORK/bad.store" "$WORK/bad.r.log"; then
  timeout 60 "$COMP" --store "$WORK/bad.store" --residency "$TAG" --listen "unix:$WORK/bad.sock" --threads 1 \
    --metrics-listen off >"$WORK/bad.c.log" 2>&1; rc=$?
  [ $rc -ne 0 ] || fail "mer-compute served a store whose dense.gguf is damaged"
  grep -q "dense.gguf: checksum 0x[0-9a-f]* over its $size bytes, the manifest has 0x[0-9a-f]*: dense.gguf is damaged (\`mer pack --force\`" \
    "$WORK/bad.c.log" || fail "damaged dense.gguf: $(tail -2 "$WORK/bad.c.log")"
  echo "damaged dense.gguf: mer-compute exit $rc: $(grep -o 'dense.gguf: checksum.*' "$WORK/bad.c.log" | head -1)"
  kill -TERM "$RPID"; wait "$RPID"
else
  fail "mer-residency on the damaged store"
fi

# --- 2. mer pack --force killed midway ------------------------------------------------------------------
# The pack of a tiny model takes some 20 ms: on a busy host it can finish before the kill lands.
# Then the store is b's, as it should be; a's is packed back and the kill tried again.
for attempt in 1 2 3 4 5; do
  ( exec "$MER" pack --force --model "$WORK/b.gguf" --out "$WORK/a.store" --threads 1 --no-direct >"$WORK/kill.log" 2>&1 ) &
  KP=$!
  for _ in $(seq 1 2000); do
    ls "$WORK"/.a.store.pack-*/experts.bin >/dev/null 2>&1 && break
    kill -0 "$KP" 2>/dev/null || break
  done
  kill -KILL "$KP" 2>/dev/null; wait "$KP" 2>/dev/null; krc=$?
  [ $krc -ne 0 ] && break
  echo "  note: attempt $attempt: the pack finished before the kill; packing a.gguf back and trying again"
  timeout 300 "$MER" pack --force --model "$WORK/a.gguf" --out "$WORK/a.store" --threads 2 >/dev/null ||
    { fail "packing a.gguf back"; break; }
done
[ $krc -ne 0 ] || fail "mer pack --force finished before the kill in 5 attempts"
left=$(ls -d "$WORK"/.a.store.pack-* 2>/dev/null | wc -l)
[ "$left" == 1 ] || echo "  note: the pack was killed before (or after) writing experts.bin ($left staging directories)"
timeout 120 "$MER" pack --verify --out "$WORK/a.store" >"$WORK/verify.log" 2>&1 || fail "after the killed pack: $(cat "$WORK/verify.log")"
if start_residency "$WORK/a.store" "$WORK/a.r.log"; then
  got=$(generate "$WORK/a.store" 200 2>"$WORK/a.err")
  [ "$got" == "$WANT_A" ] || fail "after the killed pack the store generates other ids: $(tail -2 "$WORK/a.err")"
  kill -TERM "$RPID"; wait "$RPID"
else
  fail "mer-residency after the killed pack"
fi
echo "pack --force SIGKILLed: store verifies and generates its own ids ($left staging directory left beside it)"

# --- 3. An incomplete store, as an older mer's interrupted pack left it ---------------------------------
cp -r "$WORK/a.store" "$WORK/old.store"
rm "$WORK/old.store/manifest"
timeout 30 "$RES" --store "$WORK/old.store" --instance "$TAG" --ram-budget 10% --metrics-listen off >"$WORK/old.log" 2>&1
grep -q "incomplete store (interrupted pack): experts.bin and dense.gguf but no manifest; pack it again with \`mer pack --force\`" \
  "$WORK/old.log" || fail "incomplete store: $(cat "$WORK/old.log")"
echo "incomplete store: $(grep -o 'incomplete store.*' "$WORK/old.log")"

# --- 4. mer pack --force over the store a live residency serves --------------------------------------------
if start_residency "$WORK/a.store" "$WORK/live.r.log"; then
  ( exec "$MER" generate --store "$WORK/a.store" --residency "$TAG" --prompt-tokens 1,17,42,99,7,3 --max-tokens 200 \
      --ignore-eos --print-token-ids --threads 2 >"$WORK/live.out" 2>"$WORK/live.err" ) &
  GP=$!; PIDS+=("$GP")
  # Once the generation reads experts, stop it, repack under it, and let it go on.
  reading=no
  for _ in $(seq 1 500); do
    fetch "$(metrics_url "$WORK/live.r.log")" "$WORK/live.metrics" &&
      [ "$(metric 'mer_expert_misses_total{tier="ram"}' "$WORK/live.metrics")" -gt 0 ] 2>/dev/null && { reading=yes; break; }
    sleep 0.01
  done
  [ $reading == yes ] || fail "the generation never read from mer-residency"
  kill -STOP "$GP"
  timeout 300 "$MER" pack --force --model "$WORK/b.gguf" --out "$WORK/a.store" --threads 1 >"$WORK/repack.log" 2>&1 ||
    fail "repack: $(cat "$WORK/repack.log")"
  kill -CONT "$GP"
  ls -d "$WORK"/.a.store.pack-* >/dev/null 2>&1 && fail "the repack left its staging directory (or the killed one's)"
  wait "$GP"; rc=$?
  [ $rc -eq 0 ] && [ "$(cat "$WORK/live.out")" == "$WANT_A" ] ||
    fail "a generation over the repacked store: rc=$rc $(tail -2 "$WORK/live.err")"
  misses=$(grep -o 'demands=[0-9]*' "$WORK/live.err" | cut -d= -f2)
  echo "repacked under a live residency: the generation in flight finished with the old ids (rc=$rc, $misses demands)"
  kill -TERM "$RPID"; wait "$RPID"
  timeout 120 "$MER" pack --verify --out "$WORK/a.store" >/dev/null 2>&1 || fail "the repacked store does not verify"
else
  fail "mer-residency for the live repack"
fi

finish
