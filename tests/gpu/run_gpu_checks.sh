#!/usr/bin/env bash
# The whole GPU check of the cuda backend in one call on the GPU machine (docs/cuda.md):
#   1. the kernel sweep (cuda_kernels_test), and the same under compute-sanitizer memcheck;
#   2. the engine tests (cuda_engine_test: corpus vs the CPU reference, arena 100% and 10%,
#      mixed batches, 10,000 decode steps without memory growth; cuda_store_test: the same
#      comparison with the experts served by mer-residency from an expert store, RAM tier 10%;
#      cuda_ipc_test: the same with the arena exported over CUDA IPC to a mer-residency process
#      that fills it);
#   3. a synthetic Qwen3-30B-A3B Q8_0 model (mer synth, --router-skew $SKEW) and `mer bench
#      --backend cuda` (31 prompt + 128 generated tokens, 1 warm-up + 3 runs, batch 1) with
#      100%, 50%, 25% and 12.5% of the experts in VRAM, the rest read from the mapped file
#      (RUNSPEC: also pageable uploads, and seeded sampling).
# Programs come from BUNDLE (default .gpu/bundle: bin/ and a run wrapper; docs/benchmarks.md,
# "Machines"); results go to $OUT (logs and a
# summary table, printed last). Every step is time-bounded. STEPS selects steps: kernels, memcheck,
# engine, tests (all three), bench, profile (ncu kernel times at 100%, launches PROFILE_SKIP ..
# + PROFILE_KERNELS, raw CSV in $OUT/$PROFILE_NAME.csv); default "tests bench". Also:
#   ab:       A/B of mer binaries in the bundle's bin/ (AB, default "mer mer_a"; e.g. a build of
#             another commit copied in as mer_a), all experts in VRAM, run alternately AB_ROUNDS
#             (2) times, so that their ratio is measured within one call;
#   inplace:  `mer bench --profile-kernels 1` at 100%: GPU time per kernel kind in place;
#   longctx:  decode and prompt speed at LONGCTX_PROMPTS (2000 8000) prompt tokens, the exact
#             attention kernel (--attention-split-cells 0) against split-K past 1,024 cells
#             (docs/benchmarks.md, "Long contexts").
set -uo pipefail
BUNDLE=${BUNDLE:-.gpu/bundle}
OUT=${OUT:-/tmp/mer-gpu-out}
SKEW=${SKEW:-0.675}  # LRU over 25% of the experts hits ~73% (docs/benchmarks.md), as Qwen3's ~72%
STEPS=${STEPS:-"tests bench"}
# Bench runs as budget:pin:temperature[:prefetch] (pin 0 = pageable uploads; temperature 0 =
# greedy, the method; 1 = seeded sampling; prefetch 0 = no look-ahead prefetch into VRAM).
RUNSPEC=${RUNSPEC:-"100%:1:0 50%:1:0 25%:1:0:1 25%:1:0:0 12.5%:1:0:1 12.5%:1:0:0"}
RUNS=${RUNS:-3}
MODEL=${MODEL:-/tmp/mer-30b-q8_0.gguf}
mkdir -p "$OUT"
run() { "$BUNDLE/run" "$@"; }
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$summary"
nproc | sed 's/^/cpus: /' | tee -a "$summary"

has_step() { for s in "$@"; do [[ " $STEPS " == *" $s "* ]] && return 0; done; return 1; }
if has_step tests kernels; then
  timeout 240 "$BUNDLE/run" cuda_kernels_test > "$OUT/kernels.log" 2>&1
  note "cuda_kernels_test: rc=$? ($(grep -c '^\[       OK' "$OUT/kernels.log") ok, $(grep -c '^\[  FAILED' "$OUT/kernels.log") failed lines)"
  grep -E '^\[  FAILED|Failure|Expected|Which is|Value of' "$OUT/kernels.log" | head -20 | tee -a "$summary"
