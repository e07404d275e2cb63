#!/usr/bin/env bash
# usage: http_api_test.sh MER
# The OpenAI-compatible HTTP API through `mer up` on synthetic tiny models carrying Qwen3's chat
# template:
#  1. the official openai npm client (tests/integration/openai, pinned by its package-lock.json):
#     chat and completions, streamed and not, n, seeds, logprobs, enable_thinking, errors;
#  2. the curl examples of README.md, run as written (only the port differs);
#  3. invalid requests get OpenAI-shaped errors with the right status: bad JSON, wrong types and
#     out-of-range values 400, unknown model and route 404, a body over 8 MiB 413; the gateway
#     still serves afterwards;
#  4. generation stops at <|endoftext|> and at <|im_end|> (forced with logit_bias), on a model
#     whose EOS is <|endoftext|> and on one whose EOS is <|im_end|>: finish_reason "stop",
#     stop_reason the token's id, one completion token;
#  5. /health, /v1/models, /tokenize and /detokenize; the metrics a vLLM dashboard reads, with
#     model_name and finish_reason labels, pass `promtool check metrics`.
# The npm part reports SKIP (exit 77 at the end) without node or tests/integration/openai/node_modules
# (scripts/install-openai-client installs it); everything else runs regardless.
set -u
MER=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mer_http.XXXXXX")
FAILURES=0
SKIPPED=0
UPID=
source "$HERE/lib.sh"
trap cleanup_up EXIT

# up MODEL LOG: mer up on MODEL in the background; sets UPID, URL (HTTP) and METRICS.
up() {
  "$MER" up --model "$1" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --served-model-name qwen3 --ram-budget 50% --threads 2 --max-sequences 8 --ctx 1024 >"$2.out" 2>"$2.err" &
  UPID=$!
  URL=
  for _ in $(seq 1 900); do
    URL=$(grep -o 'HTTP API *http://[0-9.]*:[0-9]*' "$2.out" 2>/dev/null | awk '{print $3}')
    METRICS=$(grep -o 'metrics *http://[^ ]*' "$2.out" 2>/dev/null | head -1 | awk '{print $2}')
    [ -n "$URL" ] && return 0
    kill -0 "$UPID" 2>/dev/null || break
    sleep 0.1
  done
  echo "mer up did not come up:"; cat "$2.out" "$2.err"; return 1
}
down() {
  kill -TERM "$UPID"
  for _ in $(seq 1 200); do kill -0 "$UPID" 2>/dev/null || break; sleep 0.1; done
  wait "$UPID" 2>/dev/null
  UPID=
}
# post PATH BODY_FILE OUT: POST JSON; prints the HTTP status.
post() { curl -s -o "$3" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "@$2" "$URL$1"; }
# json FILE EXPR: a Python expression over the parsed body `j` (empty on a parse error).
json() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null; }
# expect_error STATUS TYPE NAME BODY: POST /v1/chat/completions, expect an OpenAI error.
expect_error() {
  printf '%s' "$4" >"$WORK/body.json"
  local got
  got=$(post /v1/chat/completions "$WORK/body.json" "$WORK/err.json")
  local shape
  shape=$(json "$WORK/err.json" "j['error']['type'] + '|' + str(type(j['error']['message']) is str)")
  if [ "$got" != "$1" ] || [ "$shape" != "$2|True" ]; then
    fail "$3: HTTP $got $(head -c 300 "$WORK/err.json") (want $1 $2)"
  else
    echo "  $3: $got $(json "$WORK/err.json" "j['error']['message']")"
  fi
}

timeout 300 "$MER" synth --preset tiny --quant q8_0 --threads 2 --chat-template qwen3 --out "$WORK/endoftext.gguf" \
  >/dev/null || { fail synth; exit 1; }
timeout 300 "$MER" synth --preset tiny --quant q8_0 --threads 2 --chat-template qwen3 --eos-token '<|im_end|>' \
  --out "$WORK/im_end.gguf" >/dev/null || { fail "synth --eos-token"; exit 1; }

up "$WORK/endoftext.gguf" "$WORK/up1" || { fail "mer up"; exit 1; }
echo "mer up: HTTP API on $URL, metrics on $METRICS"

