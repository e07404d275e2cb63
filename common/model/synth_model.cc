#include "common/model/synth_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/base/threads.h"
#include "common/quant/quant.h"
#include "common/tokenizer/tokenizer.h"

namespace mer {
namespace {

// splitmix64: tiny, fast and good enough for weights; seeded per (tensor, row) so rows can be
// generated in parallel and in any order with identical results.
struct Rng {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Symmetric() { return static_cast<float>(static_cast<int64_t>(Next() >> 11) * 0x1.0p-52 - 1.0); }
};

uint64_t HashName(absl::string_view s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// Uniform noise of standard deviation `stddev` (a = sqrt(3) * stddev).
void FillNoise(Rng& rng, float stddev, float* out, int64_t n) {
  const float a = 1.7320508f * stddev;
  for (int64_t i = 0; i < n; ++i) out[i] = a * rng.Symmetric();
}

// The weights of an RMS norm: 1 + 0.1 u, u uniform in [-1, 1).
std::vector<float> NormWeights(absl::string_view name, int64_t n, uint64_t seed) {
  Rng rng{HashName(name, seed)};
  std::vector<float> g(n);
  for (float& v : g) v = 1.0f + 0.1f * rng.Symmetric();
  return g;
}

// The unit direction along which a row reads c_hat after a norm with weights g: g * c_hat.
std::vector<float> NormedDirection(const std::vector<float>& g, const std::vector<float>& c_hat) {
  std::vector<float> d(g.size());
  double sq = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    d[i] = g[i] * c_hat[i];
    sq += double{d[i]} * d[i];
  }
  const float inv = static_cast<float>(1.0 / std::sqrt(sq));
  for (float& v : d) v *= inv;
  return d;
}

// out -= (out . d) d for a unit d: the row no longer reads anything along d.
void RemoveComponent(const float* d, float* out, int64_t n) {
  double dot = 0;
  for (int64_t i = 0; i < n; ++i) dot += double{out[i]} * d[i];
  for (int64_t i = 0; i < n; ++i) out[i] -= static_cast<float>(dot) * d[i];
}

absl::Status ValidateGeometry(const SynthGeometry& g) {
  const auto check = [](int64_t v, int64_t lo, int64_t hi, const char* name) -> absl::Status {
    if (v < lo || v > hi)
      return absl::InvalidArgumentError(
          absl::StrCat("synth: --", name, " = ", v, " is out of range [", lo, ", ", hi, "]"));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check(g.n_layer, 1, 256, "layers"));
  RETURN_IF_ERROR(check(g.n_embd, 32, 16384, "embd"));
  RETURN_IF_ERROR(check(g.n_head, 1, 256, "heads"));
  RETURN_IF_ERROR(check(g.n_head_kv, 1, g.n_head, "kv-heads"));
  RETURN_IF_ERROR(check(g.head_dim, 2, 512, "head-dim"));
  RETURN_IF_ERROR(check(g.n_expert, 1, 1024, "experts"));
  RETURN_IF_ERROR(check(g.n_expert_used, 1, g.n_expert, "experts-used"));
  RETURN_IF_ERROR(check(g.n_ff_exp, 32, 65536, "ff-exp"));
  RETURN_IF_ERROR(check(g.n_vocab, 259, 1 << 20, "vocab"));
  RETURN_IF_ERROR(check(g.n_ctx, 16, 1 << 20, "ctx"));
  if (g.n_head % g.n_head_kv != 0) return absl::InvalidArgumentError("synth: --heads must be a multiple of --kv-heads");
  if (g.head_dim % 2 != 0) return absl::InvalidArgumentError("synth: --head-dim must be even");
  for (auto [v, name] : {std::pair<int64_t, const char*>{g.n_embd, "embd"},
                         {g.n_ff_exp, "ff-exp"},
                         {int64_t{g.n_head} * g.head_dim, "heads x head-dim"}}) {
    if (v % 32 != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("synth: ", name, " = ", v, " must be a multiple of 32 (the Q8_0 block)"));
  }
  return absl::OkStatus();
}

// Generates the rows of `plan` in parallel, in chunks of bounded size, and appends them.
absl::Status WriteTensor(GgufWriter& writer, const SynthTensor& plan, int threads) {
  const int64_t cols = plan.shape[0];
  const int64_t rows = plan.rows();
  const int64_t row_bytes = RowBytes(plan.type, cols);
  const int64_t chunk_rows = std::min(rows, std::max<int64_t>(1, (64 << 20) / std::max<int64_t>(row_bytes, cols * 4)));
  std::vector<uint8_t> chunk(chunk_rows * row_bytes);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    const int t_count = static_cast<int>(std::min<int64_t>(threads, n));
    std::vector<std::thread> pool;
    for (int t = 0; t < t_count; ++t) {
      pool.emplace_back([&, t] {
        std::vector<float> row(cols);
        for (int64_t r = t; r < n; r += t_count) SynthRows(plan, r0 + r, 1, row.data(), chunk.data() + r * row_bytes);
      });
    }
    for (std::thread& th : pool) th.join();
    RETURN_IF_ERROR(writer.Append(absl::MakeConstSpan(chunk.data(), n * row_bytes)));
  }
  return absl::OkStatus();
}

struct QuantName {
  SynthQuant quant;
  const char* name;
  uint32_t file_type;  // llama_ftype numbering, written as general.file_type
};
constexpr QuantName kQuantNames[] = {
    {SynthQuant::kF32, "f32", 0},
    {SynthQuant::kF16, "f16", 1},
    {SynthQuant::kBF16, "bf16", 32},
    {SynthQuant::kQ8_0, "q8_0", 7},
    {SynthQuant::kQ4_K, "q4_k", 15},  // Q4_K_M
    {SynthQuant::kQ5_K, "q5_k", 16},  // Q5_K_S
    {SynthQuant::kQ3_K, "q3_k", 11},  // Q3_K_S
    {SynthQuant::kQ2_K, "q2_k", 10},  // Q2_K
    {SynthQuant::kQ4_0, "q4_0", 2},
    {SynthQuant::kQ4_1, "q4_1", 3},
    {SynthQuant::kQ5_0, "q5_0", 8},
    {SynthQuant::kQ5_1, "q5_1", 9},
    {SynthQuant::kQ3_K_M, "q3_k_m", 12},
    {SynthQuant::kQ4_K_M, "q4_k_m", 15},
    {SynthQuant::kQ5_K_M, "q5_k_m", 17},
    {SynthQuant::kIQ4_NL, "iq4_nl", 25},
    {SynthQuant::kIQ4_XS, "iq4_xs", 30},
    {SynthQuant::kIQ2_XXS, "iq2_xxs", 19},
    {SynthQuant::kIQ2_XS, "iq2_xs", 20},
    {SynthQuant::kIQ3_XXS, "iq3_xxs", 23},
    // llama.cpp's loader names a file of mostly IQ2_S, IQ3_S or IQ1_S tensors by these numbers.
    {SynthQuant::kIQ2_S, "iq2_s", 28},
    {SynthQuant::kIQ3_S, "iq3_s", 26},
    {SynthQuant::kIQ1_S, "iq1_s", 24},
};

const QuantName& NameOf(SynthQuant q) {
  for (const QuantName& n : kQuantNames) {
    if (n.quant == q) return n;
  }
  return kQuantNames[0];
}

// The type llama.cpp's quantizer puts a matrix in when its rows are not whole blocks of the
// type it chose (llama-quant.cpp, tensor_type_fallback); F16 where that does not fit either.
GgmlType Fallback(GgmlType type) {
  switch (type) {
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
      return GgmlType::kQ4_0;
    case GgmlType::kQ4_K:
      return GgmlType::kQ5_0;
    case GgmlType::kQ5_K:
      return GgmlType::kQ5_1;
    case GgmlType::kQ6_K:
      return GgmlType::kQ8_0;
    case GgmlType::kIQ4_XS:
    case GgmlType::kIQ2_XXS:
    case GgmlType::kIQ2_XS:
    case GgmlType::kIQ2_S:
    case GgmlType::kIQ3_XXS:
    case GgmlType::kIQ3_S:
    case GgmlType::kIQ1_S:
      return GgmlType::kIQ4_NL;
    default:
      return type;
  }
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool UseMoreBits(int layer, int n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

// The types llama.cpp's quantizer gives a qwen3moe model's matrices under its Q3_K_M, Q4_K_M and
// Q5_K_M recipes (llama-quant.cpp, llama_tensor_get_type_impl, without an importance matrix),
// before the fallback for rows that are not whole blocks.
GgmlType RecipeType(SynthQuant quant, SynthMatrix matrix, int layer, const SynthGeometry& g, int64_t cols) {
  const GgmlType base = quant == SynthQuant::kQ3_K_M   ? GgmlType::kQ3_K
                        : quant == SynthQuant::kQ4_K_M ? GgmlType::kQ4_K
                                                       : GgmlType::kQ5_K;
  const bool eight_experts = g.n_expert == 8;
  switch (matrix) {
    case SynthMatrix::kOutput:
      return IsRowSizeValid(base, cols) ? GgmlType::kQ6_K : GgmlType::kQ8_0;
    case SynthMatrix::kAttnV:
      if (eight_experts) return GgmlType::kQ8_0;
      if (quant == SynthQuant::kQ3_K_M) return layer < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
      return UseMoreBits(layer, g.n_layer) ? GgmlType::kQ6_K : base;
    case SynthMatrix::kAttnK:
      return eight_experts ? GgmlType::kQ8_0 : base;
    case SynthMatrix::kAttnOutput:
      if (eight_experts) return quant == SynthQuant::kQ5_K_M ? base : GgmlType::kQ5_K;
      return quant == SynthQuant::kQ3_K_M ? GgmlType::kQ4_K : base;
    case SynthMatrix::kDownExps:
      if (quant == SynthQuant::kQ3_K_M) return layer < g.n_layer / 16 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
      return UseMoreBits(layer, g.n_layer) ? GgmlType::kQ6_K : base;
    case SynthMatrix::kTokenEmbd:
    case SynthMatrix::kAttnQ:
    case SynthMatrix::kGateExps:
    case SynthMatrix::kUpExps:
      return base;
  }
  return base;
}

// The single tensor type of `quant` where it has one.
std::optional<GgmlType> SingleType(SynthQuant quant) {
  switch (quant) {
    case SynthQuant::kF32:
      return GgmlType::kF32;
    case SynthQuant::kF16:
      return GgmlType::kF16;
    case SynthQuant::kBF16:
      return GgmlType::kBF16;
    case SynthQuant::kQ8_0:
      return GgmlType::kQ8_0;
    case SynthQuant::kQ5_K:
      return GgmlType::kQ5_K;
    case SynthQuant::kQ3_K:
      return GgmlType::kQ3_K;
    case SynthQuant::kQ2_K:
      return GgmlType::kQ2_K;
    case SynthQuant::kQ4_0:
      return GgmlType::kQ4_0;
    case SynthQuant::kQ4_1:
      return GgmlType::kQ4_1;
    case SynthQuant::kQ5_0:
      return GgmlType::kQ5_0;
    case SynthQuant::kQ5_1:
      return GgmlType::kQ5_1;
    case SynthQuant::kIQ4_NL:
      return GgmlType::kIQ4_NL;
    case SynthQuant::kIQ4_XS:
      return GgmlType::kIQ4_XS;
    case SynthQuant::kIQ2_XXS:
      return GgmlType::kIQ2_XXS;
    case SynthQuant::kIQ3_XXS:
      return GgmlType::kIQ3_XXS;
    case SynthQuant::kIQ2_XS:
      return GgmlType::kIQ2_XS;
    case SynthQuant::kIQ2_S:
      return GgmlType::kIQ2_S;
    case SynthQuant::kIQ3_S:
      return GgmlType::kIQ3_S;
    case SynthQuant::kIQ1_S:
      return GgmlType::kIQ1_S;
    case SynthQuant::kQ4_K:
    case SynthQuant::kQ3_K_M:
    case SynthQuant::kQ4_K_M:
    case SynthQuant::kQ5_K_M:
      break;
  }
  return std::nullopt;
}

}  // namespace

std::optional<SynthGeometry> SynthPreset(const std::string& name) {
  SynthGeometry g;
  if (name == "tiny") return g;
  if (name == "micro") {  // the smallest useful geometry: unit tests build dozens of these
    g.n_layer = 2;
    g.n_embd = 64;
    g.n_head = 4;
    g.n_head_kv = 2;
    g.head_dim = 16;
    g.n_expert = 8;
    g.n_expert_used = 2;
    g.n_ff_exp = 32;
    g.n_vocab = 300;
    g.n_ctx = 256;
    return g;
  }
  if (name == "small") {
    g.n_layer = 12;
    g.n_embd = 768;
    g.n_head = 12;
    g.n_head_kv = 4;
    g.head_dim = 64;
    g.n_expert = 32;
    g.n_expert_used = 4;
    g.n_ff_exp = 512;
    g.n_vocab = 8192;
    g.n_ctx = 8192;
    return g;
  }
  if (name == "qwen3-30b-a3b") {
    g.n_layer = 48;
    g.n_embd = 2048;
    g.n_head = 32;
    g.n_head_kv = 4;
    g.head_dim = 128;
    g.n_expert = 128;
    g.n_expert_used = 8;
    g.n_ff_exp = 768;
    g.n_vocab = 151936;
    g.n_ctx = 40960;
    return g;
  }
  if (name == "qwen3-235b-a22b") {
    g.n_layer = 94;
    g.n_embd = 4096;
    g.n_head = 64;
    g.n_head_kv = 4;
    g.head_dim = 128;
    g.n_expert = 128;
    g.n_expert_used = 8;
    g.n_ff_exp = 1536;
    g.n_vocab = 151936;
    g.n_ctx = 40960;
    return g;
  }
  if (name.rfind("random:", 0) == 0) {
    const std::string digits = name.substr(7);
    if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return RandomSynthGeometry(std::stoull(digits));
  }
  return std::nullopt;
}

SynthGeometry RandomSynthGeometry(uint64_t seed) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  const auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const auto pick = [&next](std::initializer_list<int32_t> values) {
    return *(values.begin() + next() % values.size());
  };
  SynthGeometry g;
  g.n_layer = pick({1, 2, 3, 4});
  // Widths that are multiples of 32 but often not of 64 or 256 (the K-quants fall back to Q8_0
  // for rows that are not whole 256-blocks, as llama.cpp's quantizer does).
  g.n_embd = pick({64, 96, 128, 160, 192, 224, 256, 288, 320, 512});
  g.n_ff_exp = pick({32, 64, 96, 128, 160, 256});
  do {
    g.head_dim = pick({16, 32, 48, 64, 80, 96, 128, 256});
    g.n_head_kv = pick({1, 2, 3, 4});
    g.n_head = g.n_head_kv * pick({1, 2, 3, 4, 8});
  } while ((int64_t{g.n_head} * g.head_dim) % 32 != 0 || g.n_head > 16);
  g.n_expert = pick({2, 3, 5, 8, 16, 24, 31, 32, 48, 60, 64, 128});
  g.n_expert_used = std::min<int32_t>(g.n_expert, pick({1, 1, 2, 3, 4, 6, 8}));
  g.n_vocab = pick({300, 512, 777, 1024, 2048, 4000});
  g.n_ctx = pick({128, 256, 512, 1024});  // below `mer up`'s default --ctx
  return g;
}

std::optional<SynthQuant> ParseSynthQuant(const std::string& name) {
  for (const QuantName& n : kQuantNames) {
    if (name == n.name) return n.quant;
  }
  return std::nullopt;
}

std::string SynthQuantNames() {
  std::string s;
  for (const QuantName& n : kQuantNames) absl::StrAppend(&s, s.empty() ? "" : ",", n.name);
  return s;
}

GgmlType SynthTensorType(SynthQuant quant, SynthMatrix matrix, int layer, const SynthGeometry& g) {
  const int64_t cols = matrix == SynthMatrix::kAttnOutput ? int64_t{g.n_head} * g.head_dim
                       : matrix == SynthMatrix::kDownExps ? g.n_ff_exp
                                                          : g.n_embd;
  if (quant == SynthQuant::kQ4_K) {
    // q6_k for the LM head and for attn_v and ffn_down of every other layer; q8_0 where the row
    // is not whole blocks.
    const bool more_bits = matrix == SynthMatrix::kOutput ||
                           ((matrix == SynthMatrix::kAttnV || matrix == SynthMatrix::kDownExps) && layer % 2 == 0);
    const GgmlType type = more_bits ? GgmlType::kQ6_K : GgmlType::kQ4_K;
    return IsRowSizeValid(type, cols) ? type : GgmlType::kQ8_0;
  }
  const std::optional<GgmlType> single = SingleType(quant);
  const GgmlType type = single ? *single : RecipeType(quant, matrix, layer, g, cols);
  if (IsRowSizeValid(type, cols)) return type;
  const GgmlType fallback = Fallback(type);
  return IsRowSizeValid(fallback, cols) ? fallback : GgmlType::kF16;
}

namespace {

// Rows [row0, row0 + rows) of `t` made from its fill, quantized to its type.
void MakeRows(const SynthTensor& t, int64_t row0, int64_t rows, float* scratch, uint8_t* out) {
  const int64_t cols = t.shape[0];
  const int64_t row_bytes = RowBytes(t.type, cols);
  for (int64_t r = 0; r < rows; ++r) {
    t.fill(row0 + r, scratch);
    if (t.type == GgmlType::kF32) {
      std::memcpy(out + r * row_bytes, scratch, row_bytes);
    } else {
      QuantizeRow(t.type, scratch, out + r * row_bytes, cols);
    }
  }
}

}  // namespace

// A matrix's first rows, quantized once by the first writer thread that needs them (the others
// wait for it) and copied from then on.
class SynthRowPool {
 public:
  explicit SynthRowPool(int64_t rows) : rows_(rows) {}

