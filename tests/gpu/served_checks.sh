#!/usr/bin/env bash
# The served GPU path on the GPU machine, in steps (STEPS, default "engine geometries bench"):
#   ipc:        cuda_ipc_test (the arena over CUDA IPC filled by a mer-residency process: preloaded,
#               device-decided misses, host-served misses) on tiny and small Q8_0;
#   kernels:    cuda_kernels_test (KERNELS_FILTER, default all), every kernel against its CPU
#               reference, for at most KERNELS_SECONDS (default 120; the whole suite takes longer
#               on an H100);
#   engine:     cuda_engine_test with ENGINE_FILTER (default: random geometries, RandomGeometry: 24
#               of them, arena 100% and 25%, and two corpus cases), for at most ENGINE_SECONDS
#               (default 240: enough for the default filter, not for '*' on an H100);
#   geometries: tests/integration/served_geometries_test.sh with --backend cuda on GEOM_SEEDS (RANK_GPUS,
#               e.g. 0,0: also through two cuda expert ranks on those GPUs)
#               (engine alone, mer bench, and mer up + mer client, against the CPU reference);
#   bench:      the Qwen3-30B-A3B geometry Q8_0 (--router-skew SKEW) as an expert store
#               (mer synth --store-out, reused if STORE has one), then for each VRAM budget of
#               BUDGETS: `mer bench --backend cuda --store` beside a mer-residency (one process,
#               DecodeGreedy), and the three daemons with one stream (tests/gpu/batch_bench.sh
#               STREAMS=1) for each of MISS_PATHS (mer-compute --miss-path; CUDA_DEBUG=1 logs
#               the device path's layers): decode tokens/s, host syncs per token, side by side;
#   profile:    `mer bench --profile-kernels 1` on the same store, every expert in VRAM, one
#               prompt of each of PROFILE_PROMPTS tokens: GPU time per kernel kind of a prompt step
#               (a proxy for a batch step of as many tokens), for each program of PROFILE_BINS and
#               setting of PROFILE_ENVS (MER_CUDA_MMA=auto, 0, 1 or fast: the
#               multi-token kernels, docs/cuda.md);
#   served:     the same store through the three daemons, one stream, for each of SERVED_RUNS
#               ("VRAM:RAM:MISS_PATH:ARENA_POLICY:RAM_POLICY[:VRAM_PREFETCH_COPIES[:RESIDENCY_BIN[:COMPUTE_BIN]]]"
#               each, the last two programs of the bundle run as mer-residency and mer-compute, to
#               compare builds in one run; e.g. 25%:25%:device:lfu:lfu for
#               a quarter of the experts in VRAM, another quarter in RAM and the rest read from
#               the store): decode tokens/s, hit rates, disk MiB per generated token;
#   faults:     tests/integration/system_integration_test.sh with mer-compute on the GPU
#               (FAULT_COMPUTE_FLAGS): streams, invalid requests, cancels, SIGKILL of
#               mer-residency and of mer-compute mid-stream, against the CPU reference's ids;
#   cpu:        expert_cpu_bench (one missed expert on the host's cores, 1-16 threads) and
#               miss_path_bench (the same expert over PCIe beside the CPU path);
#   batch:      tests/gpu/batch_bench.sh with 64 streams, every expert in VRAM, for each setting of
#               BATCH_ENVS;
#   peer:       mer beside llama.cpp's CUDA build on the same GGUF, for each of PEER_MODELS
#               ("LABEL:PRESET:QUANT[:LAYERS[:DEPTH]]", written by `mer synth --row-pool 61 --router-skew
#               SKEW`, deleted after use): `mer bench --backend cuda --model` at each prompt of
#               PEER_PROMPTS (every expert in VRAM) for each --multi-token-kernels of PEER_KERNELS
#               (each "KERNELS[,VAR=value...]": the environment of that run, e.g. fast,MER_CUDA_MMA_TILED=0),
#               and a 31-token prompt at each VRAM budget of
#               PEER_BUDGETS below 100%, then `llama-bench` (LLAMA_BENCH, default the bundle's) on
#               the same file, all layers on the GPU (-p PEER_PROMPTS -n PEER_GEN, flash attention)
#               and, for each budget below 100%, with the experts of the other layers on the CPU
#               (-ncmoe: llama.cpp places experts by layer, not by expert); with DEPTH, decode after
#               a prompt of DEPTH tokens in both (mer bench --prompt-tokens DEPTH, llama-bench -d DEPTH);
#               each kernel choice's per-kernel GPU time at each prompt of PEER_PROFILE_PROMPTS; with
#               PEER_REMOVE_STORE=1 the store of the steps before is deleted first (disk room).
# Programs come from BUNDLE (bin/ and a run wrapper; docs/benchmarks.md, "Machines"); results
# under OUT (summary.txt last). Every step is time-bounded by DEADLINE (seconds since the start),
# so that the whole run ends within it.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BUNDLE=${BUNDLE:-.gpu/bundle}
OUT=${OUT:-/tmp/mer-served-out}
STEPS=${STEPS:-"engine geometries bench"}
GEOM_SEEDS=${GEOM_SEEDS:-"$(seq -s ' ' 1 20)"}
SKEW=${SKEW:-0.675}
# --row-pool of the store's synth: 0 (every row its own) for the runs whose hit rates are compared
# across runs (routing depends on the weights); e.g. 61 for speed-only steps (profile, batch), written
# at the disk's speed.
STORE_ROW_POOL=${STORE_ROW_POOL:-0}
STORE=${STORE:-/tmp/mer-30b-q8_0-skew$SKEW-pool$STORE_ROW_POOL.store}
BUDGETS=${BUDGETS:-"100%"}
MISS_PATHS=${MISS_PATHS:-"host"}
SERVED_RUNS=${SERVED_RUNS:-"25%:100%:device:lfu:lfu 25%:25%:device:lfu:lfu"}
SERVED_REQUESTS=${SERVED_REQUESTS:-3}  # requests of 31 + 128 tokens per served run, one after another
KERNELS_FILTER=${KERNELS_FILTER:-"*"}
KERNELS_SECONDS=${KERNELS_SECONDS:-120}
ENGINE_SECONDS=${ENGINE_SECONDS:-240}
PROFILE_PROMPTS=${PROFILE_PROMPTS:-"77"}
PROFILE_BINS=${PROFILE_BINS:-"mer"}  # programs of the bundle to profile in turn (e.g. an older mer beside)
PROFILE_ENVS=${PROFILE_ENVS:-"MER_CUDA_MMA=auto"}  # an environment setting per profile run, in turn
BATCH_ENVS=${BATCH_ENVS:-"MER_CUDA_MMA=auto"}   # the same for the batch step (settings of a run joined by ',')
ENGINE_FILTER=${ENGINE_FILTER:-"Seeds/RandomGeometry.*:Corpus/CudaVsCpu.*/tiny_q8_0:Corpus/CudaVsCpu.*/small_q4_k"}
FAULT_COMPUTE_FLAGS=${FAULT_COMPUTE_FLAGS:-"--backend cuda --vram-expert-budget 50% --miss-path device"}
ONE_PROCESS=${ONE_PROCESS:-1}  # 0: skip the one-process mer bench of the bench step
PEER_MODELS=${PEER_MODELS:-"a3b-q8_0:qwen3-30b-a3b:q8_0"}
PEER_PROMPTS=${PEER_PROMPTS:-"512 2048"}
PEER_BUDGETS=${PEER_BUDGETS:-"100% 25%"}
PEER_GEN=${PEER_GEN:-128}
PEER_RUNS=${PEER_RUNS:-2}  # measured runs of each mer bench and llama-bench repetitions (-r)
PEER_KERNELS=${PEER_KERNELS:-"auto"}  # mer bench --multi-token-kernels, each in turn
PEER_PROFILE_PROMPTS=${PEER_PROFILE_PROMPTS:-""}  # prompts to profile per kernel choice (--profile-kernels 1)
PEER_REMOVE_STORE=${PEER_REMOVE_STORE:-0}  # 1: delete STORE before the peer step (disk room for its GGUF)
LLAMA_BENCH=${LLAMA_BENCH:-llama-bench}
DEADLINE=${DEADLINE:-560}
START=$(date +%s)
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >> "$summary"
note() { echo "$*" | tee -a "$summary"; }
left() { local l=$(( DEADLINE - ($(date +%s) - START) )); [ "$l" -lt "$1" ] || l=$1; [ "$l" -gt 1 ] || l=1; echo "$l"; }
has_step() { [[ " $STEPS " == *" $1 "* ]]; }
export BUNDLE

