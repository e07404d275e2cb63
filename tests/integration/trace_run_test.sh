#!/usr/bin/env bash
# usage: trace_run_test.sh MER MER_RESIDENCY
# `mer trace run` (a routing trace's routes given to a backend, docs/routing_trace.md):
#  1. a greedy trace run on the CPU backend gives, record by record, the ids `mer generate` gives,
#     and the same digests with another batch size and thread count (equal logits, bit for bit);
#  2. run with its experts served by mer-residency from an expert store (RAM tier 10%): the same
#     digests as from the GGUF;
#  3. a prompt of another length, a batch smaller than a prompt chunk and a trace of another
#     model's geometry are refused.
set -u
MER=$1
RES=$2
source "$(dirname "$0")/lib.sh"
setup_work trace_run

P=1,17,42,99,7,3,250,8,5,60
timeout 300 "$MER" synth --preset tiny --quant q8_0 --threads 2 --seed 3 --out "$WORK/m.gguf" >/dev/null &&
  timeout 300 "$MER" synth --preset micro --quant q8_0 --threads 2 --seed 3 --out "$WORK/other.gguf" >/dev/null &&
  timeout 300 "$MER" pack --model "$WORK/m.gguf" --out "$WORK/m.store" --threads 2 >/dev/null || { fail "synth/pack"; exit 1; }
WANT=$(timeout 120 "$MER" generate --model "$WORK/m.gguf" --prompt-tokens $P --max-tokens 24 --ignore-eos \
         --print-token-ids --threads 2 2>/dev/null)
timeout 120 "$MER" trace record --model "$WORK/m.gguf" --prompt-tokens $P --max-tokens 24 --ignore-eos --batch 4 \
  --threads 2 --out "$WORK/m.trace" >/dev/null 2>&1 || { fail "trace record"; exit 1; }
run() {  # OUT FLAGS...: mer trace run of m.trace with the prompt
  local out=$1; shift
  timeout 120 "$MER" trace run --trace "$WORK/m.trace" --prompt-tokens $P "$@" >"$out" 2>"$out.err"
}

# --- 1. the recorded ids again, whatever the batch and threads ------------------------------------
run "$WORK/a.txt" --model "$WORK/m.gguf" --batch 4 --threads 2 || fail "run: $(tail -1 "$WORK/a.txt.err")"
# Prompt chunks of 4, 4 and 2, then 23 decode steps (the 24th id is never fed back): the greedy ids
# of the last prompt chunk and of every decode step are the generated ones.
records=$(grep -c '^record ' "$WORK/a.txt")
[ "$records" -eq 26 ] || fail "$records records run, not 26"
GOT=$(grep '^record ' "$WORK/a.txt" | tail -n 24 | awk '{print $7}' | paste -sd' ')
[ -n "$WANT" ] && [ "$GOT" == "$WANT" ] || fail "greedy ids of the run: '$GOT', generated: '$WANT'"
run "$WORK/b.txt" --model "$WORK/m.gguf" --threads 1 || fail "run, batch 256: $(tail -1 "$WORK/b.txt.err")"
cmp -s "$WORK/a.txt" "$WORK/b.txt" || fail "another batch and thread count changed the digests: $(diff "$WORK/a.txt" "$WORK/b.txt" | head -4)"
grep -q '^all 26 records: logits fnv1a64 [0-9a-f]\{16\}$' "$WORK/a.txt" || fail "no digest of the run: $(tail -1 "$WORK/a.txt")"
echo "greedy trace run again: $(tail -1 "$WORK/a.txt")"

# --- 2. the experts from mer-residency --------------------------------------------------------------
( exec "$RES" --store "$WORK/m.store" --instance "$TAG" --ram-budget 10% >"$WORK/r.log" 2>&1 ) &
RPID=$!; PIDS+=("$RPID")
if wait_log "$WORK/r.log" "ready" "$RPID"; then
  run "$WORK/c.txt" --store "$WORK/m.store" --residency "$TAG" --batch 4 --threads 2 ||
    fail "run through mer-residency: $(tail -1 "$WORK/c.txt.err")"
  cmp -s "$WORK/a.txt" "$WORK/c.txt" || fail "the store's digests differ: $(diff "$WORK/a.txt" "$WORK/c.txt" | head -4)"
  kill -TERM "$RPID"; wait "$RPID"
else
  fail "mer-residency"
fi

# --- 3. refusals ----------------------------------------------------------------------------------
refused() {  # WHAT PATTERN FLAGS...: the run fails, its message matching PATTERN
  local what=$1 pattern=$2; shift 2
  if timeout 120 "$MER" trace run --trace "$WORK/m.trace" "$@" >/dev/null 2>"$WORK/refused.err"; then
    fail "$what: ran"
  elif ! grep -q "$pattern" "$WORK/refused.err"; then
    fail "$what: $(tail -1 "$WORK/refused.err")"
  fi
}
refused "another prompt length" "the prompt has 3 tokens" --model "$WORK/m.gguf" --prompt-tokens 1,2,3
refused "a batch of 3" "more than the engine's batch of 3" --model "$WORK/m.gguf" --prompt-tokens $P --batch 3
refused "another model" "is not the model's" --model "$WORK/other.gguf" --prompt-tokens $P

finish
