// Tests of ReadModelConfig and ModelWeights::Load on small qwen3moe files written with GgufWriter:
// a valid model loads with the right views; every missing or inconsistent key and tensor gives an
// InvalidArgument naming it.
#include "common/model/model_config.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "common/model/model_weights.h"
#include "common/tensor/ggml_type.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

using ::testing::HasSubstr;

// What to write. The qwen3moe.* integers are keyed without the prefix; the tensor shapes follow
// from them (so a consistent file results unless `shapes` overrides one).
struct ModelSpec {
  std::string architecture = "qwen3moe";
  std::map<std::string, uint32_t> u32 = {
      {"context_length", 64},
      {"embedding_length", 8},
      {"block_count", 2},
      {"attention.head_count", 4},
      {"attention.head_count_kv", 2},
      {"attention.key_length", 4},
      {"attention.value_length", 4},
      {"expert_count", 4},
      {"expert_used_count", 2},
      {"expert_feed_forward_length", 8},
  };
  int64_t n_vocab = 16;
  bool with_output = false;         // false: tied embeddings
  std::set<std::string> omit_keys;  // full key names
  std::set<std::string> omit_tensors;
  std::map<std::string, std::vector<int64_t>> shapes;                       // overrides
  std::map<std::string, GgmlType> types;                                    // overrides (default f32)
  std::function<void(GgufWriter&)> extra;                                   // more metadata
  std::vector<std::pair<std::string, std::vector<int64_t>>> extra_tensors;  // f32, after the rest

  int64_t Get(const std::string& key) const {
    auto it = u32.find(key);
    return it == u32.end() ? 0 : it->second;
  }
};

std::string TempPath() {
  static int counter = 0;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(::testing::TempDir(), "/model_config_test_", getpid(), "_", info->name(), "_", counter++,
                      ".gguf");
}

// The value of element i of tensor t: lets the tests check that views point at the right bytes.
float Value(size_t t, int64_t i) { return static_cast<float>(t * 1000 + i); }

// Writes `spec` to a new temporary file and returns its path.
std::string WriteModel(const ModelSpec& spec) {
  const std::string path = TempPath();
  GgufWriter w;
  const auto key = [](const std::string& k) { return "qwen3moe." + k; };
  if (!spec.omit_keys.count("general.architecture")) w.AddString("general.architecture", spec.architecture);
  w.AddString("general.name", "tiny test model");
  for (const auto& [k, v] : spec.u32) {
    if (!spec.omit_keys.count(key(k))) w.AddUint32(key(k), v);
  }
  if (!spec.omit_keys.count(key("attention.layer_norm_rms_epsilon")))
    w.AddFloat32(key("attention.layer_norm_rms_epsilon"), 1e-5f);
  if (spec.extra) spec.extra(w);

  const int64_t embd = spec.Get("embedding_length"), head = spec.Get("attention.head_count"),
                head_kv = spec.Get("attention.head_count_kv"), n_exp = spec.Get("expert_count"),
                ff = spec.Get("expert_feed_forward_length"), layers = spec.Get("block_count");
  const int64_t head_dim =
      spec.u32.count("attention.key_length") ? spec.Get("attention.key_length") : embd / std::max<int64_t>(head, 1);
  using S = std::vector<int64_t>;
  std::vector<std::pair<std::string, S>> tensors = {{"token_embd.weight", {embd, spec.n_vocab}},
                                                    {"output_norm.weight", {embd}}};
  if (spec.with_output) tensors.push_back({"output.weight", {embd, spec.n_vocab}});
  for (int64_t il = 0; il < layers; ++il) {
    const std::string b = absl::StrCat("blk.", il, ".");
    tensors.push_back({b + "attn_norm.weight", {embd}});
    tensors.push_back({b + "attn_q.weight", {embd, head * head_dim}});
    tensors.push_back({b + "attn_k.weight", {embd, head_kv * head_dim}});
    tensors.push_back({b + "attn_v.weight", {embd, head_kv * head_dim}});
    tensors.push_back({b + "attn_output.weight", {head * head_dim, embd}});
    tensors.push_back({b + "attn_q_norm.weight", {head_dim}});
    tensors.push_back({b + "attn_k_norm.weight", {head_dim}});
    tensors.push_back({b + "ffn_norm.weight", {embd}});
    tensors.push_back({b + "ffn_gate_inp.weight", {embd, n_exp}});
    tensors.push_back({b + "ffn_gate_exps.weight", {embd, ff, n_exp}});
    tensors.push_back({b + "ffn_up_exps.weight", {embd, ff, n_exp}});
    tensors.push_back({b + "ffn_down_exps.weight", {ff, embd, n_exp}});
  }
  tensors.insert(tensors.end(), spec.extra_tensors.begin(), spec.extra_tensors.end());
  std::vector<GgmlType> types;
  for (auto& [name, shape] : tensors) {
    if (spec.omit_tensors.count(name)) continue;
    if (auto it = spec.shapes.find(name); it != spec.shapes.end()) shape = it->second;
    const auto t = spec.types.find(name);
    types.push_back(t == spec.types.end() ? GgmlType::kF32 : t->second);
    w.AddTensor(name, types.back(), shape);
  }
  EXPECT_TRUE(w.Open(path).ok());
  for (size_t i = 0; i < types.size(); ++i) {
    const uint64_t bytes = w.TensorBytes(static_cast<int>(i));
    std::vector<uint8_t> data(bytes);
    if (types[i] == GgmlType::kF32) {
      for (uint64_t e = 0; e < bytes / 4; ++e) {
        const float v = Value(i, static_cast<int64_t>(e));
        std::memcpy(data.data() + 4 * e, &v, 4);
      }
    }
    EXPECT_TRUE(w.Append(data).ok());
  }
  EXPECT_TRUE(w.Finish().ok());
  return path;
}