note "== served_checks $(date -u +%FT%TZ) steps: $STEPS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /' | tee -a "$summary"
note "cpus: $(nproc); disk free: $(df -h --output=avail /tmp | tail -1 | tr -d ' ')"

if has_step engine; then
  t0=$SECONDS
  timeout "$(left "$ENGINE_SECONDS")" "$BUNDLE/run" cuda_engine_test --gtest_filter="$ENGINE_FILTER" > "$OUT/engine.log" 2>&1
  note "cuda_engine_test ($ENGINE_FILTER): rc=$? in $((SECONDS - t0)) s," \
       "$(grep -c '^\[       OK' "$OUT/engine.log") ok, $(grep -c '^\[  FAILED' "$OUT/engine.log") failed"
  grep -E '^\[  FAILED|^\[random|^\[tiny|^\[small' "$OUT/engine.log" | head -60 >> "$summary"
  grep -E 'Failure|Expected|Which is|CHECK' "$OUT/engine.log" | head -10 | tee -a "$summary"
fi

if has_step kernels; then
  t0=$SECONDS
  timeout "$(left "$KERNELS_SECONDS")" "$BUNDLE/run" cuda_kernels_test --gtest_filter="$KERNELS_FILTER" > "$OUT/kernels.log" 2>&1
  note "cuda_kernels_test: rc=$? in $((SECONDS - t0)) s, $(grep -c '^\[       OK' "$OUT/kernels.log") ok," \
       "$(grep -c '^\[  FAILED' "$OUT/kernels.log") failed"
  grep -E '^\[  FAILED|Failure|Expected|Which is' "$OUT/kernels.log" | head -20 | tee -a "$summary"