fi
if has_step tests memcheck; then
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 300 "$BUNDLE/run" "$SAN" --tool memcheck --leak-check full --error-exitcode 9 \
    "$BUNDLE/bin/cuda_kernels_test" > "$OUT/memcheck.log" 2>&1
  note "memcheck cuda_kernels_test: rc=$? ($(grep -m1 'ERROR SUMMARY' "$OUT/memcheck.log"))"
fi
if has_step tests engine; then
  # One case at a time, each time-bounded, so one stuck case cannot take the whole call.
  : > "$OUT/engine.log"
  for f in 'CudaEngine.*' 'CudaVsCpuMixedActivations.*' \
           $(for c in tiny_f32 tiny_f16 tiny_q8_0 tiny_q4_k small_f32 small_f16 small_q8_0 small_q4_k \
                      small_q5_k_m small_q5_k small_iq4_xs small_iq2_xxs tiny_iq4_xs tiny_iq2_xxs tiny_q4_0 tiny_iq4_nl \
                      small_q3_k_m small_q2_k tiny_q3_k tiny_q2_k small_iq2_xs small_iq3_xxs tiny_iq2_xs tiny_iq3_xxs \
                      tiny_q5_0 tiny_q3_k_m tiny_q4_1 tiny_q5_1 tiny_q5_k_m small_iq2_s small_iq3_s small_iq1_s \
                      tiny_iq2_s tiny_iq3_s tiny_iq1_s; do
               echo "Corpus/CudaVsCpu.*/$c"; done); do
    MER_CUDA_DEBUG=1 timeout 90 "$BUNDLE/run" cuda_engine_test --gtest_filter="$f" >> "$OUT/engine.log" 2>&1
    note "cuda_engine_test $f: rc=$?"
  done
  # Experts from an expert store through mer-residency (in process, RAM tier 10%).
  for f in 'CudaFromStore.*' $(for c in tiny_q8_0 tiny_f16 small_q8_0; do echo "Store/CudaFromResidency.*/$c"; done); do
    MER_CUDA_DEBUG=1 timeout 180 "$BUNDLE/run" cuda_store_test --gtest_filter="$f" >> "$OUT/engine.log" 2>&1
    note "cuda_store_test $f: rc=$?"
  done
  # The arena exported over CUDA IPC, filled by a real mer-residency process (it must be in the
  # bundle's bin/, next to cuda_ipc_test, or named by MER_RESIDENCY_BIN).
  for c in tiny_q8_0 tiny_f16 small_q8_0; do
    MER_CUDA_DEBUG=1 timeout 180 "$BUNDLE/run" cuda_ipc_test --gtest_filter="Ipc/CudaIpcArena.*/$c" >> "$OUT/engine.log" 2>&1
    note "cuda_ipc_test $c: rc=$?"
  done
  grep -E '^\[(  FAILED|       OK) |arena .* slots|10000 steps|IPC arena|mer-residency exit' "$OUT/engine.log" | tee -a "$summary"
fi

if has_step bench profile ab inplace longctx && [ ! -s "$MODEL" ]; then
  t0=$(date +%s)
  timeout 400 "$BUNDLE/run" mer synth --preset qwen3-30b-a3b --quant q8_0 --router-skew "$SKEW" \
    --threads "$(nproc)" --out "$MODEL" > "$OUT/synth.log" 2>&1
  rc=$?; note "synth qwen3-30b-a3b q8_0 skew $SKEW: rc=$rc in $(( $(date +%s) - t0 )) s, $(du -h "$MODEL" | cut -f1)"
fi
if has_step profile; then
  # Kernel durations (serialized by ncu, so without PDL overlap) of decode steps: the prompt and
  # the first decode steps are skipped, then PROFILE_KERNELS launches are measured.
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout 300 "$BUNDLE/run" "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
    --launch-skip "${PROFILE_SKIP:-3000}" --launch-count "${PROFILE_KERNELS:-1000}" \
    "$BUNDLE/bin/mer" bench --model "$MODEL" --backend cuda --prompt-tokens 31 --gen-tokens 16 --warmup 0 --runs 1 \
    > "$OUT/${PROFILE_NAME:-profile}.csv" 2> "$OUT/${PROFILE_NAME:-profile}.log"
  note "profile: rc=$? ($(grep -c gpu__time_duration "$OUT/${PROFILE_NAME:-profile}.csv") kernels)"