struct Loaded {
  std::shared_ptr<const GgufFile> file;
  absl::StatusOr<ModelConfig> config;
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights;
};

Loaded Load(const ModelSpec& spec) {
  const std::string path = WriteModel(spec);
  auto file = GgufFile::Open(path);
  std::remove(path.c_str());  // the mapping stays valid
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {nullptr, file.status(), file.status()};
  std::shared_ptr<const GgufFile> shared(std::move(*file));
  return {shared, ReadModelConfig(*shared), ModelWeights::Load(shared)};
}

template <typename T>
::testing::AssertionResult FailsWith(const absl::StatusOr<T>& v, absl::string_view needle) {
  if (v.ok()) return ::testing::AssertionFailure() << "succeeded, expected an error with '" << needle << "'";
  if (!absl::IsInvalidArgument(v.status())) return ::testing::AssertionFailure() << "wrong code: " << v.status();
  if (!absl::StrContains(v.status().message(), needle))
    return ::testing::AssertionFailure() << "message '" << v.status().message() << "' does not contain '" << needle
                                         << "'";
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------

TEST(ModelConfigTest, ValidMinimalModelLoads) {
  Loaded m = Load(ModelSpec());
  ASSERT_TRUE(m.config.ok()) << m.config.status();
  const ModelConfig& c = *m.config;
  EXPECT_EQ(c.architecture, "qwen3moe");
  EXPECT_EQ(c.name, "tiny test model");
  EXPECT_EQ(c.n_vocab, 16);
  EXPECT_EQ(c.n_ctx_train, 64);
  EXPECT_EQ(c.n_embd, 8);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.n_expert, 4);
  EXPECT_EQ(c.n_expert_used, 2);
  EXPECT_EQ(c.n_ff_exp, 8);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_freq_base, 1e6f);  // absent: the default
  EXPECT_TRUE(c.norm_topk_prob);            // absent: true
  EXPECT_EQ(c.q_dim(), 16);
  EXPECT_EQ(c.kv_dim(), 8);

  ASSERT_TRUE(m.weights.ok()) << m.weights.status();
  const ModelWeights& w = **m.weights;
  EXPECT_EQ(w.config().n_layer, 2);
  EXPECT_EQ(&w.file(), m.file.get());
  EXPECT_EQ(w.shared_file(), m.file);
  const GgufFile& f = *m.file;
  EXPECT_EQ(w.token_embd.type, GgmlType::kF32);
  EXPECT_EQ(w.token_embd.cols, 8);
  EXPECT_EQ(w.token_embd.rows, 16);
  EXPECT_EQ(w.token_embd.data, f.FindTensor("token_embd.weight")->data);
  EXPECT_EQ(w.token_embd.row_bytes(), 32);
  EXPECT_EQ(w.token_embd.row(3), w.token_embd.data + 96);
  EXPECT_EQ(w.output.data, w.token_embd.data);  // tied
  EXPECT_EQ(w.output.rows, 16);
  EXPECT_EQ(w.output_norm[5], Value(1, 5));  // tensor 1, element 5
  ASSERT_EQ(w.layers.size(), 2u);
  const LayerWeights& l = w.layers[1];
  EXPECT_EQ(l.attn_norm, reinterpret_cast<const float*>(f.FindTensor("blk.1.attn_norm.weight")->data));
  EXPECT_EQ(l.wq.cols, 8);
  EXPECT_EQ(l.wq.rows, 16);
  EXPECT_EQ(l.wk.rows, 8);
  EXPECT_EQ(l.wv.rows, 8);
  EXPECT_EQ(l.wo.cols, 16);
  EXPECT_EQ(l.wo.rows, 8);
  EXPECT_EQ(l.q_norm, reinterpret_cast<const float*>(f.FindTensor("blk.1.attn_q_norm.weight")->data));
  EXPECT_EQ(l.k_norm, reinterpret_cast<const float*>(f.FindTensor("blk.1.attn_k_norm.weight")->data));
  EXPECT_EQ(l.ffn_norm, reinterpret_cast<const float*>(f.FindTensor("blk.1.ffn_norm.weight")->data));
  EXPECT_EQ(l.router.rows, 4);
  EXPECT_EQ(l.gate_exps.cols, 8);
  EXPECT_EQ(l.gate_exps.rows, 32);
  EXPECT_EQ(l.up_exps.rows, 32);
  EXPECT_EQ(l.down_exps.cols, 8);
  EXPECT_EQ(l.down_exps.rows, 32);
  EXPECT_EQ(l.down_exps.data, f.FindTensor("blk.1.ffn_down_exps.weight")->data);

  const ExpertWeights e = w.Expert(1, 2);
  EXPECT_EQ(e.gate.rows, 8);
  EXPECT_EQ(e.gate.cols, 8);
  EXPECT_EQ(e.gate.data, l.gate_exps.data + 2 * 8 * 32);
  EXPECT_EQ(e.up.data, l.up_exps.data + 2 * 8 * 32);
  EXPECT_EQ(e.down.rows, 8);
  EXPECT_EQ(e.down.data, l.down_exps.data + 2 * 8 * 32);
  EXPECT_EQ(ExpertBytes(w, 1), 3 * 8 * 32);
}