fi

if has_step ipc; then
  # The arena over CUDA IPC with a real mer-residency: preloaded (100%), device-decided misses
  # (50%), host-served misses (10%), against the CPU reference.
  t0=$SECONDS
  for c in tiny_q8_0 small_q8_0; do
    MER_CUDA_DEBUG=1 MER_RESIDENCY_BIN="$BUNDLE/bin/mer-residency" timeout "$(left 150)" "$BUNDLE/run" cuda_ipc_test \
      --gtest_filter="Ipc/CudaIpcArena.*/$c" >> "$OUT/ipc.log" 2>&1
    note "cuda_ipc_test $c: rc=$?"
  done
  grep -E '^\[(  FAILED|       OK) |IPC arena|mer-residency exit|Failure|Expected|Which is' "$OUT/ipc.log" | head -40 | tee -a "$summary"
  note "ipc: $((SECONDS - t0)) s"
fi

if has_step faults; then
  # FAULT_COMPUTE_FLAGS: runs separated by ';', each a set of mer-compute flags.
  IFS=';' read -r -a fault_runs <<< "$FAULT_COMPUTE_FLAGS"
  for k in "${!fault_runs[@]}"; do
    t0=$SECONDS
    COMPUTE_FLAGS="${fault_runs[$k]}" KEEP_LOGS_DIR="$OUT/faults_$k" timeout "$(left 300)" "$BUNDLE/run" bash \
      "$here/../integration/system_integration_test.sh" "$BUNDLE/bin/mer" "$BUNDLE/bin/mer-residency" \
      "$BUNDLE/bin/mer-compute" "$BUNDLE/bin/mer-gateway" > "$OUT/faults_$k.log" 2>&1
    note "system_integration_test with mer-compute ${fault_runs[$k]}: rc=$? in $((SECONDS - t0)) s"
    grep -E 'FAIL|SIGKILL|residency killed|all passed' "$OUT/faults_$k.log" | head -20 | tee -a "$summary"
    grep -hiE 'check failed|abort|terminate|fatal|error|cuda: |segfault' "$OUT/faults_$k"/c*.log 2>/dev/null | head -20 | tee -a "$summary"
  done
fi

if has_step geometries; then
  t0=$SECONDS
  mkdir -p "$OUT/geom"
  # mer up finds the daemons beside `mer` (the bundle's bin/).
  timeout "$(left 300)" "$BUNDLE/run" bash "$here/../integration/served_geometries_test.sh" "$BUNDLE/bin/mer" \
    "$GEOM_SEEDS" cuda > "$OUT/geometries.log" 2>&1
  note "served geometries (cuda): rc=$? in $((SECONDS - t0)) s"
  grep -E '^FAIL|refused|served geometries' "$OUT/geometries.log" | head -30 | tee -a "$summary"
