#!/usr/bin/env bash
# usage: loadgen_bench.sh BUILD_BIN_DIR [PRESET] [CONCURRENCIES...]
# Starts the three daemons on a synthetic model (default preset tiny, Q8_0; every expert in the
# RAM tier) and runs `mer loadgen` (31 prompt + 128 generated tokens, greedy) at each
# concurrency (default 1 8 64), with mer-compute batching up to 64 sequences on 2 threads.
# Prints loadgen's lines per run. Cleans up its processes and /dev/shm segment.
set -u
B=$1
PRESET=${2:-tiny}
shift $(( $# >= 2 ? 2 : $# ))
CONC=("$@")
[ ${#CONC[@]} -gt 0 ] || CONC=(1 8 64)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mer_loadgen.XXXXXX")
TAG="mer-bench-$$"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -f /dev/shm/${TAG}* 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
wait_ready() { for _ in $(seq 1 400); do grep -q ready "$1" && return 0; sleep 0.05; done; cat "$1"; exit 1; }

timeout 600 "$B/mer" synth --preset "$PRESET" --quant q8_0 --threads 2 --out "$WORK/m.gguf" >/dev/null || exit 1
timeout 600 "$B/mer" pack --model "$WORK/m.gguf" --out "$WORK/store" --threads 2 >/dev/null || exit 1
"$B/mer-residency" --store "$WORK/store" --instance "$TAG" --ram-budget 100% --metrics-listen off >"$WORK/r.log" 2>&1 &
PIDS+=($!); wait_ready "$WORK/r.log"
"$B/mer-compute" --store "$WORK/store" --residency "$TAG" --listen "unix:$WORK/c.sock" --max-sequences 64 \
  --max-batch-tokens 256 --ctx 512 --threads ${THREADS:-2} --metrics-listen off >"$WORK/c.log" 2>&1 &
PIDS+=($!); wait_ready "$WORK/c.log"
"$B/mer-gateway" --compute "unix:$WORK/c.sock" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --metrics-listen off >"$WORK/g.log" 2>&1 &
PIDS+=($!); wait_ready "$WORK/g.log"
ADDR=$(grep -o 'listening on [0-9.:]*' "$WORK/g.log" | awk '{print $3}')
for _ in $(seq 1 100); do [ "$("$B/mer" client --addr "$ADDR" --health 2>/dev/null)" == SERVING ] && break; sleep 0.05; done
echo "model: $PRESET q8_0; $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$B/mer" loadgen --addr "$ADDR" --concurrency 1 --requests 2 --max-tokens 16 >/dev/null  # warm-up
for c in "${CONC[@]}"; do
  echo "--- concurrency $c"
  timeout 600 "$B/mer" loadgen --addr "$ADDR" --concurrency "$c" --requests $((c < 8 ? 8 : 2 * c)) \
    --prompt-len 31 --max-tokens 128
done