TEST(ModelConfigTest, UntiedOutputAndOptionalKeys) {
  ModelSpec spec;
  spec.with_output = true;
  spec.u32.erase("attention.key_length");  // head_dim = embedding_length / head_count
  spec.u32.erase("attention.value_length");
  spec.extra = [](GgufWriter& w) {
    w.AddFloat32("qwen3moe.rope.freq_base", 10000.0f);
    w.AddBool("qwen3moe.expert_weights_norm", false);
  };
  Loaded m = Load(spec);
  ASSERT_TRUE(m.config.ok()) << m.config.status();
  EXPECT_EQ(m.config->head_dim, 2);
  EXPECT_FLOAT_EQ(m.config->rope_freq_base, 10000.0f);
  EXPECT_FALSE(m.config->norm_topk_prob);
  ASSERT_TRUE(m.weights.ok()) << m.weights.status();
  EXPECT_EQ((*m.weights)->output.data, m.file->FindTensor("output.weight")->data);
  EXPECT_NE((*m.weights)->output.data, (*m.weights)->token_embd.data);
}

TEST(ModelConfigTest, MissingKeyIsNamed) {
  for (const char* key : {"general.architecture", "qwen3moe.context_length", "qwen3moe.embedding_length",
                          "qwen3moe.block_count", "qwen3moe.attention.head_count", "qwen3moe.attention.head_count_kv",
                          "qwen3moe.expert_count", "qwen3moe.expert_used_count", "qwen3moe.expert_feed_forward_length",
                          "qwen3moe.attention.layer_norm_rms_epsilon"}) {
    SCOPED_TRACE(key);
    ModelSpec spec;
    spec.omit_keys.insert(key);
    Loaded m = Load(spec);
    EXPECT_TRUE(FailsWith(m.config, absl::StrCat("'", key, "' is missing")));
    EXPECT_TRUE(FailsWith(m.weights, absl::StrCat("'", key, "' is missing")));
  }
}

