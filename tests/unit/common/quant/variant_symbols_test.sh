#!/usr/bin/env bash
# The AVX-512 kernel objects define every external symbol inside their own namespace
# (mer::quant_internal::avx512, common/quant/simd_internal.h says why): an inline function of
# another namespace emitted there could be the copy the linker keeps for the AVX2 kernels too,
# and crash them on a CPU without AVX-512. Also checks that the six kernels are there.
# Usage: variant_symbols_test.sh NM 'OBJECT;OBJECT;...'
set -euo pipefail
nm=$1
IFS=';' read -ra objects <<<"$2"
ns='mer::quant_internal::avx512::'
symbols=$(for o in "${objects[@]}"; do "$nm" -C --defined-only --extern-only "$o"; done |
  sed -E 's/^[0-9a-f]* *[A-Za-z] //')
stray=$(grep -v "^$ns" <<<"$symbols" || true)
if [ -n "$stray" ]; then
  echo "symbols outside $ns in the AVX-512 kernel objects:"
  echo "$stray"
  exit 1
fi
for k in F32Rows F16Rows BF16Rows Q8_0Rows Q4_KRows Q6_KRows; do
  grep -q "^$ns$k(" <<<"$symbols" || { echo "missing $ns$k"; exit 1; }
done
echo "$(wc -l <<<"$symbols") symbols, all in $ns"