fi
speeds() { grep -E '^(prompt_tps|decode_tps)' "$1" | awk '{printf "%s %s  ", $1, $2}'; }
if has_step ab; then
  for r in $(seq "${AB_ROUNDS:-2}"); do
    for v in ${AB:-mer mer_a}; do
      timeout 120 "$BUNDLE/run" "$v" bench --model "$MODEL" --backend cuda --prompt-tokens 31 --gen-tokens 128 \
        --warmup 1 --runs "$RUNS" > "$OUT/ab_$v.log" 2>&1
      note "ab round $r $v: rc=$? $(speeds "$OUT/ab_$v.log")"
    done
  done
fi
if has_step inplace; then
  timeout 180 "$BUNDLE/run" mer bench --model "$MODEL" --backend cuda --prompt-tokens 31 --gen-tokens 32 \
    --warmup 1 --runs 1 --profile-kernels 1 > "$OUT/inplace.log" 2>&1
  note "in-place kernel profile: rc=$?"
  sed -n '/kernel profile/,$p' "$OUT/inplace.log" | tee -a "$summary"
fi
if has_step longctx; then
  for p in ${LONGCTX_PROMPTS:-2000 8000}; do
    for cells in 0 1024; do
      timeout 240 "$BUNDLE/run" mer bench --model "$MODEL" --backend cuda --ctx $((p + 300)) --prompt-tokens "$p" \
        --gen-tokens 48 --warmup 0 --runs 1 --attention-split-cells "$cells" > "$OUT/longctx_${p}_$cells.log" 2>&1
      note "longctx prompt $p split-cells $cells: rc=$? $(speeds "$OUT/longctx_${p}_$cells.log")"
    done
  done
fi
if has_step bench; then
  for spec in $RUNSPEC; do
    IFS=: read -r b pin temp pf <<< "$spec"
    pf=${pf:-1}
    echo "=== budget $b pin $pin temperature $temp prefetch $pf" >> "$OUT/bench.log"
    timeout 300 "$BUNDLE/run" mer bench --model "$MODEL" --backend cuda --vram-expert-budget "$b" \
      --pin-experts "$pin" --vram-prefetch "$pf" --temperature "$temp" --seed 1 --prompt-tokens 31 --gen-tokens 128 \
      --warmup 1 --runs "$RUNS" --batch 256 >> "$OUT/bench.log" 2>&1
    echo "rc=$?" >> "$OUT/bench.log"
  done
  # Table: one row per budget.
  awk '
    /^=== budget/ {b=$3; p=$5; tp=$7; pf=$9}
    /^prompt_tps/ {pt=$2} /^decode_tps/ {dt=$2} /^ttft_p50_ms/ {tt=$2} /^vram_hit_rate/ {hr=$2}
    /^upload_mib_per_token/ {up=$2} /^host_syncs_per_token/ {hs=$2} /^peak_vram_gib/ {pv=$2}
    /^misses_per_token/ {mt=$2} /^peak_rss_mib/ {rss=$2} /^prefetch_per_token/ {pfi=$2; pfu=$4; pfw=$6}
    /^rc=/ {printf "%-6s pin=%s T=%s pf=%s prompt %8s tok/s  decode %7s tok/s  ttft %7s ms  hit %6s  miss/tok %6s  prefetch/tok %s issued %s useful %s wasted  upload %7s MiB/tok  syncs/tok %6s  peak VRAM %6s GiB  RSS %s MiB  %s\n", b, p, tp, pf, pt, dt, tt, hr, mt, pfi, pfu, pfw, up, hs, pv, rss, $0; pt=dt=tt=hr=up=hs=pv=mt=rss=pfi=pfu=pfw="-"}
  ' "$OUT/bench.log" | tee -a "$summary"
fi
echo "==== summary"; cat "$summary"