TEST(ModelConfigTest, WrongArchitecture) {
  ModelSpec spec;
  spec.architecture = "llama";
  Loaded m = Load(spec);
  EXPECT_TRUE(FailsWith(m.config, "unsupported model architecture 'llama' (supported: qwen3moe)"));
  EXPECT_TRUE(FailsWith(m.weights, "'llama'"));
}

TEST(ModelConfigTest, HeadCountNotAMultipleOfKvHeads) {
  ModelSpec spec;
  spec.u32["attention.head_count"] = 6;
  spec.u32["attention.head_count_kv"] = 4;
  EXPECT_TRUE(FailsWith(Load(spec).config, "attention.head_count 6 is not a multiple of head_count_kv 4"));
}

TEST(ModelConfigTest, MoreExpertsUsedThanExist) {
  ModelSpec spec;
  spec.u32["expert_used_count"] = 5;
  EXPECT_TRUE(FailsWith(Load(spec).config, "expert_used_count 5 exceeds expert_count 4"));
}

TEST(ModelConfigTest, OutOfRangeAndMistypedKeys) {
  {
    ModelSpec spec;
    spec.u32["block_count"] = 0;
    EXPECT_TRUE(FailsWith(Load(spec).config, "'qwen3moe.block_count' = 0 is out of range"));
  }
  {
    ModelSpec spec;
    spec.u32["attention.head_count"] = 5000;
    EXPECT_TRUE(FailsWith(Load(spec).config, "'qwen3moe.attention.head_count' = 5000 is out of range"));
  }
  {
    ModelSpec spec;
    spec.omit_keys.insert("qwen3moe.embedding_length");  // the shapes still use 8
    spec.extra = [](GgufWriter& w) { w.AddString("qwen3moe.embedding_length", "8"); };
    EXPECT_TRUE(FailsWith(Load(spec).config, "'qwen3moe.embedding_length'"));
  }
  {
    ModelSpec spec;
    spec.u32["attention.value_length"] = 8;
    EXPECT_TRUE(FailsWith(Load(spec).config, "value_length"));
  }
  {
    ModelSpec spec;
    spec.u32["attention.key_length"] = 3;
    spec.u32["attention.value_length"] = 3;
    EXPECT_TRUE(FailsWith(Load(spec).config, "must be even"));
  }
  // Optional keys present with the wrong type are errors, not silently the default.
  {
    ModelSpec spec;
    spec.extra = [](GgufWriter& w) { w.AddString("qwen3moe.rope.freq_base", "1e6"); };
    EXPECT_TRUE(FailsWith(Load(spec).config, "'qwen3moe.rope.freq_base'"));
  }
  {
    ModelSpec spec;
    spec.extra = [](GgufWriter& w) { w.AddUint32("qwen3moe.expert_weights_norm", 1); };
    EXPECT_TRUE(FailsWith(Load(spec).config, "'qwen3moe.expert_weights_norm'"));
  }
  {
    ModelSpec spec;
    spec.extra = [](GgufWriter& w) { w.AddFloat32("qwen3moe.rope.freq_base", 0.5f); };
    EXPECT_TRUE(FailsWith(Load(spec).config, "rope.freq_base must be > 1"));
  }
}