  int64_t rows() const { return rows_; }
  const uint8_t* Bytes(const SynthTensor& t, float* scratch) {
    std::call_once(made_, [&] {
      bytes_.resize(rows_ * RowBytes(t.type, t.shape[0]));
      MakeRows(t, 0, rows_, scratch, bytes_.data());
    });
    return bytes_.data();
  }

 private:
  const int64_t rows_;
  std::once_flag made_;
  std::vector<uint8_t> bytes_;
};

void SynthRows(const SynthTensor& t, int64_t row0, int64_t rows, float* scratch, uint8_t* out) {
  if (t.pool == nullptr) return MakeRows(t, row0, rows, scratch, out);
  const int64_t row_bytes = RowBytes(t.type, t.shape[0]);
  const uint8_t* pool = t.pool->Bytes(t, scratch);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out + r * row_bytes, pool + (row0 + r) % t.pool->rows() * row_bytes, row_bytes);
}

absl::StatusOr<std::vector<SynthTensor>> PlanSynthModel(const SynthOptions& options, GgufWriter& w) {
  const SynthGeometry& g = options.geometry;
  RETURN_IF_ERROR(ValidateGeometry(g));
  if (!(options.router_skew >= 0 && options.router_skew <= 16))
    return absl::InvalidArgumentError("synth: --router-skew must be in [0, 16]");
  if (options.row_pool < 0) return absl::InvalidArgumentError("synth: --row-pool must be >= 0");
  const uint64_t seed = options.seed;
  const int64_t n_embd = g.n_embd;
  const int64_t q_dim = int64_t{g.n_head} * g.head_dim;
  const int64_t kv_dim = int64_t{g.n_head_kv} * g.head_dim;

  w.AddString("general.architecture", "qwen3moe");
  w.AddString("general.name", "mer synthetic qwen3moe");
  w.AddUint32("general.file_type", NameOf(options.quant).file_type);
  w.AddUint64("mer.synth.seed", seed);
  w.AddFloat32("mer.synth.router_skew", static_cast<float>(options.router_skew));
  if (options.row_pool > 0) w.AddUint32("mer.synth.row_pool", options.row_pool);
  w.AddUint32("qwen3moe.context_length", g.n_ctx);
  w.AddUint32("qwen3moe.embedding_length", g.n_embd);
  w.AddUint32("qwen3moe.block_count", g.n_layer);
  w.AddUint32("qwen3moe.feed_forward_length", g.n_ff_exp * g.n_expert_used);
  w.AddUint32("qwen3moe.attention.head_count", g.n_head);
  w.AddUint32("qwen3moe.attention.head_count_kv", g.n_head_kv);
  w.AddUint32("qwen3moe.attention.key_length", g.head_dim);
  w.AddUint32("qwen3moe.attention.value_length", g.head_dim);
  w.AddFloat32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
  w.AddFloat32("qwen3moe.rope.freq_base", 1000000.0f);
  w.AddUint32("qwen3moe.expert_count", g.n_expert);
  w.AddUint32("qwen3moe.expert_used_count", g.n_expert_used);
  w.AddUint32("qwen3moe.expert_feed_forward_length", g.n_ff_exp);
  w.AddBool("qwen3moe.expert_weights_norm", options.norm_topk_prob);

  TokenizerVocab vocab = MakeSyntheticVocab(g.n_vocab, g.n_vocab);
  const auto eos = std::find(vocab.tokens.begin(), vocab.tokens.end(), options.eos_token);
  if (eos == vocab.tokens.end() ||
      vocab.token_types[eos - vocab.tokens.begin()] != static_cast<int32_t>(TokenType::kControl))
    return absl::InvalidArgumentError(
        absl::StrCat("eos_token: '", options.eos_token, "' is not a control token of the synthetic vocabulary"));
  vocab.eos_id = static_cast<int32_t>(eos - vocab.tokens.begin());
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "qwen2");
  w.AddStringArray("tokenizer.ggml.tokens", vocab.tokens);
  w.AddInt32Array("tokenizer.ggml.token_type", vocab.token_types);
  w.AddStringArray("tokenizer.ggml.merges", vocab.merges);
  w.AddUint32("tokenizer.ggml.bos_token_id", vocab.bos_id);
  w.AddUint32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  w.AddUint32("tokenizer.ggml.padding_token_id", vocab.bos_id);
  w.AddBool("tokenizer.ggml.add_bos_token", vocab.add_bos);
  if (!options.chat_template.empty()) w.AddString("tokenizer.chat_template", options.chat_template);

  // The shared direction c of the skew construction: a fixed random sign pattern, unit length.
  // Shared by the fill functions, which outlive this call.
  auto c_hat_owned = std::make_shared<std::vector<float>>(n_embd);
  {
    Rng rng{HashName("mer.synth.c", seed)};
    const float inv = 1.0f / std::sqrt(static_cast<float>(n_embd));
    for (float& v : *c_hat_owned) v = (rng.Next() & 1) ? inv : -inv;
  }
  std::shared_ptr<const std::vector<float>> c_hat = c_hat_owned;
  const bool skewed = options.router_skew > 0;
  // Embedding: unit noise, plus sqrt(n_embd) along c when skewed: c carries about half of its
  // energy, so the residual stream keeps a component the routers can see, and the other half
  // still tells tokens apart.
  const float c_embd = std::sqrt(static_cast<float>(n_embd));
  // Attention averages values over the context, so whatever the states of a sequence share comes
  // out of every layer's attention again (gain about 1 per layer at these scales) and compounds
  // over depth until it is most of the state: every token then routes alike and greedy decoding
  // repeats itself. Scaling the output projection by 2 / sqrt(n_layer) bounds that growth the same
  // way at any depth; up to 4 layers it is left at 1.
  const float attn_out_scale = g.n_layer > 4 ? 2.0f / std::sqrt(static_cast<float>(g.n_layer)) : 1.0f;

  // When skewed, the rows that read a normed state do not see c (along the direction that c has
  // after the norm's weights), except the router's popularity component: c is the same in every
  // token, so values, experts and the output layer carrying it would add to every state the same
  // vector, and the routers would see that instead of the token.
  // Shared by the fill functions that read them (which outlive this call); a deque keeps the
  // directions in place as more are added.
  auto directions = std::make_shared<std::deque<std::vector<float>>>();
  const auto direction_after = [&](const std::string& norm_name) -> const float* {
    if (!skewed) return nullptr;
    directions->push_back(NormedDirection(NormWeights(norm_name, n_embd, seed), *c_hat));
    return directions->back().data();
  };

  std::vector<SynthTensor> plans;
  const auto noise_matrix = [&](std::string name, GgmlType type, std::vector<int64_t> shape, float stddev,
                                const float* blind = nullptr) {  // blind: unit, or null
    const uint64_t h = HashName(name, seed);
    const int64_t cols = shape[0];
    plans.push_back(
        {std::move(name), type, std::move(shape), [h, stddev, cols, blind, directions](int64_t row, float* out) {
           Rng rng{h ^ (static_cast<uint64_t>(row) * 0xd1342543de82ef95ull)};
           FillNoise(rng, stddev, out, cols);
           if (blind != nullptr) RemoveComponent(blind, out, cols);
         }});
  };
  const auto norm_vector = [&](std::string name, int64_t n) {
    std::vector<float> weights = NormWeights(name, n, seed);
    plans.push_back({std::move(name), GgmlType::kF32, {n}, [weights = std::move(weights)](int64_t, float* out) {
                       std::copy(weights.begin(), weights.end(), out);
                     }});
  };
  using M = SynthMatrix;
  const auto type_for = [&](SynthMatrix matrix, int layer) { return SynthTensorType(options.quant, matrix, layer, g); };

  {
    const uint64_t h = HashName("token_embd.weight", seed);
    plans.push_back({"token_embd.weight",
                     type_for(M::kTokenEmbd, -1),
                     {n_embd, g.n_vocab},
                     [h, n_embd, skewed, c_embd, c_hat](int64_t row, float* out) {
                       Rng rng{h ^ (static_cast<uint64_t>(row) * 0xd1342543de82ef95ull)};
                       FillNoise(rng, 1.0f, out, n_embd);
                       if (skewed)
                         for (int64_t i = 0; i < n_embd; ++i) out[i] += c_embd * (*c_hat)[i];
                     }});
  }
  for (int il = 0; il < g.n_layer; ++il) {
    const std::string b = absl::StrCat("blk.", il, ".");
    const float* attn_blind = direction_after(b + "attn_norm.weight");
    const float* ffn_blind = direction_after(b + "ffn_norm.weight");
    norm_vector(b + "attn_norm.weight", n_embd);
    noise_matrix(b + "attn_q.weight", type_for(M::kAttnQ, il), {n_embd, q_dim}, 1.0f / std::sqrt(float(n_embd)));
    noise_matrix(b + "attn_k.weight", type_for(M::kAttnK, il), {n_embd, kv_dim}, 1.0f / std::sqrt(float(n_embd)));
    noise_matrix(b + "attn_v.weight", type_for(M::kAttnV, il), {n_embd, kv_dim}, 1.0f / std::sqrt(float(n_embd)),
                 attn_blind);
    noise_matrix(b + "attn_output.weight", type_for(M::kAttnOutput, il), {q_dim, n_embd},
                 attn_out_scale / std::sqrt(float(q_dim)));
    norm_vector(b + "attn_q_norm.weight", g.head_dim);
    norm_vector(b + "attn_k_norm.weight", g.head_dim);
    norm_vector(b + "ffn_norm.weight", n_embd);
    {
      // Router: noise giving logits of about unit spread, plus, when skewed, the popularity
      // component along c: the normed state has |x| ~ sqrt(n_embd) and about 0.7 of it along c,
      // so expert e's logit gets b_e = -router_skew * ln(rank + 1) in every token.
      std::vector<int> rank(g.n_expert);
      std::iota(rank.begin(), rank.end(), 0);
      Rng perm{HashName(b + "router.rank", seed)};
      for (int i = g.n_expert - 1; i > 0; --i) std::swap(rank[i], rank[perm.Next() % (i + 1)]);
      const std::string name = b + "ffn_gate_inp.weight";
      const uint64_t h = HashName(name, seed);
      const double skew = options.router_skew;
      plans.push_back({name,
                       GgmlType::kF32,
                       {n_embd, g.n_expert},
                       [h, n_embd, rank, skew, c_hat, ffn_blind, directions](int64_t row, float* out) {
                         Rng rng{h ^ (static_cast<uint64_t>(row) * 0xd1342543de82ef95ull)};
                         FillNoise(rng, 1.0f / std::sqrt(float(n_embd)), out, n_embd);
                         if (skew > 0) {
                           RemoveComponent(ffn_blind, out, n_embd);
                           const double b_e = -skew * std::log(rank[row] + 1.0) / (0.7 * std::sqrt(double(n_embd)));
                           for (int64_t i = 0; i < n_embd; ++i) out[i] += static_cast<float>(b_e) * (*c_hat)[i];
                         }
                       }});
    }
    noise_matrix(b + "ffn_gate_exps.weight", type_for(M::kGateExps, il), {n_embd, g.n_ff_exp, g.n_expert},
                 1.0f / std::sqrt(float(n_embd)), ffn_blind);
    noise_matrix(b + "ffn_up_exps.weight", type_for(M::kUpExps, il), {n_embd, g.n_ff_exp, g.n_expert},
                 1.0f / std::sqrt(float(n_embd)), ffn_blind);
    noise_matrix(b + "ffn_down_exps.weight", type_for(M::kDownExps, il), {g.n_ff_exp, n_embd, g.n_expert},
                 1.0f / std::sqrt(float(g.n_ff_exp)));
  }
  const float* output_blind = direction_after("output_norm.weight");
  norm_vector("output_norm.weight", n_embd);
  noise_matrix("output.weight", type_for(M::kOutput, -1), {n_embd, g.n_vocab}, 2.0f / std::sqrt(float(n_embd)),
               output_blind);

  for (SynthTensor& t : plans) {
    const auto it = options.tensor_types.find(t.name);
    if (it == options.tensor_types.end()) continue;
    if (!IsRowSizeValid(it->second, t.shape[0]))
      return absl::InvalidArgumentError(absl::StrCat("synth: ", t.name, "'s rows of ", t.shape[0],
                                                     " are not whole blocks of ", TypeName(it->second)));
    t.type = it->second;
  }
  if (options.row_pool > 0) {
    for (SynthTensor& t : plans)
      if (t.type != GgmlType::kF32 && t.rows() > options.row_pool)
        t.pool = std::make_shared<SynthRowPool>(options.row_pool);
  }
  return plans;
}

absl::Status WriteSynthModel(const SynthOptions& options, const std::string& path) {
  GgufWriter w;
  ASSIGN_OR_RETURN(const std::vector<SynthTensor> tensors, PlanSynthModel(options, w));
  for (const SynthTensor& t : tensors) w.AddTensor(t.name, t.type, t.shape);
  RETURN_IF_ERROR(w.Open(path));
  const int threads = ResolveThreads(options.threads);
  for (const SynthTensor& t : tensors) RETURN_IF_ERROR(WriteTensor(w, t, threads));
  return w.Finish();
}

}  // namespace mer
