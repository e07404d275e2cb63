#!/usr/bin/env bash
# usage: expert_ranks_store_test.sh MER MER_COMPUTE
# Expert-parallel ranks over the expert store, as `mer up --expert-ranks 2 --replicate-hot-experts 2`
# runs them: one mer-residency per rank (--expert-share r/2, its RAM tier sized and warmed for that
# rank's experts), mer-compute's rank r reading from the r-th, each layer's 2 most used experts
# replicated on both ranks. 3 rounds of 8 concurrent streams get the greedy ids of one engine on the
# GGUF file; the gateway's /metrics carries each residency's series with a rank label, each
# compute rank's expert pairs, the replicas and the busiest rank's pairs (and passes promtool);
# rank 1's mer-residency SIGKILLed is restarted by mer up and the same ids are served after;
# mer-compute refuses a --residency list that does not name one instance per rank, mer up a --gpus
# list that is not one GPU per rank or comes without --backend cuda.
set -u
MER=$1
COMP=$2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mer_ranks_store.XXXXXX")
FAILURES=0
UPID=
source "$(dirname "$0")/lib.sh"
trap cleanup_up EXIT

timeout 120 "$MER" synth --preset micro --quant q8_0 --threads 2 --out "$WORK/m.gguf" >/dev/null || { fail synth; exit 1; }
eight_reference_ids "$WORK/m.gguf"

"$MER" up --model "$WORK/m.gguf" --listen 127.0.0.1:0 --http-listen off --metrics-listen 127.0.0.1:0 \
  --ram-budget 50% --threads 2 --expert-ranks 2 --replicate-hot-experts 2 >"$WORK/up.out" 2>"$WORK/up.err" &
UPID=$!
if ! wait_up "$WORK/up"; then
  fail "mer up --expert-ranks 2 did not come up: $(tail -5 "$WORK/up.err")"
  finish
fi
for r in 0 1; do
  grep -q "^\[residency\[$r\]\] .*expert share $r/2" "$WORK/up.err" || fail "residency[$r] does not serve share $r/2"
done
grep -q -- "--expert-ranks 2" <(pgrep -af "mer-compute --store") || fail "mer-compute was not started with 2 ranks"
eight_streams first
echo "mer up --expert-ranks 2 --replicate-hot-experts 2: $SAME of 8 streams give the one-engine ids"
# Enough steps for the replicas to be chosen (every 64 calls) and used: each round takes a step per
# generated token at least, 24.
eight_streams second
echo "  again: $SAME of 8"
eight_streams third
echo "  and again: $SAME of 8"

# The gateway's page: both residencies' series, labelled by rank.
GW_METRICS=$(grep -o 'metrics *http://[^ ]*' "$WORK/up.out" | head -1 | awk '{print $2}')
# compute samples its engine counters after steps at most every 100 ms and at idle ticks (100 ms):
# a scrape right after a burst may precede the sample that counts its end (the 3 rounds' 72 or more
# steps, past the 64th, where the replicas are chosen).
for _ in $(seq 1 50); do
  fetch "$GW_METRICS" "$WORK/metrics.txt" || break
  [ "$(metric 'mer_expert_pairs_total{daemon="compute",rank="1"}' "$WORK/metrics.txt")" -gt 0 ] 2>/dev/null &&
    [ "$(metric 'mer_expert_replicas{daemon="compute"}' "$WORK/metrics.txt")" -gt 0 ] 2>/dev/null && break
  sleep 0.1
