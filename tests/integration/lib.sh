# Helpers shared by the integration test scripts (sourced). A script sets FAILURES=0 first and
# exits non-zero when it is not 0 at the end.

# fail MESSAGE: records a failure and goes on.
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }

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
