#!/usr/bin/env bash
# usage: systemd_test.sh BUILD_DIR
# The deployment as systemd sees it: `cmake --install` into a scratch DESTDIR must lay out the
# binaries, units, sysusers entry and sample config; `systemd-analyze verify` must accept the
# units with no complaint at all (it exits 0 even on unknown keys, so any output fails); each unit
# keeps the properties the deployment relies on and an exposure of 3.x or lower (`systemd-analyze
# security`); every --flag an ExecStart passes is one its
# daemon knows (its --help lists it); and mer-residency speaks the notify protocol: READY=1 once
# serving, WATCHDOG=1 pings under WatchdogSec. Skips (77) where systemd-analyze is missing.
set -u
BUILD=$1
command -v systemd-analyze >/dev/null 2>&1 || { echo "systemd-analyze not installed: skipped"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mer_systemd.XXXXXX")
FAILURES=0
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -f /dev/shm/mer-sd-test-$$* 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
source "$(dirname "$0")/lib.sh"

# 1. Install.
DESTDIR=$WORK/root timeout 120 cmake --install "$BUILD" --prefix /usr/local >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; fail "cmake --install"; exit 1; }
ROOT=$WORK/root
UNITS=$ROOT/usr/local/lib/systemd/system
for f in usr/local/bin/mer usr/local/bin/mer-residency usr/local/bin/mer-compute usr/local/bin/mer-gateway \
         usr/local/lib/systemd/system/mer-residency.service usr/local/lib/systemd/system/mer-residency@.service \
         usr/local/lib/systemd/system/mer-compute.service \
         usr/local/lib/systemd/system/mer-gateway.service usr/local/lib/systemd/system/mer.target \
         usr/local/lib/sysusers.d/mer.conf etc/mer/mer.conf etc/mer/mer.conf.sample \
         usr/local/share/mer/prometheus/prometheus.yml; do
  [ -e "$ROOT/$f" ] || fail "not installed: /$f"
done
echo "installed: $(cd "$ROOT" && find . -type f | wc -l) files"

# 2. systemd-analyze verify, on copies whose paths point into the scratch root.
mkdir -p "$WORK/units"
for f in "$UNITS"/mer*; do
  sed -e "s|/usr/local/bin/|$ROOT/usr/local/bin/|" -e "s|EnvironmentFile=/etc/mer/|EnvironmentFile=$ROOT/etc/mer/|" \
    "$f" >"$WORK/units/$(basename "$f")"
done
# The template as rank 1's instance (verify and security take a unit file, named as the instance).
cp "$WORK/units/mer-residency@.service" "$WORK/units/mer-residency@1.service"
out=$(cd "$WORK/units" && timeout 60 systemd-analyze verify --man=no ./mer-residency.service ./mer-residency@1.service \
        ./mer-compute.service ./mer-gateway.service ./mer.target 2>&1); rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then fail "systemd-analyze verify (rc=$rc): $out"; else echo "systemd-analyze verify: clean"; fi

# 3. The properties the deployment relies on.
has() { grep -q "^$2" "$UNITS/$1" || fail "$1: no '$2'"; }
lacks() { ! grep -q "^$2" "$UNITS/$1" || fail "$1: has '$2'"; }
for u in mer-residency mer-residency@ mer-compute mer-gateway; do
  for key in "Type=notify" "WatchdogSec=" "Restart=on-failure" "EnvironmentFile=/etc/mer/mer.conf" \
             "User=mer" "PartOf=mer.target" "WantedBy=mer.target"; do
    has $u.service "$key"
  done
  lacks $u.service "DynamicUser=yes"
  lacks $u.service "RemoveIPC=yes"
done
for u in mer-residency mer-residency@ mer-compute; do  # pinned memory and GPUs
  has $u.service "LimitMEMLOCK=infinity"
  has $u.service "DeviceAllow=/dev/nvidiactl"
  lacks $u.service "PrivateDevices=yes"
done
has mer-compute.service "After=mer-residency.service"
has mer-residency@.service "Before=mer-compute.service"
# Expert ranks: rank 0's share, rank R's instance and share, mer-compute's rank count.
grep -q -- "--expert-share 0/\${MER_EXPERT_RANKS}" "$UNITS/mer-residency.service" || fail "mer-residency.service: no share 0"
grep -q -- "--instance \${MER_INSTANCE}.rank%i" "$UNITS/mer-residency@.service" || fail "mer-residency@.service: instance"
grep -q -- "--expert-share %i/\${MER_EXPERT_RANKS}" "$UNITS/mer-residency@.service" || fail "mer-residency@.service: share"
grep -q -- "--expert-ranks \${MER_EXPERT_RANKS}" "$UNITS/mer-compute.service" || fail "mer-compute.service: no --expert-ranks"
for v in MER_EXPERT_RANKS MER_RANK_RESIDENCY_METRICS MER_RANK_RESIDENCY_METRICS_URLS; do
  grep -q "^$v=" "$ROOT/etc/mer/mer.conf" || fail "mer.conf does not set $v"