# 5. health, models, tokenize, detokenize.
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" == 200 ] || fail "/health is not 200"
curl -s "$URL/v1/models" >"$WORK/models.json"
[ "$(json "$WORK/models.json" "j['data'][0]['id']")" == qwen3 ] || fail "/v1/models: $(cat "$WORK/models.json")"
printf '{"prompt": "Hello <|im_end|> world"}' >"$WORK/t.json"
[ "$(post /tokenize "$WORK/t.json" "$WORK/t.out")" == 200 ] || fail "/tokenize: $(cat "$WORK/t.out")"
IM_END=$(curl -s -H 'Content-Type: application/json' -d '{"prompt": "<|im_end|>"}' "$URL/tokenize" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"][0])')
ENDOFTEXT=$(curl -s -H 'Content-Type: application/json' -d '{"prompt": "<|endoftext|>"}' "$URL/tokenize" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"][0])')
printf '{"tokens": %s}' "$(json "$WORK/t.out" "j['tokens']")" >"$WORK/d.json"
[ "$(post /detokenize "$WORK/d.json" "$WORK/d.out")" == 200 ] &&
  [ "$(json "$WORK/d.out" "j['prompt']")" == "Hello  world" ] || fail "/detokenize: $(cat "$WORK/d.out")"
echo "  /health, /v1/models, /tokenize, /detokenize: ok (<|im_end|> = $IM_END, <|endoftext|> = $ENDOFTEXT)"
for path in /tokenize /detokenize; do  # a body that is not a JSON object: 400 saying so
  printf '[1, 2]' >"$WORK/bad.json"
  [ "$(post $path "$WORK/bad.json" "$WORK/bad.out")" == 400 ] && grep -q "not a JSON object" "$WORK/bad.out" ||
    fail "$path with a JSON array: $(cat "$WORK/bad.out")"
done

# 1. The openai client.
if command -v node >/dev/null && [ -f "$HERE/openai/node_modules/openai/package.json" ]; then
  timeout 300 node "$HERE/openai/client.mjs" "$URL" qwen3 || fail "the openai client's checks"
else
  echo "SKIP: the openai client (no node or no tests/integration/openai/node_modules: run scripts/install-openai-client)"
  SKIPPED=1
fi

# 2. README.md's curl examples, as written but for the port.
port=${URL##*:}
awk '/<!-- http-examples -->/{on=1; next} /<!-- \/http-examples -->/{on=0} on' "$ROOT/README.md" |
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep '^curl ' | sed "s|127.0.0.1:8080|127.0.0.1:$port|g" >"$WORK/readme.sh"
n=$(grep -c '^curl ' "$WORK/readme.sh")
[ "$n" -ge 4 ] || fail "README.md has $n curl examples between the http-examples markers"
i=0
while IFS= read -r line; do
  i=$((i + 1))
  out=$(bash -c "$line -sS -w '\n%{http_code}'" 2>&1)
  code=${out##*$'\n'}
  [ "$code" == 200 ] || fail "README curl example $i: HTTP $code: $line: ${out:0:300}"
done <"$WORK/readme.sh"
echo "  README.md curl examples: $i run"

# 3. Invalid requests.
expect_error 400 invalid_request_error "bad JSON" '{"messages": [ {"role": "user"'
expect_error 400 invalid_request_error "wrong type" '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}'
expect_error 400 invalid_request_error "not an object" '[1, 2, 3]'
expect_error 400 invalid_request_error "missing messages" '{"model": "qwen3"}'
expect_error 400 invalid_request_error "bad role" '{"messages": [{"role": "robot", "content": "hi"}]}'
expect_error 400 invalid_request_error "top_p out of range" '{"messages": [{"role": "user", "content": "hi"}], "top_p": 0}'
expect_error 400 invalid_request_error "n too large" '{"messages": [{"role": "user", "content": "hi"}], "n": 1000}'
expect_error 400 invalid_request_error "token id outside the vocabulary" \
  '{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"99999999": 5}}'
expect_error 404 invalid_request_error "unknown model" '{"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}'
TOOLS='[{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]'
expect_error 400 invalid_request_error "bad tool_choice" \
  "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": $TOOLS, \"tool_choice\": \"sometimes\"}"
# A chat request with tools goes through the tool-call split (common/chat/tool_calls.h): the tiny
# model's random text has no <tool_call> block, so the reply is text (ended by max_tokens or, as it
# samples, by an end-of-generation token), streamed or not.
for stream in false true; do
  printf '{"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": %s, "tool_choice": "auto", "max_tokens": 12, "stream": %s}' \
    "$TOOLS" "$stream" >"$WORK/tools.json"
  code=$(post /v1/chat/completions "$WORK/tools.json" "$WORK/tools.out")
  if [ "$stream" == false ]; then
    got=$(json "$WORK/tools.out" "'%s %s' % (type(j['choices'][0]['message']['content']).__name__, j['choices'][0]['finish_reason'])")
    [ "$code" == 200 ] && [[ "$got" == "str length" || "$got" == "str stop" ]] ||
      fail "chat with tools: HTTP $code, got '$got': $(head -c 300 "$WORK/tools.out")"
  else
    [ "$code" == 200 ] && grep -qE '"finish_reason":"(length|stop)"' "$WORK/tools.out" &&
      [ "$(grep -v '^$' "$WORK/tools.out" | tail -1)" == 'data: [DONE]' ] || fail "chat with tools (stream): HTTP $code: $(head -c 300 "$WORK/tools.out")"
  fi
  echo "  chat with tools, stream $stream: $code"
done
python3 -c "import sys; sys.stdout.write('{\"messages\": [{\"role\": \"user\", \"content\": \"' + 'x' * (9 << 20) + '\"}]}')" >"$WORK/big.json"
got=$(post /v1/chat/completions "$WORK/big.json" "$WORK/big.out")
[ "$got" == 413 ] && [ -n "$(json "$WORK/big.out" "j['error']['message']")" ] &&
  echo "  oversize body: 413 $(json "$WORK/big.out" "j['error']['message']")" || fail "oversize body: HTTP $got $(head -c 200 "$WORK/big.out")"
got=$(curl -s -o "$WORK/nf.out" -w '%{http_code}' "$URL/v1/nothing")
[ "$got" == 404 ] && [ -n "$(json "$WORK/nf.out" "j['error']['message']")" ] || fail "unknown route: HTTP $got"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" == 200 ] || fail "the gateway stopped serving after the bad requests"

# 4. End-of-generation tokens stop generation, whichever the model's EOS is.
# stop_check LABEL TOKEN_ID: a completion whose first token is forced to TOKEN_ID.
stop_check() {
  printf '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "logit_bias": {"%s": 100}}' "$2" >"$WORK/s.json"
  local code
  code=$(post /v1/completions "$WORK/s.json" "$WORK/s.out")
  local got
  got=$(json "$WORK/s.out" "'%s %s %d' % (j['choices'][0]['finish_reason'], j['choices'][0]['stop_reason'], j['usage']['completion_tokens'])")
  [ "$code" == 200 ] && [ "$got" == "stop $2 1" ] || fail "$1: HTTP $code, got '$got' (want 'stop $2 1'): $(head -c 300 "$WORK/s.out")"
  echo "  $1: finish_reason/stop_reason/completion_tokens = $got"
  # Streamed too: the last choice event says the same.
  printf '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": true, "logit_bias": {"%s": 100}}' "$2" >"$WORK/s.json"
  curl -sN -H 'Content-Type: application/json' --data-binary "@$WORK/s.json" "$URL/v1/completions" >"$WORK/s.sse"
  grep -q "\"finish_reason\":\"stop\",\"stop_reason\":$2" "$WORK/s.sse" &&
    [ "$(grep -v '^$' "$WORK/s.sse" | tail -1)" == 'data: [DONE]' ] || fail "$1 (stream): $(head -c 400 "$WORK/s.sse")"
}
stop_check "EOS <|endoftext|>: stops at <|endoftext|>" "$ENDOFTEXT"
stop_check "EOS <|endoftext|>: stops at <|im_end|>" "$IM_END"

# 5. Metrics: the vLLM-style series with their labels, and the lint.
if fetch "$METRICS" "$WORK/g.metrics"; then
  lint_metrics "gateway /metrics" "$WORK/g.metrics"
  for series in 'mer_request_success_total{daemon="gateway",finish_reason="stop",model_name="qwen3"}' \
                'mer_request_success_total{daemon="gateway",finish_reason="length",model_name="qwen3"}'; do
    v=$(metric "$series" "$WORK/g.metrics")
    [ -n "$v" ] && [ "$v" -gt 0 ] || fail "metrics: $series = '$v'"
  done
  for name in mer_requests_running mer_requests_waiting mer_kv_cache_usage_ratio \
              mer_time_to_first_token_seconds_bucket mer_inter_token_latency_seconds_bucket \
              mer_request_duration_seconds_bucket mer_prompt_tokens_total mer_generated_tokens_total; do
    grep -q "^$name{" "$WORK/g.metrics" || fail "metrics: no $name"
  done
  grep -q '^mer_generated_tokens_total{daemon="gateway",model_name="qwen3"}' "$WORK/g.metrics" ||
    fail "metrics: mer_generated_tokens_total has no model_name label"
  echo "  /metrics: vLLM dashboard series present"
else
  fail "cannot fetch $METRICS"
fi
down

# The other model: EOS is <|im_end|>.
up "$WORK/im_end.gguf" "$WORK/up2" || { fail "mer up (EOS <|im_end|>)"; exit 1; }
stop_check "EOS <|im_end|>: stops at <|im_end|>" "$IM_END"
stop_check "EOS <|im_end|>: stops at <|endoftext|>" "$ENDOFTEXT"
down

echo "http_api_test: $FAILURES failure(s)"
[ "$FAILURES" -eq 0 ] || exit 1
[ "$SKIPPED" -eq 0 ] || exit 77
exit 0
