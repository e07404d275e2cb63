#!/usr/bin/env bash
# usage: served_geometries_test.sh MER [SEEDS] [BACKEND]
# Every path a user runs, on geometries nobody tuned for: for each seed a `mer synth --preset
# random:SEED` model (the type cycling through f32, f16, q8_0 and q4_k), then
#   1. the reference: `mer generate --backend cpu` greedy ids;
#   2. the engine alone: `mer generate --backend BACKEND` (cuda: with every expert in VRAM and
#      with 30% of them), and `mer bench --backend BACKEND` (it must not fail);
#   3. the three daemons: `mer up --backend BACKEND` and `mer client`, then the same through two
#      expert-parallel ranks, each with a mer-residency of its own (cpu: `--expert-ranks 2`; cuda:
#      a 40% VRAM arena placed by mer-residency over CUDA IPC, and the ranks only with RANK_GPUS,
#      e.g. 0,0: `mer up --gpus RANK_GPUS`, each rank's arena its whole share).
# Every id list must equal the reference. A geometry the backend cannot run must be refused at
# start-up with a message (no abort, no signal): such a case is counted as refused, and fails the
# test only if the message is missing. SEEDS defaults to "1 2 3 4 5"; BACKEND to cpu (CI); the GPU
# machine runs it with cuda and 20 seeds (tests/gpu/served_checks.sh, STEPS=geometries). MER_BIN_DIR: where
# mer-residency, mer-compute and mer-gateway are (mer up finds them beside `mer` otherwise).
set -u
MER=$1
SEEDS=${2:-"1 2 3 4 5"}
BACKEND=${3:-cpu}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mer_geom.XXXXXX")
FAILURES=0
UPID=
cleanup() {
  [ -n "$UPID" ] && kill -TERM "$UPID" 2>/dev/null && timeout 20 tail --pid="$UPID" -f /dev/null 2>/dev/null
  [ -n "$UPID" ] && kill -KILL "$UPID" 2>/dev/null
  pkill -KILL -f "$WORK/" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
source "$(dirname "$0")/lib.sh"

PROMPT=1,17,42,99,7,3,250,11
N=16
quants=(f32 f16 q8_0 q4_k)
passed=0 refused=0 i=0
# ids CMD...: the greedy ids the command prints (its last line), or its exit status as "rc=N".
ids() {
  local out rc
  out=$("$@" 2>"$WORK/last.err"); rc=$?
  [ $rc -eq 0 ] && echo "$out" | tail -1 || echo "rc=$rc"
}
# refused_cleanly FILE: the backend refused the geometry with a message, not a crash.
refused_cleanly() { grep -qiE 'unimplemented|not supported|must be|at most' "$1" && ! grep -qiE 'CHECK failed|Aborted|core dumped|signal' "$1"; }

# serve LABEL FLAGS...: `mer up FLAGS` and `mer client`'s ids against the reference ($want);
# clears ok on a failure.
serve() {
  local label=$1 got; shift
  "$MER" up --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --ram-budget 50% --threads 2 "$@" \
    >"$WORK/up.out" 2>"$WORK/up.err" &
  UPID=$!
  if ! wait_up "$WORK/up"; then
    fail "$label: mer up $* did not come up: $(tail -5 "$WORK/up.err")"
    ok=0
  else
    got=
    for _ in $(seq 1 50); do
      got=$(ids timeout 60 "$MER" client --addr "$ADDR" --prompt-tokens $PROMPT --max-tokens $N --ignore-eos \
              --print-token-ids)
      [[ "$got" == rc=* ]] || break
      sleep 0.2
    done
    # (mer up's last lines too: a daemon it restarted or gave up on explains a refused connection)
    [ "$got" == "$want" ] || { fail "$label: served ($*): '$got' vs '$want' $(tail -2 "$WORK/last.err"); mer up: $(tail -5 "$WORK/up.err")"; ok=0; }
    # cuda ranks: the host's page has each rank's device memory, labelled by its GPU.
    if [[ " $* " == *" --gpus "* ]]; then
      fetch "$(grep -o 'metrics *http://[^ ]*' "$WORK/up.out" | head -1 | awk '{print $2}')" "$WORK/metrics.txt"
      grep '^mer_vram_bytes{' "$WORK/metrics.txt" | grep 'rank="1"' | grep 'use="arena"' | grep -q 'gpu="' ||
        { fail "$label: no mer_vram_bytes of rank 1 with a gpu label on the gateway's page"; ok=0; }
    fi
  fi
  kill -TERM "$UPID" 2>/dev/null
  timeout 30 tail --pid="$UPID" -f /dev/null 2>/dev/null || kill -KILL "$UPID" 2>/dev/null
  UPID=
  grep -qE 'CHECK failed|Aborted|core dumped' "$WORK/up.err" && { fail "$label: a daemon aborted: $(grep -m1 -E 'CHECK failed|Aborted' "$WORK/up.err")"; ok=0; }
}

for seed in $SEEDS; do
  q=${quants[$((i % 4))]}
  i=$((i + 1))
  m="$WORK/g$seed.gguf"
  timeout 120 "$MER" synth --preset "random:$seed" --quant "$q" --seed "$seed" --threads 4 --out "$m" >/dev/null 2>&1 ||
    { fail "random:$seed $q: synth"; continue; }
  geom=$("$MER" info "$m" 2>/dev/null | awk '/^(layers|d_model|heads|experts|vocab|context) / {$1=""; printf "%s;", $0}' | tr -s ' ')
  want=$(ids timeout 120 "$MER" generate --model "$m" --prompt-tokens $PROMPT --max-tokens $N --ignore-eos \
           --print-token-ids --threads 2)
  case "$want" in rc=*) fail "random:$seed $q: cpu reference $want: $(tail -2 "$WORK/last.err")"; continue ;; esac
  ok=1
  engine_runs=("")
  [ "$BACKEND" = cuda ] && engine_runs=("" "--vram-expert-budget 30%")
  for extra in "${engine_runs[@]}"; do
    # shellcheck disable=SC2086
    got=$(ids timeout 120 "$MER" generate --model "$m" --backend "$BACKEND" $extra --prompt-tokens $PROMPT \
            --max-tokens $N --ignore-eos --print-token-ids --threads 2)
    if [[ "$got" == rc=* ]] && refused_cleanly "$WORK/last.err"; then
      refused=$((refused + 1)); ok=2
      echo "random:$seed $q ($geom): refused: $(grep -iE 'unimplemented|not supported' "$WORK/last.err" | tail -1)"
      break
    fi
    [ "$got" == "$want" ] || { fail "random:$seed $q ($geom): engine $BACKEND $extra: '$got' vs '$want' $(tail -2 "$WORK/last.err")"; ok=0; }
  done
  [ $ok -eq 2 ] && continue
  timeout 120 "$MER" bench --model "$m" --backend "$BACKEND" --prompt-tokens 8 --gen-tokens 8 --warmup 0 --runs 1 \
    --threads 2 >"$WORK/bench.out" 2>"$WORK/bench.err" ||
    { fail "random:$seed $q: mer bench --backend $BACKEND rc=$?: $(tail -2 "$WORK/bench.err")"; ok=0; }

  up_runs=("")
  [ "$BACKEND" = cuda ] && up_runs=("--vram-expert-budget 40%")
  [ "$BACKEND" = cuda ] && [ -n "${RANK_GPUS:-}" ] && up_runs+=("--gpus $RANK_GPUS")
  [ "$BACKEND" = cpu ] && up_runs+=("--expert-ranks 2")
  for extra in "${up_runs[@]}"; do
    # shellcheck disable=SC2086
    serve "random:$seed $q ($geom)" --model "$m" --backend "$BACKEND" $extra
  done
  [ $ok -eq 1 ] && passed=$((passed + 1)) && echo "random:$seed $q ($geom): ids equal (engine, bench, served)"
done
echo "served geometries ($BACKEND): $passed passed, $refused refused at start-up, $FAILURES failures"
exit $((FAILURES > 0))
