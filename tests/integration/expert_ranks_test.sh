#!/usr/bin/env bash
# usage: expert_ranks_test.sh MER MER_COMPUTE MER_GATEWAY
# Expert-parallel ranks through the daemons: mer-compute --expert-ranks N (N CpuEngine ranks in
# one process, each running the experts e with e mod N its rank) behind mer-gateway serves the
# greedy ids `mer generate` gives with one engine, for 1, 2 and 3 ranks and 8 concurrent streams
# of different prompts; --expert-ranks 0, a --gpus list that is not one GPU per rank or given to
# the cpu backend, and the cuda ranks with replicas are refused at start (the cpu
# ranks over a store: expert_ranks_store_test.sh; the cuda ranks' results: cuda_engine_test).
set -u
MER=$1
COMP=$2
GW=$3
source "$(dirname "$0")/lib.sh"
setup_work ranks

timeout 120 "$MER" synth --preset micro --quant q8_0 --threads 2 --out "$WORK/m.gguf" >/dev/null || { fail synth; exit 1; }
eight_reference_ids "$WORK/m.gguf"

for ranks in 1 2 3; do
  sock="$WORK/c$ranks.sock"
  ( exec "$COMP" --model "$WORK/m.gguf" --listen "unix:$sock" --max-sequences 8 --ctx 1024 --threads 3 \
      --expert-ranks "$ranks" --metrics-listen off >"$WORK/c$ranks.log" 2>&1 ) &
  CPID=$!; PIDS+=("$CPID")
  wait_log "$WORK/c$ranks.log" "ready" "$CPID" || { fail "mer-compute --expert-ranks $ranks did not start"; continue; }
  ( exec "$GW" --compute "unix:$sock" --listen 127.0.0.1:0 >"$WORK/g$ranks.log" 2>&1 ) &
  GPID=$!; PIDS+=("$GPID")
  wait_log "$WORK/g$ranks.log" "mer-compute up" "$GPID" || { fail "mer-gateway did not see mer-compute"; continue; }
  ADDR=$(grep -o 'listening on [0-9.:]*' "$WORK/g$ranks.log" | awk '{print $3}')
  eight_streams "ranks$ranks"
  echo "expert ranks $ranks: $SAME of 8 streams give the one-engine ids"
  kill -TERM "$GPID" "$CPID" 2>/dev/null
  wait "$GPID" "$CPID" 2>/dev/null
done

# Refused at start, before any device is touched, with a message naming the flag (the pattern).
refused() {
  local log=$1 pattern=$2; shift 2
  timeout 30 "$COMP" "$@" --listen "unix:$WORK/r.sock" --metrics-listen off >"$log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "$pattern" "$log" ||
    fail "mer-compute $* was not refused with a message naming $pattern (rc=$rc): $(tail -1 "$log")"
}
refused "$WORK/r1.log" '--gpus lists 1 GPU(s) for --expert-ranks 2' --model "$WORK/m.gguf" --backend cuda \
  --expert-ranks 2 --gpus 0
refused "$WORK/r2.log" '--gpus needs --backend cuda' --model "$WORK/m.gguf" --gpus 0,1
refused "$WORK/r3.log" '--expert-ranks' --model "$WORK/m.gguf" --expert-ranks 0
refused "$WORK/r4.log" '--gpus .*is not a GPU' --model "$WORK/m.gguf" --backend cuda --gpus 0,x
refused "$WORK/r6.log" '--replicate-hot-experts with --backend cuda' --model "$WORK/m.gguf" --backend cuda \
  --expert-ranks 2 --replicate-hot-experts 1
finish