done
# ... and the units default them, for a mer.conf written before them (EnvironmentFile= overrides).
for u in mer-residency mer-residency@ mer-compute; do has $u.service "Environment=MER_EXPERT_RANKS=1"; done
has mer-gateway.service "Environment=MER_RANK_RESIDENCY_METRICS_URLS="
grep -q "^After=.*mer-compute.service" "$UNITS/mer-gateway.service" || fail "mer-gateway.service: not After mer-compute"
grep -q "^Wants=.*mer-residency.service.*mer-compute.service.*mer-gateway.service" "$UNITS/mer.target" ||
  fail "mer.target does not want the three daemons"

# Exposure: `systemd-analyze security` (offline, on the installed units) rates each 3.x or lower.
for u in mer-residency mer-residency@1 mer-compute mer-gateway; do
  score=$(cd "$WORK/units" && timeout 60 systemd-analyze security --offline=true --no-pager ./$u.service 2>&1 |
            sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
  echo "systemd-analyze security $u.service: exposure $score"
  [ -n "$score" ] && awk -v s="$score" 'BEGIN { exit !(s < 4.0) }' || fail "$u.service: exposure ${score:-?}, want 3.x or lower"
  has ${u/@1/@}.service "CapabilityBoundingSet="
  has ${u/@1/@}.service "SystemCallFilter=@system-service"
done

# 4. Every flag of every ExecStart is one the daemon's --help knows.
for u in mer-residency mer-residency@ mer-compute mer-gateway; do
  exec_line=$(sed -n '/^ExecStart=/,/[^\\]$/p' "$UNITS/$u.service" | tr -d '\\\n')
  help=$("$BUILD/bin/${u%@}" --help 2>&1)
  for flag in $(echo "$exec_line" | grep -o -- '--[a-z][a-z-]*' | sort -u); do
    grep -q -- "$flag\b" <<<"$help" || fail "$u.service passes $flag, which '$u --help' does not list"
  done
done

# 5. sd_notify from a real daemon: READY=1, then WATCHDOG=1 pings (WATCHDOG_USEC=400 ms).
if command -v python3 >/dev/null 2>&1; then
  MER=$BUILD/bin/mer
  timeout 120 "$MER" synth --preset micro --quant q8_0 --threads 2 --out "$WORK/m.gguf" >/dev/null &&
    timeout 120 "$MER" pack --model "$WORK/m.gguf" --out "$WORK/store" --threads 2 >/dev/null ||
    fail "synth/pack for the notify check"
  sock=$WORK/notify.sock
  timeout 20 python3 - "$sock" >"$WORK/notify.log" 2>&1 <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(0.5)
end = time.time() + 4
while time.time() < end:
    try:
        print(s.recv(4096).decode().replace("\n", " | "), flush=True)
    except socket.timeout:
        pass
PY
  LPID=$!
  PIDS+=("$LPID")
  for _ in $(seq 1 50); do [ -S "$sock" ] && break; sleep 0.05; done
  ( NOTIFY_SOCKET=$sock WATCHDOG_USEC=400000 exec "$BUILD/bin/mer-residency" --store "$WORK/store" \
      --instance mer-sd-test-$$ --ram-budget 50% --metrics-listen off >"$WORK/res.log" 2>&1 ) &
  RPID=$!
  PIDS+=("$RPID")
  sleep 2
  kill -TERM "$RPID"; wait "$RPID"; rrc=$?
  wait "$LPID"
  grep -q "READY=1" "$WORK/notify.log" || fail "mer-residency sent no READY=1: $(cat "$WORK/notify.log" "$WORK/res.log")"
  pings=$(grep -c "WATCHDOG=1" "$WORK/notify.log")
  [ "$pings" -ge 2 ] || fail "mer-residency sent $pings WATCHDOG=1 pings in 2 s at WatchdogSec=0.4s"
  grep -q "STOPPING=1" "$WORK/notify.log" || fail "mer-residency sent no STOPPING=1 at SIGTERM"
  [ $rrc -eq 0 ] || fail "mer-residency exited $rrc after SIGTERM"
  echo "notify: $(grep -m1 READY "$WORK/notify.log"); $pings watchdog pings"
fi

if [ $FAILURES -ne 0 ]; then echo "$FAILURES failure(s)"; exit 1; fi
echo "all passed"