fi

if has_step bench || has_step batch || has_step served || has_step profile; then
  if [ ! -s "$STORE/manifest" ]; then
    t0=$SECONDS
    timeout "$(left 300)" "$BUNDLE/run" mer synth --preset qwen3-30b-a3b --quant q8_0 --router-skew "$SKEW" \
      --row-pool "$STORE_ROW_POOL" --threads "$(nproc)" --store-out "$STORE" > "$OUT/synth.log" 2>&1
    note "synth qwen3-30b-a3b q8_0 --store-out: rc=$? in $((SECONDS - t0)) s, $(du -sh "$STORE" | cut -f1)"
  fi
fi

# One process: mer bench over the store beside a mer-residency (RAM tier 100%) named $tag.
start_bench_residency() {
  tag="mer-bench-$$"
  "$BUNDLE/run" mer-residency --store "$STORE" --instance "$tag" --ram-budget 100% --policy lfu \
    --metrics-listen off > "$OUT/bench_residency.log" 2>&1 &
  rpid=$!
  for _ in $(seq 1 600); do grep -q ': ready' "$OUT/bench_residency.log" && break; sleep 0.2; done
}
stop_bench_residency() {
  kill -TERM $rpid; wait $rpid 2>/dev/null
  rm -f "/dev/shm/$tag"*
}

