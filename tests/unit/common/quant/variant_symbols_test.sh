#!/usr/bin/env bash
# The AVX-512 kernel objects define every external symbol inside their own namespace
# (mer::quant_internal::avx512, common/quant/simd_internal.h says why): an inline function of
# another namespace emitted there could be the copy the linker keeps for the AVX2 kernels too,
# and crash them on a CPU without AVX-512. Also checks that every row kernel is there.
# Usage: variant_symbols_test.sh NM 'OBJECT;OBJECT;...'
set -euo pipefail
nm=$1
IFS=';' read -ra objects <<<"$2"
ns='mer::quant_internal::avx512::'
# Demangled names; a function template's name comes after its return type ("void mer::..."),
# which is dropped where it is a builtin type.
symbols=$(for o in "${objects[@]}"; do "$nm" -C --defined-only --extern-only "$o"; done |
  sed -E 's/^[0-9a-f]* *[A-Za-z] //; s/^[a-z_ ]+ (mer::)/\1/')
stray=$(grep -v "^$ns" <<<"$symbols" || true)
if [ -n "$stray" ]; then
  echo "symbols outside $ns in the AVX-512 kernel objects:"
  echo "$stray"
  exit 1
fi
for k in F32Rows F16Rows BF16Rows Q4_0Rows Q4_1Rows Q5_0Rows Q5_1Rows Q8_0Rows Q2_KRows Q3_KRows \
  Q4_KRows Q5_KRows Q6_KRows IQ4_NLRows IQ4_XSRows IQ2_XXSRows IQ2_XSRows IQ3_XXSRows \
  IQ3_SRows IQ2_SRows IQ1_SRows; do
  grep -q "^$ns$k(" <<<"$symbols" || { echo "missing $ns$k"; exit 1; }
done
echo "$(wc -l <<<"$symbols") symbols, all in $ns"
