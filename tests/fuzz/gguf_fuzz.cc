// libFuzzer target for the GGUF reader and the qwen3moe model loader: arbitrary bytes must give
// either a parsed file whose every view lies inside the input, or an error; never a crash, an
// out-of-bounds read (ASan) or undefined behaviour (UBSan).
//
//   ./build-fuzz/bin/gguf_fuzz -max_total_time=60 tests/fuzz/corpus/gguf
//
// The seeds in tests/fuzz/corpus/gguf are written by gguf_file_test (see WriteSeedCorpus there).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"

namespace {

volatile uint64_t g_sink;  // keeps the reads below from being optimized away

void Touch(const mer::GgufValue& v) {
  uint64_t h = static_cast<uint64_t>(v.type()) + v.size();
  if (auto u = v.AsUint64(); u.ok()) h += *u;
  if (auto i = v.AsInt64(); i.ok()) h += static_cast<uint64_t>(*i);
  if (auto d = v.AsFloat64(); d.ok()) h += static_cast<uint64_t>(*d != 0);
  if (auto b = v.AsBool(); b.ok()) h += *b;
  if (auto s = v.AsString(); s.ok() && !s->empty()) h += static_cast<uint8_t>(s->front()) + s->back();
  if (auto ss = v.AsStringArray(); ss.ok()) {
    for (absl::string_view s : *ss) h += s.empty() ? 0 : static_cast<uint8_t>(s.front()) + s.back();
  }
  if (auto ints = v.AsIntArray(); ints.ok()) {
    for (int64_t x : *ints) h += static_cast<uint64_t>(x);
  }
  if (auto fs = v.AsFloatArray(); fs.ok()) {
    for (double x : *fs) h += static_cast<uint64_t>(x == x);
  }
  for (const mer::GgufValue& inner : v.nested()) Touch(inner);
  g_sink = g_sink + h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = mer::GgufFile::Parse(absl::MakeConstSpan(data, size));
  if (!parsed.ok()) return 0;
  // ModelWeights::Load shares ownership of the file; the bytes belong to libFuzzer and outlive it.
  std::shared_ptr<const mer::GgufFile> file(std::move(*parsed));

  for (const mer::GgufMetadataEntry& e : file->metadata()) {
    Touch(e.value);
    // The typed lookups by key as well.
    (void)file->GetUint64(e.key);
    (void)file->GetFloat64(e.key);
    (void)file->GetString(e.key);
    (void)file->GetBool(e.key);
    if (file->FindValue(e.key) == nullptr) __builtin_trap();
  }
  for (const mer::GgufTensorInfo& t : file->tensors()) {
    if (t.size_bytes == 0 || t.data == nullptr || t.rows() <= 0) __builtin_trap();
    g_sink = g_sink + t.data[0] + t.data[t.size_bytes - 1];
    if (file->FindTensor(t.name) == nullptr) __builtin_trap();
  }

  if (auto config = mer::ReadModelConfig(*file); config.ok()) {
    g_sink = g_sink + static_cast<uint64_t>(config->q_dim()) + config->kv_dim();
  }
  if (auto weights = mer::ModelWeights::Load(file); weights.ok()) {
    const mer::ModelWeights& w = **weights;
    const auto touch = [](const mer::MatrixView& m) {
      const uint8_t* last = m.row(m.rows - 1) + m.row_bytes() - 1;
      g_sink = g_sink + m.data[0] + *last;
    };
    touch(w.token_embd);
    touch(w.output);
    g_sink = g_sink + static_cast<uint64_t>(w.output_norm[w.config().n_embd - 1] != 0);
    for (int il = 0; il < static_cast<int>(w.layers.size()); ++il) {
      const mer::LayerWeights& l = w.layers[il];
      for (const mer::MatrixView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.router, &l.gate_exps, &l.up_exps, &l.down_exps})
        touch(*m);
      g_sink = g_sink + static_cast<uint64_t>(l.attn_norm[0] + l.q_norm[w.config().head_dim - 1] + l.k_norm[0] +
                                                  l.ffn_norm[w.config().n_embd - 1] !=
                                              0);
      const mer::ExpertWeights e = w.Expert(il, w.config().n_expert - 1);
      touch(e.gate);
      touch(e.up);
      touch(e.down);
      g_sink = g_sink + static_cast<uint64_t>(mer::ExpertBytes(w, il));
    }
  }
  return 0;
}