if has_step profile; then
  start_bench_residency
  for bin in $PROFILE_BINS; do
   for env in $PROFILE_ENVS; do
    for p in $PROFILE_PROMPTS; do
      timeout "$(left 150)" env ${env//,/ } "$BUNDLE/run" "$bin" bench --store "$STORE" --residency "$tag" --backend cuda \
        --vram-expert-budget 100% --prompt-tokens "$p" --gen-tokens 8 --warmup 1 --runs 1 --profile-kernels 1 \
        > "$OUT/profile_${bin}_${env}_$p.log" 2>&1
      note "$env $bin bench --profile-kernels 1, prompt $p tokens: rc=$?"
      grep -E '^(prompt_tps|decode_tps)|steps:|gate_up|down|qkv|out_proj|attention |lm_head' "$OUT/profile_${bin}_${env}_$p.log" | tee -a "$summary"
    done
   done
  done
  stop_bench_residency
fi

if has_step bench; then
  for b in $BUDGETS; do
    if [ "$ONE_PROCESS" = 1 ]; then
      start_bench_residency
      timeout "$(left 200)" "$BUNDLE/run" mer bench --store "$STORE" --residency "$tag" --backend cuda \
        --vram-expert-budget "$b" --prompt-tokens 31 --gen-tokens 128 --warmup 1 --runs 3 > "$OUT/bench_$b.log" 2>&1
      note "mer bench (one process, store, VRAM $b): rc=$? $(grep -E '^(decode_tps|prompt_tps|host_syncs_per_token|vram_hit_rate)' "$OUT/bench_$b.log" | awk '{printf "%s %s  ", $1, $2}')"
      stop_bench_residency
    fi
    # The three daemons, one stream, each miss path.
    for mp in $MISS_PATHS; do
      OUT="$OUT/served_${b}_$mp" STORE="$STORE" STREAMS=1 REQUESTS=3 VRAM_BUDGET="$b" RAM_BUDGET=100% \
        EXTRA_COMPUTE_FLAGS="--miss-path $mp" DEADLINE=$(left 200) timeout "$(left 210)" \
        bash "$here/batch_bench.sh" > /dev/null 2>&1
      note "served, 1 stream, VRAM $b, miss path $mp: $(grep -E '^(warm-up|throughput|itl)' "$OUT/served_${b}_$mp/summary.txt" | tr '\n' ' ')"
      grep -E 'host syncs|VRAM hit|FAILED|^residency' "$OUT/served_${b}_$mp/summary.txt" | tee -a "$summary"
    done
  done
fi

if has_step served; then
  for run in $SERVED_RUNS; do
    # Optional sixth to eighth fields: VRAM prefetch copies in flight (mer-residency
    # --vram-prefetch-inflight), and the bundle's programs to run as mer-residency and mer-compute.
    IFS=: read -r v r mp ap rp vp rb cb <<< "$run"
    vp=${vp:-3} rb=${rb:-mer-residency} cb=${cb:-mer-compute}
    d="$OUT/served_${v}_${r}_${mp}_${ap}_${rp}_${vp}_${rb}_$cb"
    COMPUTE_BIN="$cb" RESIDENCY_BIN="$rb" OUT="$d" STORE="$STORE" STREAMS=1 REQUESTS="$SERVED_REQUESTS" VRAM_BUDGET="$v" RAM_BUDGET="$r" POLICY="$rp" \
      EXTRA_COMPUTE_FLAGS="--miss-path $mp --arena-policy $ap" EXTRA_RESIDENCY_FLAGS="--vram-prefetch-inflight $vp" \
      DEADLINE=$(left 200) timeout "$(left 210)" bash "$here/batch_bench.sh" > /dev/null 2>&1
    note "served, 1 stream, VRAM $v, RAM $r ($rp), miss path $mp (arena $ap), VRAM prefetch copies $vp, $rb, $cb:" \
         "$(grep -E '^(throughput|itl)' "$d/summary.txt" | tr '\n' ' ')"
    grep -E 'host syncs|VRAM hit|FAILED|^residency' "$d/summary.txt" | tee -a "$summary"
  done
fi

if has_step cpu; then
  t0=$SECONDS
  timeout "$(left 90)" "$BUNDLE/run" expert_cpu_bench --threads 1,2,4,8,16 > "$OUT/expert_cpu_bench.log" 2>&1
  note "expert_cpu_bench: rc=$?"; tee -a "$summary" < "$OUT/expert_cpu_bench.log" | tail -0
  timeout "$(left 90)" "$BUNDLE/run" miss_path_bench > "$OUT/miss_path_bench.log" 2>&1
  note "miss_path_bench: rc=$?"; tee -a "$summary" < "$OUT/miss_path_bench.log" | tail -0
  note "cpu: $((SECONDS - t0)) s"
fi

if has_step batch; then
  for env in $BATCH_ENVS; do
    d="$OUT/batch64_$env"
    env ${env//,/ } OUT="$d" STORE="$STORE" STREAMS=64 VRAM_BUDGET=100% RAM_BUDGET=100% \
      DEADLINE=$(left 300) timeout "$(left 310)" bash "$here/batch_bench.sh" > /dev/null 2>&1
    note "64 streams ($env): $(grep -E '^(throughput|ttft)' "$d/summary.txt" | tr '\n' ' ')"
    grep -E 'host syncs|tokens per step|FAILED' "$d/summary.txt" | tee -a "$summary"
  done
fi
if has_step peer; then
  if [ "$PEER_REMOVE_STORE" = 1 ] && [ -d "$STORE" ]; then  # a store and a GGUF of 30B do not fit the disk together
    rm -rf "$STORE"
    note "peer: removed $STORE; disk free $(df -h --output=avail /tmp | tail -1 | tr -d ' ')"
  fi
  for spec in $PEER_MODELS; do
    IFS=: read -r label preset quant layers depth <<< "$spec"
    model="/tmp/peer-$label.gguf"
    t0=$SECONDS
    timeout "$(left 300)" "$BUNDLE/run" mer synth --preset "$preset" --quant "$quant" ${layers:+--layers "$layers"} \
      --router-skew "$SKEW" --row-pool 61 --threads "$(nproc)" --out "$model" > "$OUT/peer_${label}_synth.log" 2>&1
    note "peer $label: synth $preset $quant${layers:+ $layers layers}: rc=$? in $((SECONDS - t0)) s," \
         "$(du -BM "$model" | cut -f1); disk free $(df -h --output=avail /tmp | tail -1 | tr -d ' ')"
    "$BUNDLE/run" mer info "$model" > "$OUT/peer_${label}_info.log" 2>&1
    n_layer=$(awk '$1 == "layers" {print $2}' "$OUT/peer_${label}_info.log")
    for kspec in $PEER_KERNELS; do
      k=${kspec%%,*} kenv=""
      [[ $kspec == *,* ]] && kenv=${kspec#*,}
      for p in $PEER_PROMPTS; do
        log="$OUT/peer_${label}_mer_${kspec}_p$p.log"
        env ${kenv//,/ } timeout "$(left 150)" "$BUNDLE/run" mer bench --model "$model" --backend cuda \
          --vram-expert-budget 100% --multi-token-kernels "$k" --prompt-tokens "$p" --gen-tokens "$PEER_GEN" \
          --warmup 1 --runs "$PEER_RUNS" > "$log" 2>&1
        note "peer $label: mer bench --multi-token-kernels $k${kenv:+ ($kenv)}, VRAM 100%, prompt $p + $PEER_GEN: rc=$?" \
             "$(grep -E '^(prompt_tps|decode_tps|ttft)' "$log" | awk '{printf "%s %s  ", $1, $2}')"
      done
      for p in $PEER_PROFILE_PROMPTS; do
        log="$OUT/peer_${label}_profile_${kspec}_p$p.log"
        env ${kenv//,/ } timeout "$(left 150)" "$BUNDLE/run" mer bench --model "$model" --backend cuda \
          --vram-expert-budget 100% --multi-token-kernels "$k" --prompt-tokens "$p" --gen-tokens 8 --warmup 1 \
          --runs 1 --profile-kernels 1 > "$log" 2>&1
        note "peer $label: mer bench --profile-kernels 1 --multi-token-kernels $k${kenv:+ ($kenv)}, prompt $p: rc=$?"
        sed -n '/^multi-token steps/,/^decode steps/p' "$log" | grep -v '^decode' | tee -a "$summary"
      done
    done
    for b in $PEER_BUDGETS; do
      [ "$b" = "100%" ] && continue
      timeout "$(left 150)" "$BUNDLE/run" mer bench --model "$model" --backend cuda --vram-expert-budget "$b" \
        --prompt-tokens 31 --gen-tokens "$PEER_GEN" --warmup 1 --runs 2 > "$OUT/peer_${label}_mer_$b.log" 2>&1
      note "peer $label: mer bench, VRAM $b, prompt 31 + $PEER_GEN: rc=$? $(grep -E '^(prompt_tps|decode_tps|vram_hit_rate|uploaded)' \
        "$OUT/peer_${label}_mer_$b.log" | awk '{printf "%s %s  ", $1, $2}')"
    done
    if [ -n "$depth" ]; then
      log="$OUT/peer_${label}_mer_depth$depth.log"
      timeout "$(left 150)" "$BUNDLE/run" mer bench --model "$model" --backend cuda --vram-expert-budget 100% \
        --prompt-tokens "$depth" --gen-tokens "$PEER_GEN" --warmup 0 --runs 1 > "$log" 2>&1
      note "peer $label: mer bench, VRAM 100%, prompt $depth + $PEER_GEN: rc=$?" \
           "$(grep -E '^(prompt_tps|decode_tps|ttft)' "$log" | awk '{printf "%s %s  ", $1, $2}')"
    fi
    prompts=$(echo "$PEER_PROMPTS" | tr ' ' ',')
    timeout "$(left 200)" "$BUNDLE/run" "$LLAMA_BENCH" -m "$model" -ngl 99 -fa 1 -p "$prompts" -n "$PEER_GEN" -r "$PEER_RUNS" \
      > "$OUT/peer_${label}_llama.log" 2>&1
    note "peer $label: llama-bench, every layer on the GPU: rc=$?"
    grep -E '^\|' "$OUT/peer_${label}_llama.log" | tee -a "$summary"
    if [ -n "$depth" ]; then
      timeout "$(left 150)" "$BUNDLE/run" "$LLAMA_BENCH" -m "$model" -ngl 99 -fa 1 -p 0 -n "$PEER_GEN" -d "$depth" -r 1 \
        > "$OUT/peer_${label}_llama_depth$depth.log" 2>&1
      note "peer $label: llama-bench, decode after $depth tokens: rc=$?"
      grep -E '^\|' "$OUT/peer_${label}_llama_depth$depth.log" | tee -a "$summary"
    fi
    for b in $PEER_BUDGETS; do
      [ "$b" = "100%" ] && continue
      cpu_layers=$(( n_layer - n_layer * ${b%\%} / 100 ))
      timeout "$(left 200)" "$BUNDLE/run" "$LLAMA_BENCH" -m "$model" -ngl 99 -fa 1 -ncmoe "$cpu_layers" -p 31 \
        -n "$PEER_GEN" -r 2 > "$OUT/peer_${label}_llama_$b.log" 2>&1
      note "peer $label: llama-bench, experts of $cpu_layers of $n_layer layers on the CPU (VRAM $b): rc=$?"
      grep -E '^\|' "$OUT/peer_${label}_llama_$b.log" | tee -a "$summary"
    done
    rm -f "$model"
  done
fi

note "== served_checks done in $(( $(date +%s) - START )) s"
