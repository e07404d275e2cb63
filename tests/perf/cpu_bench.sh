#!/usr/bin/env bash
# mer and llama.cpp side by side on one GGUF file, same prompt ids, same thread count, same method
# (greedy, 31 prompt + 128 generated tokens, 1 warm-up + 3 runs), alternating so that drift in the
# machine's speed hits both: mer, llama.cpp, mer, llama.cpp.
#   [MER_CPU_KERNELS=avx512|avx2|scalar] tests/perf/cpu_bench.sh MODEL.gguf [THREADS] [ROUNDS]
# MER_CPU_KERNELS forces mer's CPU kernel variant (common/quant/kernel_variant.h; default: the
# widest the CPU runs); mer bench prints the one it ran (cpu_kernels). llama.cpp runs the
# libggml-cpu variant scripts/install-llama-ref left in place (haswell, AVX2, unless installed
# with MER_LLAMA_CPU_VARIANT=...); llama_bench.mjs prints it (cpu_variant).
set -euo pipefail
cd "$(dirname "$0")/../.."
model=$1
threads=${2:-2}
rounds=${3:-2}
mer=${MER:-build/bin/mer}
text="The quick brown fox jumps over the lazy dog. Mixture-of-experts models route every token to a few experts, so the weights that a step reads change from token to token."
ids=$("$mer" tokenize --model "$model" --text "$text" | tr ' ' '\n' | head -31 | paste -sd, -)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "mer cpu kernels: MER_CPU_KERNELS=${MER_CPU_KERNELS:-auto}"
echo "model: $model"
echo "prompt ids: $ids"
for r in $(seq "$rounds"); do
  echo "== round $r: mer (load average $(cut -d" " -f1 /proc/loadavg))"
  "$mer" bench --model "$model" --threads "$threads" --prompt-ids "$ids" --gen-tokens 128 --runs 3 --warmup 1
  echo "== round $r: llama.cpp (load average $(cut -d" " -f1 /proc/loadavg))"
  node tests/perf/llama_bench.mjs --model "$model" --threads "$threads" --prompt-tokens "$ids" --gen-tokens 128 --runs 3 --warmup 1
done
