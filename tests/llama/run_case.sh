#!/usr/bin/env bash
# One llama.cpp parity test: writes a synthetic model with `mer synth`, then runs a node driver on it.
#   run_case.sh MER WORKDIR SYNTH_ARGS... -- DRIVER.mjs DRIVER_ARGS...
# runs  MER synth SYNTH_ARGS... --out WORKDIR/model.gguf
# then  node DRIVER.mjs --mer MER --model WORKDIR/model.gguf --work WORKDIR DRIVER_ARGS...
# Exits 77 (CTest skip) where node or the llama.cpp reference (tests/llama/node_modules, installed by
# scripts/install-llama-ref) is missing. The model is deleted when the driver passes (some are ~200 MB)
# and kept, with the driver's report and outputs, in WORKDIR when it fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mer=$1 work=$2
shift 2
synth=()
while (($#)) && [ "$1" != -- ]; do synth+=("$1"); shift; done
[ "${1:-}" = -- ] || { echo "run_case.sh: missing -- DRIVER" >&2; exit 2; }
shift
driver=$1
shift

if ! command -v node >/dev/null; then
  echo "SKIP: node is not installed"
  exit 77
fi
if [ ! -f "$here/node_modules/node-llama-cpp/package.json" ] ||
   [ ! -f "$here/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/llama-addon.node" ]; then
  echo "SKIP: the llama.cpp reference is not installed (run scripts/install-llama-ref)"
  exit 77
fi

rm -rf "$work"
mkdir -p "$work"
echo "+ $mer synth ${synth[*]} --out $work/model.gguf"
"$mer" synth "${synth[@]}" --out "$work/model.gguf"
echo "+ node $driver --mer $mer --model $work/model.gguf --work $work $*"
rc=0
node "$here/$driver" --mer "$mer" --model "$work/model.gguf" --work "$work" "$@" || rc=$?
if [ "$rc" -eq 0 ]; then rm -f "$work/model.gguf" "$work/mer_logits.f32"; fi
exit "$rc"
