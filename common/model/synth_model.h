// `mer synth`: valid qwen3moe GGUF files with deterministic pseudo-random weights, at any geometry.
//
// Weight scales keep activations near unit variance through the layers. Attention averages values
// over the context, so what the states of a sequence share comes out of every layer's attention
// again and would compound over depth until it is most of every state (every token then routes
// alike and greedy decoding repeats a token): attn_output is scaled by 2 / sqrt(n_layer) beyond 4
// layers, which keeps that growth the same at any depth and leaves routing a function of the token
// and, a little, of its context.
//
// With router_skew > 0 expert popularity is Zipf-like: every token embedding carries a shared
// direction c (half its energy), and the router row of the expert of popularity rank r gets a
// component along c that adds -router_skew * ln(r + 1) to its logit in every token (ranks permuted
// per layer), on top of the noise logit (spread ~0.7) that the token's own part gives. Every
// other row that reads a normed state (attn_v, the experts' gate and up, output) and the router's
// noise are made blind to c, so that c reaches nothing but the router's popularity term: otherwise
// each layer would add the same vector to every state and the routers would see it, not the token.
// Calibration (docs/benchmarks.md): greedy, 31 prompt + 128 generated tokens, LRU over 25% of all
// experts hits 73% at skew 0.675 on the qwen3-30b-a3b geometry (real Qwen3 routing: ~72%), and on
// that geometry with d_model 512 23% at skew 0 and 97% at 2.
// The same options and seed always give the same bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_writer.h"
#include "common/tensor/ggml_type.h"

namespace mer {

struct SynthGeometry {
  int32_t n_layer = 4;
  int32_t n_embd = 256;
  int32_t n_head = 4;
  int32_t n_head_kv = 2;
  int32_t head_dim = 64;
  int32_t n_expert = 16;
  int32_t n_expert_used = 4;
  int32_t n_ff_exp = 128;
  int32_t n_vocab = 1024;
  int32_t n_ctx = 4096;
};

// "micro" (unit tests), "tiny" (the embedded default), "small", "qwen3-30b-a3b",
// "qwen3-235b-a22b", or "random:SEED" (RandomSynthGeometry(SEED)); nullopt for an unknown name.
std::optional<SynthGeometry> SynthPreset(const std::string& name);

// A small valid geometry drawn from `seed` (the same seed, the same geometry), for testing every
// path on shapes nobody tuned for: 1-4 layers; widths, expert ffn and head dims that are
// multiples of 32 (resp. 16) but often not of 64 or 256; GQA ratios 1-8; 2-128 experts, not
// always a multiple of 16; top-1 to top-8; vocabularies of 300-4000; contexts of 128-1024.
SynthGeometry RandomSynthGeometry(uint64_t seed);

// The tensor types of a synthetic model (`mer synth --quant`; docs/quant.md lists them). Norms and
// the router are F32 in every one. The single types put every other matrix in that type;
// kQ3_K_M, kQ4_K_M and kQ5_K_M are llama.cpp's recipes of those names for qwen3moe; kQ4_K is a
// simpler Q4_K_M-like mix (q6_k for output and for attn_v and ffn_down of the even layers).
enum class SynthQuant {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_K,
  kQ5_K,
  kQ3_K,
  kQ2_K,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ3_K_M,
  kQ4_K_M,
  kQ5_K_M,
  kIQ4_NL,
  kIQ4_XS,
  kIQ2_XXS,
  kIQ3_XXS,
  kIQ2_XS,
  kIQ2_S,
  kIQ3_S,
  kIQ1_S,
};
std::optional<SynthQuant> ParseSynthQuant(const std::string& name);  // "f32", "q4_k", ...
// The names ParseSynthQuant takes, comma-separated.
std::string SynthQuantNames();

struct SynthOptions {
  SynthGeometry geometry;
  SynthQuant quant = SynthQuant::kQ8_0;
  uint64_t seed = 1;
  double router_skew = 0.0;    // popularity logit offset -router_skew * ln(rank + 1); 0 = unskewed
  bool norm_topk_prob = true;  // written as qwen3moe.expert_weights_norm
  int threads = 0;             // 0 = all cores
  // Written as tokenizer.chat_template when not empty (e.g. common/chat's Qwen3ChatTemplate()).
  std::string chat_template;
  // The text of the vocabulary's token written as tokenizer.ggml.eos_token_id: "<|endoftext|>"
  // (the default, also bos) or "<|im_end|>", as Qwen3's instruct models have it.
  std::string eos_token = "<|endoftext|>";
  // Types by tensor name that replace the quant's choice (tests of arbitrary per-tensor mixes); a
  // row length that is not whole blocks of its type is InvalidArgument.
  std::map<std::string, GgmlType> tensor_types;
  // Where > 0, every quantized matrix with more rows repeats its first `row_pool` rows (row r is
  // row r % row_pool), so the large geometries in the slow-to-quantize types (the i-quants take
  // ~300 ns a weight: hours for Qwen3-235B-A22B) are written at the disk's speed. For benchmarks:
  // the kernels' speed does not depend on the values. Written as mer.synth.row_pool. 0: every row
  // is its own.
  int row_pool = 0;
};

// The matrices of a model whose type a SynthQuant chooses.
enum class SynthMatrix {
  kTokenEmbd,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kGateExps,
  kUpExps,
  kDownExps,
  kOutput,
};

// The tensor type of `matrix` (of layer `layer`, where it has one) under `quant` in a model of
// geometry `g`. Where the chosen type's block does not divide the row length, kQ4_K falls back
// to q8_0 and the others as llama.cpp's quantizer does (q2_k, q3_k -> q4_0, q4_k -> q5_0,
// q5_k -> q5_1, q6_k -> q8_0, iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s -> iq4_nl;
// f16 where that does not divide it either).
GgmlType SynthTensorType(SynthQuant quant, SynthMatrix matrix, int layer, const SynthGeometry& g);

// Writes the model to `path`. Validates the geometry first (InvalidArgument naming the field).
absl::Status WriteSynthModel(const SynthOptions& options, const std::string& path);

// One tensor of a synthetic model and how its rows are made: `fill(r, out)` writes row r (0 <= r <
// the product of shape[1..]) of the f32 matrix, shape[0] values; rows are independent of each
// other, so they can be made in any order and on any thread, with the same results.
class SynthRowPool;
struct SynthTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> shape;  // ne[0] (row length) first
  std::function<void(int64_t row, float* out)> fill;
  std::shared_ptr<SynthRowPool> pool = nullptr;  // the rows repeated under SynthOptions::row_pool; null: none

  // The matrix's rows: the product of shape[1..].
  int64_t rows() const {
    int64_t n = 1;
    for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
    return n;
  }
};

// What WriteSynthModel writes, for writers of another layout (the expert store of
// common/store/synth_store.h): adds the model's metadata to `metadata` in file order and returns
// the tensors in file order. Validates the options first (InvalidArgument naming the field).
absl::StatusOr<std::vector<SynthTensor>> PlanSynthModel(const SynthOptions& options, GgufWriter& metadata);

// Rows [row0, row0 + rows) of `t` in its type, as the file holds them, into `out` (rows *
// RowBytes(t.type, t.shape[0]) bytes); `scratch` holds shape[0] floats.
void SynthRows(const SynthTensor& t, int64_t row0, int64_t rows, float* scratch, uint8_t* out);

}  // namespace mer