TEST(ModelConfigTest, MissingTensorIsNamed) {
  {
    ModelSpec spec;
    spec.omit_tensors.insert("token_embd.weight");  // read by ReadModelConfig itself (n_vocab)
    Loaded m = Load(spec);
    EXPECT_TRUE(FailsWith(m.config, "tensor 'token_embd.weight' is missing"));
    EXPECT_TRUE(FailsWith(m.weights, "tensor 'token_embd.weight' is missing"));
  }
  for (const char* name : {"output_norm.weight", "blk.0.attn_norm.weight", "blk.1.attn_q.weight",
                           "blk.1.attn_k_norm.weight", "blk.0.ffn_gate_inp.weight", "blk.1.ffn_down_exps.weight"}) {
    SCOPED_TRACE(name);
    ModelSpec spec;
    spec.omit_tensors.insert(name);
    Loaded m = Load(spec);
    EXPECT_TRUE(m.config.ok()) << m.config.status();
    EXPECT_TRUE(FailsWith(m.weights, absl::StrCat("tensor '", name, "' is missing")));
  }
}

TEST(ModelConfigTest, WrongTensorShapeIsNamed) {
  {
    ModelSpec spec;
    spec.shapes["blk.0.ffn_gate_exps.weight"] = {8, 4, 8};  // experts and rows swapped
    EXPECT_TRUE(
        FailsWith(Load(spec).weights, "tensor 'blk.0.ffn_gate_exps.weight' has shape [8, 4, 8], expected [8, 8, 4]"));
  }
  {
    ModelSpec spec;
    spec.shapes["blk.1.attn_k.weight"] = {8, 16};  // q_dim rows instead of kv_dim
    EXPECT_TRUE(FailsWith(Load(spec).weights, "tensor 'blk.1.attn_k.weight' has shape [8, 16], expected [8, 8]"));
  }
  {
    ModelSpec spec;
    spec.shapes["output_norm.weight"] = {8, 1};  // 2-D where 1-D is wanted
    EXPECT_TRUE(FailsWith(Load(spec).weights, "tensor 'output_norm.weight' has shape [8, 1], expected [8]"));
  }
  {
    ModelSpec spec;
    spec.shapes["token_embd.weight"] = {16, 16};
    EXPECT_TRUE(FailsWith(Load(spec).config, "tensor 'token_embd.weight' has the wrong shape"));
  }
}

TEST(ModelConfigTest, NormTensorOfWrongTypeIsNamed) {
  for (GgmlType type : {GgmlType::kF16, GgmlType::kBF16}) {
    ModelSpec spec;
    spec.types["blk.0.attn_norm.weight"] = type;
    EXPECT_TRUE(FailsWith(Load(spec).weights,
                          absl::StrCat("tensor 'blk.0.attn_norm.weight' is ", TypeName(type), ", expected f32")));
  }
  ModelSpec spec;
  spec.types["blk.1.attn_q_norm.weight"] = GgmlType::kF16;
  EXPECT_TRUE(FailsWith(Load(spec).weights, "tensor 'blk.1.attn_q_norm.weight' is f16, expected f32"));
  // Matrices may be of any supported type.
  ModelSpec f16;
  f16.types["blk.0.attn_q.weight"] = GgmlType::kF16;
  f16.types["blk.1.ffn_up_exps.weight"] = GgmlType::kBF16;
  Loaded m = Load(f16);
  ASSERT_TRUE(m.weights.ok()) << m.weights.status();
  EXPECT_EQ((*m.weights)->layers[0].wq.type, GgmlType::kF16);
  EXPECT_EQ((*m.weights)->layers[0].wq.row_bytes(), 16);
}

// Parse()d bytes may start at any address: tensors the kernels read in place as floats must be
// rejected when misaligned rather than handed out as misaligned float pointers.
TEST(ModelConfigTest, MisalignedTensorDataIsRejected) {
  const std::string path = WriteModel(ModelSpec());
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  std::vector<uint8_t> buffer(bytes.size() + 8);
  for (size_t shift : {0, 1, 2, 4}) {
    SCOPED_TRACE(shift);
    std::memcpy(buffer.data() + shift, bytes.data(), bytes.size());
    auto file = GgufFile::Parse(absl::MakeConstSpan(buffer.data() + shift, bytes.size()));
    ASSERT_TRUE(file.ok()) << file.status();
    std::shared_ptr<const GgufFile> shared(std::move(*file));
    EXPECT_TRUE(ReadModelConfig(*shared).ok());
    auto w = ModelWeights::Load(shared);
    if (shift % 4 == 0) {
      EXPECT_TRUE(w.ok()) << w.status();
    } else {
      EXPECT_TRUE(FailsWith(w, "tensor 'token_embd.weight' data is not 4-byte aligned"));
    }
  }
}

