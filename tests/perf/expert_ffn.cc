#include "tests/perf/expert_ffn.h"

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/quant/quant.h"
#include "services/compute/cpu/cpu_ops.h"

namespace mer::perf {
namespace {

constexpr int64_t kRowsPerChunk = 32;  // as the CPU engine's work items

}  // namespace

std::string ExpertShape::TypesName() const {
  std::string name(TypeName(gate_up_type));
  if (down_type != gate_up_type) absl::StrAppend(&name, "+", TypeName(down_type));
  return name;
}

absl::Status ParseExpertTypes(const std::string& spec, ExpertShape* shape) {
  const size_t plus = spec.find('+');
  const std::string gate_up = spec.substr(0, plus);
  const std::string down = plus == std::string::npos ? gate_up : spec.substr(plus + 1);
  const std::optional<GgmlType> g = ParseGgmlTypeName(gate_up), d = ParseGgmlTypeName(down);
  // F32 is left out: the engine's F32 dots take another path (cpu::DotF32Ggml).
  const auto usable = [](std::optional<GgmlType> t) { return t && *t != GgmlType::kQ8_K && *t != GgmlType::kF32; };
  if (!usable(g) || !usable(d))
    return absl::InvalidArgumentError(
        absl::StrCat("expert types '", spec, "': each must be f16, bf16, q8_0, q4_k or q6_k"));
  if (!IsRowSizeValid(*g, shape->embd) || !IsRowSizeValid(*d, shape->ff))
    return absl::InvalidArgumentError(absl::StrCat("expert types '", spec, "': rows of ", shape->embd, " / ", shape->ff,
                                                   " elements are not whole blocks"));
  shape->gate_up_type = *g;
  shape->down_type = *d;
  return absl::OkStatus();
}

void WriteRandomExperts(const ExpertShape& shape, int copies, uint32_t seed, uint8_t* dst) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> row(std::max(shape.embd, shape.ff));
  const auto fill = [&](GgmlType type, int64_t rows, int64_t cols, uint8_t* out) {
    const int64_t row_bytes = RowBytes(type, cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < cols; ++i) row[i] = normal(rng);
      QuantizeRow(type, row.data(), out + r * row_bytes, cols);
    }
  };
  fill(shape.gate_up_type, shape.ff, shape.embd, dst);
  fill(shape.gate_up_type, shape.ff, shape.embd, dst + shape.gate_bytes());
  fill(shape.down_type, shape.embd, shape.ff, dst + 2 * shape.gate_bytes());
  for (int c = 1; c < copies; ++c) std::memcpy(dst + c * shape.bytes(), dst, shape.bytes());
}

ExpertFfn::ExpertFfn(const ExpertShape& shape, KernelVariant kernels)
    : shape_(shape),
      kernels_(kernels),
      x_act_(RowBytes(ActivationTypeFor(shape.gate_up_type), shape.embd)),
      h_act_(RowBytes(ActivationTypeFor(shape.down_type), shape.ff)),
      gate_(shape.ff),
      up_(shape.ff) {
  CHECK(CpuSupports(kernels));
}

void ExpertFfn::Run(ThreadPool& pool, const uint8_t* expert, const float* x, float* out) {
  const int64_t E = shape_.embd, F = shape_.ff;
  const uint8_t* gate = expert;
  const uint8_t* up = expert + shape_.gate_bytes();
  const uint8_t* down = expert + 2 * shape_.gate_bytes();
  const int64_t rb_gate = RowBytes(shape_.gate_up_type, E), rb_down = RowBytes(shape_.down_type, F);
  QuantizeRow(ActivationTypeFor(shape_.gate_up_type), x, x_act_.data(), E);
  const int64_t ff_chunks = (F + kRowsPerChunk - 1) / kRowsPerChunk;
  pool.ParallelFor(2 * ff_chunks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const bool is_up = i >= ff_chunks;
      const int64_t r0 = (is_up ? i - ff_chunks : i) * kRowsPerChunk;
      VecDotRowsWith(kernels_, shape_.gate_up_type, (is_up ? up : gate) + r0 * rb_gate, std::min(kRowsPerChunk, F - r0),
                     x_act_.data(), E, (is_up ? up_ : gate_).data() + r0);
    }
  });
  cpu::SwiGlu(gate_.data(), up_.data(), F);
  QuantizeRow(ActivationTypeFor(shape_.down_type), gate_.data(), h_act_.data(), F);
  pool.ParallelFor((E + kRowsPerChunk - 1) / kRowsPerChunk, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r0 = i * kRowsPerChunk;
      VecDotRowsWith(kernels_, shape_.down_type, down + r0 * rb_down, std::min(kRowsPerChunk, E - r0), h_act_.data(), F,
                     out + r0);
    }
  });
}

}  // namespace mer::perf
