#!/usr/bin/env bash
# The batch benchmark through the three daemons (docs/benchmarks.md, "The batch benchmark"):
#   1. a synthetic model written straight into an expert store (`mer synth --store-out`: the
#      Qwen3-30B-A3B geometry is 31 GB, and its GGUF and store would not fit the GPU machine's
#      64 GiB disk together), reused when STORE already holds one;
#   2. mer-residency (RAM tier RAM_BUDGET of the experts), mer-compute (BACKEND, VRAM arena
#      VRAM_BUDGET of the experts, STREAMS sequences batched together) and mer-gateway, each
#      started once the one before is ready;
#   3. a warm-up round, then `mer loadgen`: STREAMS concurrent greedy streams, REQUESTS calls of
#      PROMPT_LEN random prompt tokens and GEN_TOKENS generated tokens each (EOS ignored);
#   4. /metrics of the three daemons scraped before and after the measured run, and a summary:
#      generated tokens/s, TTFT and ITL percentiles (at the client), tokens per forward step (is
#      the batch really STREAMS wide), step time, VRAM and RAM hit rates, uploads, host syncs.
# Programs come from BUNDLE (its bin/ holds mer, mer-residency, mer-compute and mer-gateway, and
# $BUNDLE/run PROGRAM ... runs one of them with its libraries; docs/benchmarks.md, "Machines");
# results go to $OUT (summary.txt, loadgen.log, metrics.txt, daemons.log, synth.log). Every step
# is time-bounded, and all of them together by DEADLINE seconds; the summary is written as the
# steps finish.
#
# On the GPU machine (defaults):   tests/gpu/batch_bench.sh
# A CPU check of the script:       BACKEND=cpu PRESET=tiny BUNDLE=... tests/gpu/batch_bench.sh
set -uo pipefail
# metrics_url, fetch
source "$(dirname "$0")/../integration/lib.sh"
BUNDLE=${BUNDLE:-.gpu/bundle}
OUT=${OUT:-/tmp/mer-batch-out}
BACKEND=${BACKEND:-cuda}
PRESET=${PRESET:-qwen3-30b-a3b}
QUANT=${QUANT:-q8_0}
SKEW=${SKEW:-0.675}  # as run_gpu_checks.sh
STREAMS=${STREAMS:-64}
REQUESTS=${REQUESTS:-$((2 * STREAMS))}
PROMPT_LEN=${PROMPT_LEN:-31}
GEN_TOKENS=${GEN_TOKENS:-128}
RAM_BUDGET=${RAM_BUDGET:-100%}
VRAM_BUDGET=${VRAM_BUDGET:-100%}
POLICY=${POLICY:-lfu}
# One step carries a decode token per running sequence, then prompt chunks: 512 tokens prefill a
# round of 64 31-token prompts in 4 steps. CTX: prompt + generated tokens, rounded up.
MAX_BATCH_TOKENS=${MAX_BATCH_TOKENS:-512}
CTX=${CTX:-$(( (PROMPT_LEN + GEN_TOKENS + 127) / 128 * 128 ))}
THREADS=${THREADS:-0}
STORE=${STORE:-/tmp/mer-batch-$PRESET-$QUANT-skew$SKEW.store}
DEADLINE=${DEADLINE:-570}