// Structurally incoherent files: every one of these used to load (its shapes agree with some
// reading of its metadata) and compute garbage. Each is refused with a message naming what
// disagrees.
TEST(ModelConfigTest, IncoherentMetadataAndTensorsAreRefused) {
  {
    // block_count one short: two layers of tensors, one declared; the second would be ignored.
    ModelSpec spec;
    spec.omit_keys.insert("qwen3moe.block_count");
    spec.extra = [](GgufWriter& w) { w.AddUint32("qwen3moe.block_count", 1); };
    Loaded m = Load(spec);
    EXPECT_TRUE(m.config.ok()) << m.config.status();
    EXPECT_TRUE(FailsWith(m.weights, "tensor 'blk.1.attn_norm.weight' is not part of a 1-layer qwen3moe model"));
  }
  {
    // A tensor of a kind qwen3moe has not (a shared expert's gate).
    ModelSpec spec;
    spec.extra_tensors.push_back({"blk.0.ffn_gate_shexp.weight", {8, 8}});
    EXPECT_TRUE(FailsWith(Load(spec).weights, "tensor 'blk.0.ffn_gate_shexp.weight' is not part of"));
  }
  {
    // RoPE over half of each head: mer (and qwen3moe) rotate every dimension.
    ModelSpec spec;
    spec.extra = [](GgufWriter& w) { w.AddUint32("qwen3moe.rope.dimension_count", 2); };
    EXPECT_TRUE(FailsWith(Load(spec).config, "'qwen3moe.rope.dimension_count' = 2 differs from the head dimension 4"));
    ModelSpec same;
    same.extra = [](GgufWriter& w) { w.AddUint32("qwen3moe.rope.dimension_count", 4); };
    EXPECT_TRUE(Load(same).weights.ok());
  }
  {
    // Shared experts, which the graph would not run.
    ModelSpec spec;
    spec.extra = [](GgufWriter& w) { w.AddUint32("qwen3moe.expert_shared_count", 1); };
    EXPECT_TRUE(FailsWith(Load(spec).config, "expert_shared_count"));
  }
  {
    // A vocabulary of another size than the embeddings: ids past the tokenizer, or tokens past
    // the embeddings.
    ModelSpec spec;
    spec.extra = [](GgufWriter& w) { w.AddStringArray("tokenizer.ggml.tokens", std::vector<std::string>(15, "x")); };
    EXPECT_TRUE(
        FailsWith(Load(spec).config, "tokenizer.ggml.tokens holds 15 tokens but 'token_embd.weight' has 16 rows"));
  }
  {
    // A tensor retyped without moving the next one: its bytes run into its neighbour's.
    ModelSpec spec;
    spec.types["blk.0.attn_q.weight"] = GgmlType::kF16;
    const std::string path = WriteModel(spec);
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::remove(path.c_str());
    // The tensor info: name, n_dims (u32), dims (u64 each), type (u32), offset (u64). f16 (1) -> f32 (0).
    const std::string name = "blk.0.attn_q.weight";
    const size_t at = bytes.find(name);
    ASSERT_NE(at, std::string::npos);
    const size_t type_at = at + name.size() + 4 + 2 * 8;
    ASSERT_EQ(bytes[type_at], 1);
    bytes[type_at] = 0;
    auto file = GgufFile::Parse(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    EXPECT_TRUE(FailsWith(file, "GGUF tensor 'blk.0.attn_q.weight' (f32"));
    EXPECT_TRUE(FailsWith(file, "overlaps tensor 'blk.0.attn_k.weight'"));
  }
}

}  // namespace
}  // namespace mer