done
if [ -s "$WORK/metrics.txt" ]; then
  for r in 0 1; do
    [ "$(metric "mer_scrape_up{daemon=\"residency\",rank=\"$r\"}" "$WORK/metrics.txt")" == 1 ] ||
      fail "no scrape of rank $r's residency: $(grep mer_scrape_up "$WORK/metrics.txt")"
    grep -q "^mer_expert_read_bytes_total{.*rank=\"$r\"" "$WORK/metrics.txt" ||
      fail "no read bytes of rank $r's residency on the gateway's page"
    pairs=$(metric "mer_expert_pairs_total{daemon=\"compute\",rank=\"$r\"}" "$WORK/metrics.txt")
    [ -n "$pairs" ] && [ "$pairs" -gt 0 ] || fail "rank $r computed no expert pairs: $(grep pairs "$WORK/metrics.txt")"
    echo "  rank $r: $pairs expert pairs computed"
  done
  replicas=$(metric 'mer_expert_replicas{daemon="compute"}' "$WORK/metrics.txt")
  busiest=$(metric 'mer_expert_busiest_rank_pairs_total{daemon="compute"}' "$WORK/metrics.txt")
  [ "${replicas:-0}" -gt 0 ] || fail "no hot experts replicated: $(grep replicas "$WORK/metrics.txt")"
  [ "${busiest:-0}" -gt 0 ] || fail "no busiest-rank pairs: $(grep busiest "$WORK/metrics.txt")"
  echo "  $replicas experts replicated; the layers' busiest rank's pairs: $busiest"
  lint_metrics "gateway /metrics with 2 residencies" "$WORK/metrics.txt"
else
  fail "no /metrics from the gateway ($GW_METRICS)"
fi

# Rank 1's mer-residency dies: mer up restarts it, rank 1 re-attaches, the same ids are served.
rpid=$(pgrep -f "mer-residency .*--instance mer-up-$UPID.rank1" | head -1)
if [ -n "$rpid" ]; then
  kill -KILL "$rpid"
  for _ in $(seq 1 300); do grep -q "mer-residency\[1\] exited" "$WORK/up.err" && break; sleep 0.1; done
  grep -q "mer-residency\[1\] exited" "$WORK/up.err" || fail "mer up did not notice rank 1's residency die"
  got=
  for _ in $(seq 1 60); do
    got=$(timeout 60 "$MER" client --addr "$ADDR" --prompt-tokens "$(eight_prompt 0)" --max-tokens 24 --ignore-eos \
            --print-token-ids 2>/dev/null | tail -1) && [ -n "$got" ] && break
    sleep 0.5
  done
  [ "$got" == "${WANT[0]}" ] || fail "after rank 1's residency restarted: '$got' vs '${WANT[0]}'"
  eight_streams after
  echo "rank 1's residency SIGKILLed and restarted: $SAME of 8 streams give the one-engine ids"
else
  fail "no mer-residency of rank 1 found"
fi
upid=$UPID
kill -TERM "$UPID"; wait "$UPID"; rc=$?; UPID=
[ $rc -eq 0 ] || fail "mer up exited $rc after SIGTERM"
ls /dev/shm/mer-up-$upid* >/dev/null 2>&1 && fail "segments left: $(ls /dev/shm/mer-up-$upid*)"

# One instance per rank, or refused at start naming the flags.
timeout 30 "$COMP" --store "$WORK/m.gguf.store" --residency x,y,z --expert-ranks 2 --listen "unix:$WORK/r.sock" \
  --metrics-listen off >"$WORK/r.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- '--residency names 3 .* --expert-ranks 2' "$WORK/r.log" ||
  fail "a --residency list of 3 for 2 ranks was not refused (rc=$rc): $(tail -1 "$WORK/r.log")"
# mer up checks its GPU list before it packs or starts anything.
up_refused() {
  local pattern=$1; shift
  timeout 30 "$MER" up --model "$WORK/m.gguf" --listen 127.0.0.1:0 --http-listen off --metrics-listen 127.0.0.1:0 \
    "$@" >"$WORK/u.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "$pattern" "$WORK/u.log" ||
    fail "mer up $* was not refused with a message naming $pattern (rc=$rc): $(tail -1 "$WORK/u.log")"
}
up_refused '--gpus needs --backend cuda' --gpus 0,1
up_refused '--gpus lists 2 GPU(s) for --expert-ranks 3' --backend cuda --expert-ranks 3 --gpus 0,1
up_refused '--gpus .*is not a GPU' --backend cuda --gpus 0,x
finish
