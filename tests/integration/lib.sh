# Helpers shared by the integration test scripts (sourced). A script sets FAILURES=0 first (or
# calls setup_work) and exits non-zero when it is not 0 at the end (finish).

# fail MESSAGE: records a failure and goes on.
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }

# setup_work NAME: a scratch directory WORK, a prefix TAG for the test's /dev/shm segments, the
# list PIDS of processes to kill at exit, FAILURES=0, and an EXIT trap that cleans all of it up
# (SIGCONT before SIGKILL: a stopped process must go too).
setup_work() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/mer_$1.XXXXXX")
  TAG="mer-$1-$$"
  PIDS=()
  FAILURES=0
  trap cleanup_work EXIT
}
cleanup_work() {
  for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -f /dev/shm/"${TAG}"* 2>/dev/null
  rm -rf "$WORK"
}

# cleanup_up: the EXIT trap of a script that runs `mer up` (its pid in UPID, empty before it
# starts): kills it and every process started from WORK, then removes WORK.
cleanup_up() {
  [ -n "$UPID" ] && kill -KILL "$UPID" 2>/dev/null
  pkill -KILL -f "$WORK/" 2>/dev/null
  rm -rf "$WORK"
}

# wait_up LOG: until the `mer up` of pid UPID prints its gRPC address into LOG.out (60 s), or
# exits; sets ADDR. False if it never did.
wait_up() {
  ADDR=
  for _ in $(seq 1 600); do
    ADDR=$(grep -o 'gRPC API *[0-9.]*:[0-9]*' "$1.out" 2>/dev/null | awk '{print $3}')
    [ -n "$ADDR" ] && return 0
    kill -0 "$UPID" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}

# Eight different prompts, their greedy ids from one engine, and the eight as concurrent streams
# through a gateway: what the expert-rank tests compare (ranks must give one engine's ids).
eight_prompt() { echo "$((1 + $1)),17,$((40 + 3 * $1)),99,7,3,250,$((11 + $1))"; }
# eight_reference_ids MODEL: WANT[0..7], `mer generate --model MODEL`'s 24 greedy ids of each.
eight_reference_ids() {
  WANT=()
  for s in $(seq 0 7); do
    WANT[$s]=$(timeout 60 "$MER" generate --model "$1" --prompt-tokens "$(eight_prompt "$s")" --max-tokens 24                  --ignore-eos --print-token-ids --threads 1 2>/dev/null | tail -1)
    [ -n "${WANT[$s]}" ] || fail "reference ids of prompt $s"
  done
}
# eight_streams TAG: the eight at once through the gateway at ADDR (outputs WORK/outTAG.N); a
# failure for each client that fails and each whose ids are not WANT's; SAME = how many matched.
eight_streams() {
  local pids=() s got
  for s in $(seq 0 7); do
    timeout 60 "$MER" client --addr "$ADDR" --prompt-tokens "$(eight_prompt "$s")" --max-tokens 24 --ignore-eos       --print-token-ids >"$WORK/out$1.$s" 2>&1 &
    pids+=($!)
  done
  for s in $(seq 0 7); do wait "${pids[$s]}" || fail "$1, prompt $s: mer client failed: $(tail -1 "$WORK/out$1.$s")"; done
  SAME=0
  for s in $(seq 0 7); do
    got=$(tail -1 "$WORK/out$1.$s")
    if [ "$got" == "${WANT[$s]}" ]; then SAME=$((SAME + 1)); else fail "$1, prompt $s: '$got' vs '${WANT[$s]}'"; fi
  done
}

# finish: the script's exit, by FAILURES.
finish() {
  if [ "$FAILURES" -ne 0 ]; then echo "$FAILURES failure(s)"; exit 1; fi
  echo "all passed"
  exit 0
}

# wait_log LOG PATTERN PID: until LOG has PATTERN (10 s), or the process died.
wait_log() {
  for _ in $(seq 1 200); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || break
    sleep 0.05
  done
  echo "no '$2' in $1:"; cat "$1"; return 1
}

# The gateway at ADDR through `mer client` (MER is the mer binary).
# client ARGS...: one call, bounded to 60 s.
client() { timeout 60 "$MER" client --addr "$ADDR" "$@"; }
# health: the status the gateway's health check reports (empty if it does not answer in 10 s).
health() { timeout 10 "$MER" client --addr "$ADDR" --health 2>/dev/null; }
# wait_health STATUS: until health says STATUS (10 s); a failure otherwise.
wait_health() {
  for _ in $(seq 1 200); do [ "$(health)" == "$1" ] && return 0; sleep 0.05; done
  fail "health never became $1 (is $(health))"; return 1
}

# metrics_url LOG: the /metrics URL a daemon printed ("metrics: http://H:P/metrics").
metrics_url() { grep -o 'metrics: http://[^ ]*' "$1" | head -1 | cut -d' ' -f2; }

# fetch URL OUT: GET an http:// URL into OUT (curl, else bash's /dev/tcp); true if OUT is not empty.
fetch() {
  if command -v curl >/dev/null 2>&1; then
    timeout 10 curl -sSf "$1" -o "$2"
  else
    local hp=${1#http://} path
    path=/${hp#*/}
    hp=${hp%%/*}
    ( exec 3<>"/dev/tcp/${hp%:*}/${hp##*:}" || exit 1
      printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$hp" >&3
      timeout 10 cat <&3 ) | tr -d '\r' | sed '1,/^$/d' >"$2"
  fi
  [ -s "$2" ]
}

# metric 'NAME{LABELS}' FILE: the sample's value as an integer (empty if absent).
metric() { awk -v n="$1" '$1 == n { printf "%d", $2; exit }' "$2"; }

# lint_metrics NAME FILE: `promtool check metrics` on FILE (skipped, with a note, without promtool).
lint_metrics() {
  if ! command -v promtool >/dev/null 2>&1; then
    echo "  note: promtool not installed: skipping 'promtool check metrics'"; return 0
  fi
  local out
  out=$(timeout 30 promtool check metrics <"$2" 2>&1) || { fail "$1: promtool check metrics: $out"; return; }
  echo "  promtool check metrics: ok"
}