START=$(date +%s)
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mer_batch.XXXXXX")
TAG="mer-batch-$$"
PIDS=()
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
run() { "$BUNDLE/run" "$@"; }
# A daemon in the background: exec, so that $! is the daemon itself (cleanup stops that PID; a
# daemon left running from one run would share the GPU with the next and skew it).
daemon() { exec "$BUNDLE/run" "$@"; }
# Seconds left of DEADLINE, capped at $1: every step's timeout.
left() { local l=$(( DEADLINE - ($(date +%s) - START) )); [ "$l" -lt "$1" ] || l=$1; [ "$l" -gt 1 ] || l=1; echo "$l"; }
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do timeout 20 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null; done
  pkill -KILL -f "instance $TAG|residency $TAG" 2>/dev/null  # none should be left; make sure
  for d in residency compute gateway; do
    [ -f "$WORK/$d.log" ] && { echo "==== mer-$d"; cat "$WORK/$d.log"; } >> "$OUT/daemons.log"
  done
  rm -f "/dev/shm/$TAG"* 2>/dev/null
  rm -rf "$WORK"
  note "total: $(( $(date +%s) - START )) s"
}
trap cleanup EXIT
# The threads of each daemon still running (state, kernel wait channel): where a hang sits.
threads() {
  for p in $(pgrep -f "instance $TAG|residency $TAG" 2>/dev/null); do
    [ -d "/proc/$p" ] || continue
    echo "threads of $(tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-60):"
    for t in /proc/"$p"/task/*; do
      echo "  $(basename "$t") $(cat "$t/comm") $(awk '{print $3}' "$t/stat") $(cat "$t/wchan" 2>/dev/null)"
    done
  done
}
die() { note "FAILED: $*"; threads >> "$OUT/threads.txt" 2>&1; exit 1; }
# wait_ready LOG PID SECONDS: until the daemon's "ready" line; fails if it exits or time runs out.
wait_ready() {
  local t0=$SECONDS
  while ! grep -q ': ready' "$1"; do
    kill -0 "$2" 2>/dev/null || { tail -20 "$1"; die "$(basename "$1" .log) exited before it was ready"; }
    [ $((SECONDS - t0)) -lt "$3" ] || { tail -20 "$1"; die "$(basename "$1" .log) not ready in $3 s"; }
    sleep 0.2
  done
  note "$(basename "$1" .log) ready in $((SECONDS - t0)) s"
}
# m FILE 'NAME{LABELS}': a sample's value (0 if absent).
m() { awk -v n="$2" '$1 == n { v = $2 } END { printf "%.17g", v + 0 }' "$1"; }
# d NAME: the sample's value after minus before, from daemon $D's pages.
d() { awk -v a="$(m "$WORK/$D.after" "$1")" -v b="$(m "$WORK/$D.before" "$1")" 'BEGIN { printf "%.17g", a - b }'; }
calc() { awk "BEGIN { printf \"$1\", ($2) }"; }

note "batch benchmark: backend $BACKEND, $PRESET $QUANT skew $SKEW, $STREAMS streams x $REQUESTS requests," \
     "$PROMPT_LEN prompt + $GEN_TOKENS generated tokens, RAM $RAM_BUDGET, VRAM $VRAM_BUDGET," \
     "max batch $MAX_BATCH_TOKENS tokens, ctx $CTX"
command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /' | tee -a "$summary"
note "cpus: $(nproc); memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo);" \
     "/dev/shm free: $(df -h --output=avail /dev/shm | tail -1 | tr -d ' '); disk free: $(df -h --output=avail "$(dirname "$STORE")" | tail -1 | tr -d ' ')"

# 1. The model's expert store.
if [ -s "$STORE/manifest" ]; then
  note "store: $STORE (reused)"
else
  rm -rf "$STORE"
  t0=$SECONDS
  timeout "$(left 480)" "$BUNDLE/run" mer synth --preset "$PRESET" --quant "$QUANT" --router-skew "$SKEW" \
    --threads "$(nproc)" --store-out "$STORE" > "$OUT/synth.log" 2>&1
  rc=$?
  note "synth --store-out: rc=$rc in $((SECONDS - t0)) s, $(du -sh "$STORE" 2>/dev/null | cut -f1)"
  [ $rc -eq 0 ] || die "mer synth"
fi

# The RAM tier lives in /dev/shm and is allocated in full at start: say so when it cannot fit.
if [[ "$RAM_BUDGET" == *% ]]; then
  need=$(awk -v b="$(stat -c %s "$STORE/experts.bin")" -v p="${RAM_BUDGET%\%}" 'BEGIN { printf "%d", b * p / 100 }')
  avail=$(( $(df --output=avail -k /dev/shm | tail -1) * 1024 ))
  [ "$need" -lt "$avail" ] ||
    note "WARNING: a RAM tier of $RAM_BUDGET is $((need >> 30)) GiB, /dev/shm has $((avail >> 30)) GiB free: set RAM_BUDGET lower"
fi

# 2. The daemons.
# EXTRA_RESIDENCY_FLAGS: more mer-residency flags (e.g. --vram-prefetch-inflight 2); RESIDENCY_BIN:
# the bundle's program to run as mer-residency (another build of it, to compare in one run).
# shellcheck disable=SC2086
daemon "${RESIDENCY_BIN:-mer-residency}" --store "$STORE" --instance "$TAG" --ram-budget "$RAM_BUDGET" --policy "$POLICY" \
  --metrics-listen 127.0.0.1:0 --warm ${EXTRA_RESIDENCY_FLAGS:-} > "$WORK/residency.log" 2>&1 &
PIDS+=($!)
wait_ready "$WORK/residency.log" $! "$(left 120)"
compute_flags=(--store "$STORE" --residency "$TAG" --listen "unix:$WORK/compute.sock" --backend "$BACKEND"
               --max-sequences "$STREAMS" --max-batch-tokens "$MAX_BATCH_TOKENS" --ctx "$CTX"
               --threads "$THREADS" --metrics-listen 127.0.0.1:0)
[ "$BACKEND" = cuda ] && compute_flags+=(--vram-expert-budget "$VRAM_BUDGET")
# EXTRA_COMPUTE_FLAGS: more mer-compute flags (e.g. --miss-path host).
# shellcheck disable=SC2206
compute_flags+=(${EXTRA_COMPUTE_FLAGS:-})
# The cuda backend logs its VRAM breakdown at start; with CUDA_DEBUG=1 (MER_CUDA_DEBUG) its stages
# and, on the device miss path, every layer it serves.
[ "${CUDA_DEBUG:-0}" = 1 ] && export MER_CUDA_DEBUG=1
# COMPUTE_BIN: the bundle's program to run as mer-compute (as RESIDENCY_BIN above).
daemon "${COMPUTE_BIN:-mer-compute}" "${compute_flags[@]}" > "$WORK/compute.log" 2>&1 &
PIDS+=($!)
wait_ready "$WORK/compute.log" $! "$(left 300)"
grep -E '^cuda: VRAM|RAM tier|^mer-compute: .*sequences' "$WORK/compute.log" | tee -a "$summary"
RES_URL=$(metrics_url "$WORK/residency.log")
COMP_URL=$(metrics_url "$WORK/compute.log")
daemon mer-gateway --compute "unix:$WORK/compute.sock" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --compute-metrics "$COMP_URL" --residency-metrics "$RES_URL" --max-queue $((4 * STREAMS)) > "$WORK/gateway.log" 2>&1 &
PIDS+=($!)
wait_ready "$WORK/gateway.log" $! "$(left 60)"
ADDR=$(grep -o 'listening on [0-9.:]*' "$WORK/gateway.log" | head -1 | awk '{print $3}')
GW_URL=$(metrics_url "$WORK/gateway.log")
for _ in $(seq 1 100); do
  [ "$(timeout 5 "$BUNDLE/run" mer client --addr "$ADDR" --health 2>/dev/null)" == SERVING ] && break
  sleep 0.1
done

# The RAM tier fills from the store at start (--warm): measure after it has.
t0=$SECONDS
while ! grep -q 'RAM tier warmed' "$WORK/residency.log" && [ $((SECONDS - t0)) -lt "$(left 240)" ]; do sleep 0.5; done
note "residency: $(grep -o 'RAM tier warmed.*' "$WORK/residency.log" || echo 'RAM tier not warmed yet')"

# 3. Warm-up (other prompts: another seed), then the measured run between two scrapes.
timeout "$(left 180)" "$BUNDLE/run" mer loadgen --addr "$ADDR" --concurrency "$STREAMS" --requests "$STREAMS" \
  --prompt-len "$PROMPT_LEN" --max-tokens 16 --seed 999 > "$WORK/warmup.log" 2>&1
note "warm-up ($STREAMS x 16 tokens): rc=$? $(grep '^throughput' "$WORK/warmup.log")"
sleep 0.3  # the compute daemon samples its backend counters at idle ticks (100 ms)
for D in residency compute gateway; do
  url=RES_URL; [ $D = compute ] && url=COMP_URL; [ $D = gateway ] && url=GW_URL
  fetch "${!url}" "$WORK/$D.before" || note "note: no metrics from mer-$D before the run"
done
t0=$SECONDS
timeout "$(left 400)" "$BUNDLE/run" mer loadgen --addr "$ADDR" --concurrency "$STREAMS" --requests "$REQUESTS" \
  --prompt-len "$PROMPT_LEN" --max-tokens "$GEN_TOKENS" > "$OUT/loadgen.log" 2>&1
rc=$?
sleep 0.3
for D in residency compute gateway; do
  url=RES_URL; [ $D = compute ] && url=COMP_URL; [ $D = gateway ] && url=GW_URL
  fetch "${!url}" "$WORK/$D.after" || note "note: no metrics from mer-$D after the run"
  { echo "==== mer-$D before"; cat "$WORK/$D.before" 2>/dev/null; echo "==== mer-$D after"; cat "$WORK/$D.after" 2>/dev/null; } \
    | grep -v '^exposer_' >> "$OUT/metrics.txt"
done
note "loadgen: rc=$rc in $((SECONDS - t0)) s"
grep -E '^(loadgen|throughput|ttft|itl|latency|failed):' "$OUT/loadgen.log" | tee -a "$summary"

# 4. What the daemons saw during the measured run.
D=compute
steps=$(d mer_steps_total)
if [ "$(calc '%d' "$steps > 0")" = 1 ]; then
  note "compute: $steps steps, $(calc '%.1f' "$(d mer_batch_size_sum) / $steps") tokens per step" \
       "(decode + prompt), $(calc '%.2f' "1e3 * $(d mer_step_seconds_sum) / $steps") ms per step," \
       "$(d mer_generated_tokens_total) tokens generated, $(d mer_prompt_tokens_total) prompt tokens"
  half=$(( STREAMS / 2 ))
  le=1; while [ $le -lt $half ]; do le=$((le * 2)); done
  narrow=$(d "mer_batch_size_bucket{le=\"$le\"}")
  note "compute: steps with more than $le tokens: $(calc '%d' "$steps - $narrow") of $steps" \
       "(a decode step of $STREAMS running sequences carries $STREAMS)"
  hist=""
  for b in 1 2 4 8 16 32 64 128 256 512 1024 +Inf; do hist="$hist le$b=$(d "mer_batch_size_bucket{le=\"$b\"}")"; done
  note "compute: batch size histogram (cumulative steps):$hist"
  lookups=$(d 'mer_expert_lookups_total{tier="vram"}')
  if [ "$(calc '%d' "$lookups > 0")" = 1 ]; then
    misses=$(d 'mer_expert_misses_total{tier="vram"}')
    gen=$(d mer_generated_tokens_total)
    note "compute: VRAM hit rate $(calc '%.4f' "1 - $misses / $lookups") ($misses misses of $lookups lookups)," \
         "uploads $(calc '%.1f' "$(d mer_expert_upload_bytes_total) / 1048576") MiB," \
         "host syncs $(d mer_host_syncs_total) ($(calc '%.2f' "$(d mer_host_syncs_total) / $steps") per step," \
         "$(calc '%.3f' "$(d mer_host_syncs_total) / ($gen > 0 ? $gen : 1)") per generated token)"
    note "compute: VRAM bytes: dense $(m "$WORK/compute.after" 'mer_vram_bytes{use="dense"}')" \
         "kv $(m "$WORK/compute.after" 'mer_vram_bytes{use="kv"}')" \
         "workspace $(m "$WORK/compute.after" 'mer_vram_bytes{use="workspace"}')" \
         "arena $(m "$WORK/compute.after" 'mer_vram_bytes{use="arena"}')" \
         "used $(m "$WORK/compute.after" 'mer_vram_bytes{use="used"}')"
  fi
else
  note "compute: no steps counted (metrics missing?)"
fi
D=residency
lookups=$(d 'mer_expert_lookups_total{tier="ram"}')
misses=$(d 'mer_expert_misses_total{tier="ram"}')
note "residency: $lookups RAM lookups, $misses misses$( [ "$(calc '%d' "$lookups > 0")" = 1 ] &&
      echo ", hit rate $(calc '%.4f' "1 - $misses / $lookups")"), read $(calc '%.1f' "$(d mer_expert_read_bytes_total) / 1048576") MiB" \
     "($(calc '%.1f' "$(d mer_expert_read_bytes_total) / 1048576 / ($(m "$WORK/compute.after" mer_generated_tokens_total) - $(m "$WORK/compute.before" mer_generated_tokens_total) + 1e-9)") MiB per generated token)"
# The disk bound (docs/benchmarks.md): the disk's speed, as it warmed the RAM tier at start, over the
# bytes read from the store per generated token; the run's generated tokens/s as a share of it.
gen_tokens=$(calc '%.0f' "$(m "$WORK/compute.after" mer_generated_tokens_total) - $(m "$WORK/compute.before" mer_generated_tokens_total)")
read_bytes=$(d mer_expert_read_bytes_total)
warm_gbps=$(sed -n 's/.*RAM tier warmed: .*(\([0-9.]*\) GB\/s).*/\1/p' "$WORK/residency.log" | tail -1)
throughput=$(sed -n 's/^throughput: \([0-9.]*\) generated tokens\/s.*/\1/p' "$OUT/loadgen.log" | tail -1)
if [ -n "$warm_gbps" ] && [ -n "$throughput" ] && [ "$(calc '%d' "$read_bytes > 0 && $gen_tokens > 0")" = 1 ]; then
  bound=$(calc '%.2f' "$warm_gbps * 1e9 / ($read_bytes / $gen_tokens)")
  note "residency: disk bound $bound tokens/s ($warm_gbps GB/s at warm-up over" \
       "$(calc '%.1f' "$read_bytes / $gen_tokens / 1e6") MB read per generated token); generated $throughput tokens/s," \
       "$(calc '%.2f' "$throughput / $bound") of the bound"
fi
D=gateway
# The gateway's page carries all three daemons' series, each labelled daemon="...".
note "gateway: requests ok $(d 'mer_requests_total{daemon="gateway",status="OK"}'), TTFT mean" \
     "$(calc '%.1f' "1e3 * $(d 'mer_time_to_first_token_seconds_sum{daemon="gateway"}') / ($(d 'mer_time_to_first_token_seconds_count{daemon="gateway"}') + 1e-9)") ms" \
     "(at the gateway)"
command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader | sed 's/^/gpu after: /' | tee -a "$summary"
[ $rc -eq 0 ] || die "mer loadgen (rc $rc)"
echo "==== summary"
cat "$summary"
