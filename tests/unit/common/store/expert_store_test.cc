// The expert store end to end: pack synthetic models, read them back, run the CPU engine on
// them, and refuse every kind of damaged or mismatched store.
#include "common/store/expert_store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "tests/unit/process_temp_dir.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/model/model_tokenizer.h"
#include "common/model/synth_model.h"
#include "common/store/crc32c.h"
#include "common/store/packer.h"
#include "common/store/store_expert_source.h"
#include "services/compute/cpu/cpu_engine.h"

namespace mer {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path TempRoot() { return testing_support::ProcessTempDir("mer_store_test_"); }

SynthOptions Geometry(SynthQuant quant, uint64_t seed = 7) {
  SynthOptions o;
  o.geometry = *SynthPreset("micro");
  if (quant == SynthQuant::kQ4_K) {  // K-quant rows need multiples of 256
    o.geometry.n_embd = 256;
    o.geometry.n_ff_exp = 256;
  }
  if (quant == SynthQuant::kQ3_K_M) {  // ffn_down rows of 128: q5_0, beside q3_k gate and up
    o.geometry.n_embd = 256;
    o.geometry.n_ff_exp = 128;
  }
  o.quant = quant;
  o.seed = seed;
  o.threads = 2;
  return o;
}

// A synthetic model and its packed store, made once per (quant, seed) and shared by the tests.
struct Packed {
  std::string gguf;
  std::string store;
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<ModelWeights> weights;
};

const Packed& GetPacked(SynthQuant quant, uint64_t seed = 7) {
  static std::map<std::pair<int, uint64_t>, Packed>* cache = new std::map<std::pair<int, uint64_t>, Packed>;
  const auto key = std::make_pair(static_cast<int>(quant), seed);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  Packed p;
  const std::string tag = std::to_string(static_cast<int>(quant)) + "_" + std::to_string(seed);
  p.gguf = (TempRoot() / ("model_" + tag + ".gguf")).string();
  p.store = (TempRoot() / ("store_" + tag)).string();
  EXPECT_TRUE(WriteSynthModel(Geometry(quant, seed), p.gguf).ok());
  PackOptions o;
  o.threads = 2;
  auto stats = PackExpertStore(p.gguf, p.store, o);
  EXPECT_TRUE(stats.ok()) << stats.status();
  auto file = GgufFile::Open(p.gguf);
  EXPECT_TRUE(file.ok()) << file.status();
  p.file = std::move(*file);
  auto w = ModelWeights::Load(p.file);
  EXPECT_TRUE(w.ok()) << w.status();
  p.weights = std::move(*w);
  return cache->emplace(key, std::move(p)).first->second;
}

// A copy of a packed store that a test may damage.
std::string CopyStore(const Packed& p, const std::string& name) {
  const fs::path dst = TempRoot() / name;
  fs::remove_all(dst);
  fs::copy(p.store, dst);
  return dst.string();
}

void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  c ^= 0x40;
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(c);
}

std::unique_ptr<ExpertStore> OpenOk(const std::string& dir) {
  auto s = ExpertStore::Open(dir);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::string Bytes(const MatrixView& m) {
  return std::string(reinterpret_cast<const char*>(m.data), m.rows * m.row_bytes());
}

class StoreTest : public ::testing::TestWithParam<SynthQuant> {};

TEST_P(StoreTest, EveryExpertViewEqualsTheModelsExpert) {
  const Packed& p = GetPacked(GetParam());
  std::unique_ptr<ExpertStore> store = OpenOk(p.store);
  ASSERT_NE(store, nullptr);
  const ModelConfig& c = p.weights->config();
  ASSERT_EQ(store->n_layer(), c.n_layer);
  ASSERT_EQ(store->n_expert(), c.n_expert);
  EXPECT_EQ(store->blob_bytes() % 4096, 0u);
  uint64_t max_expert = 0;
  for (int il = 0; il < c.n_layer; ++il) max_expert = std::max<uint64_t>(max_expert, ExpertBytes(*p.weights, il));
  EXPECT_GE(store->blob_bytes(), max_expert);
  EXPECT_LT(store->blob_bytes(), max_expert + 3 * 64 + 4096);
  EXPECT_EQ(fs::file_size(store->experts_path()), c.n_layer * c.n_expert * store->blob_bytes());

  AlignedBuffer buf = AllocateAligned(store->blob_bytes());
  for (int il = 0; il < c.n_layer; ++il) {
    for (int e = 0; e < c.n_expert; ++e) {
      EXPECT_EQ(store->BlobOffset(il, e) % 4096, 0u);
      ASSERT_TRUE(store->ReadBlob(il, e, buf.get()).ok());
      const ExpertWeights got = store->ExpertView(il, e, buf.get());
      const ExpertWeights want = p.weights->Expert(il, e);
      for (auto [g, w, name] : {std::tuple{got.gate, want.gate, "gate"}, std::tuple{got.up, want.up, "up"},
                                std::tuple{got.down, want.down, "down"}}) {
        EXPECT_EQ(g.type, w.type) << name;
        EXPECT_EQ(g.cols, w.cols) << name;
        EXPECT_EQ(g.rows, w.rows) << name;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(g.data) % 64, 0u);
        EXPECT_TRUE(Bytes(g) == Bytes(w)) << "layer " << il << " expert " << e << " " << name;
      }
      // Padding is zero, so a blob's CRC does not depend on leftovers of a buffer.
      const StoreLayer& l = store->manifest().layers[il];
      for (uint64_t i = l.used_bytes(); i < store->blob_bytes(); ++i) ASSERT_EQ(buf[i], 0) << i;
    }
  }
}

TEST_P(StoreTest, DenseGgufHasEveryDenseTensorAndAllMetadata) {
  const Packed& p = GetPacked(GetParam());
  std::unique_ptr<ExpertStore> store = OpenOk(p.store);
  ASSERT_NE(store, nullptr);
  auto dense = store->LoadDenseWeights();
  ASSERT_TRUE(dense.ok()) << dense.status();
  const ModelWeights& d = **dense;
  const ModelConfig& a = p.weights->config();
  const ModelConfig& b = d.config();
  EXPECT_EQ(a.n_vocab, b.n_vocab);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.n_expert_used, b.n_expert_used);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_freq_base, b.rope_freq_base);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(d.layers[0].gate_exps.data, nullptr);

  const GgufFile& src = *p.file;
  const GgufFile& dst = d.file();
  int dense_tensors = 0;
  for (const GgufTensorInfo& t : src.tensors()) {
    const GgufTensorInfo* u = dst.FindTensor(t.name);
    if (t.name.find("_exps.weight") != absl::string_view::npos) {
      EXPECT_EQ(u, nullptr) << t.name;
      continue;
    }
    ++dense_tensors;
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(u->type, t.type);
    EXPECT_EQ(u->shape, t.shape);
    ASSERT_EQ(u->size_bytes, t.size_bytes);
    EXPECT_EQ(std::memcmp(u->data, t.data, t.size_bytes), 0) << t.name;
  }
  EXPECT_EQ(static_cast<int>(dst.tensors().size()), dense_tensors);
  EXPECT_EQ(dense_tensors, 3 + 9 * a.n_layer);

  for (const GgufMetadataEntry& e : src.metadata()) {
    const GgufValue* v = dst.FindValue(e.key);
    ASSERT_NE(v, nullptr) << e.key;
    if (auto s = e.value.AsString(); s.ok()) {
      EXPECT_EQ(*v->AsString(), *s) << e.key;
    }
    if (auto u = e.value.AsUint64(); u.ok()) {
      EXPECT_EQ(*v->AsUint64(), *u) << e.key;
    }
    if (auto f = e.value.AsFloat64(); f.ok()) {
      EXPECT_EQ(*v->AsFloat64(), *f) << e.key;
    }
    if (auto x = e.value.AsBool(); x.ok()) {
      EXPECT_EQ(*v->AsBool(), *x) << e.key;
    }
    if (auto ss = e.value.AsStringArray(); ss.ok()) {
      EXPECT_EQ(*v->AsStringArray(), *ss) << e.key;
    }
    if (auto is = e.value.AsIntArray(); is.ok()) {
      EXPECT_EQ(*v->AsIntArray(), *is) << e.key;
    }
    if (auto fs = e.value.AsFloatArray(); fs.ok()) {
      EXPECT_EQ(*v->AsFloatArray(), *fs) << e.key;
    }
  }
  EXPECT_EQ(dst.metadata().size(), src.metadata().size() + 1);  // + mer.store.blob_table_crc
  EXPECT_EQ(*dst.GetUint64(kDenseBlobTableCrcKey), BlobTableCrc(store->manifest()));

  // The tokenizer reads it as it reads the model.
  auto t1 = LoadTokenizer(src);
  auto t2 = LoadTokenizer(dst);
  ASSERT_TRUE(t1.ok() && t2.ok());
  EXPECT_EQ(t1->vocab_size(), t2->vocab_size());
  EXPECT_EQ(t1->Encode("Hello, expert store!"), t2->Encode("Hello, expert store!"));
}

TEST_P(StoreTest, EngineOnTheStoreGivesTheSameLogits) {
  const Packed& p = GetPacked(GetParam());
  std::unique_ptr<ExpertStore> store = OpenOk(p.store);
  ASSERT_NE(store, nullptr);
  auto dense = store->LoadDenseWeights();
  ASSERT_TRUE(dense.ok()) << dense.status();
  CpuEngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 16;
  o.max_context_tokens = 64;
  MappedExpertSource mapped(*p.weights);
  StoreExpertSource from_store(*store);
  auto e1 = CpuEngine::Create(*p.weights, mapped, o);
  auto e2 = CpuEngine::Create(**dense, from_store, o);
  ASSERT_TRUE(e1.ok() && e2.ok());
  const std::vector<int32_t> tokens = {5, 17, 250, 3, 99, 42, 42, 7, 1, 120};
  const int V = p.weights->config().n_vocab;
  // A prompt chunk, then single tokens.
  std::vector<BatchToken> batch;
  for (int i = 0; i < 6; ++i) batch.push_back({tokens[i], i, 0, true});
  std::vector<float> l1(6 * V), l2(6 * V);
  ASSERT_TRUE((*e1)->Forward(batch, l1.data()).ok());
  ASSERT_TRUE((*e2)->Forward(batch, l2.data()).ok());
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0);
  for (int i = 6; i < static_cast<int>(tokens.size()); ++i) {
    const BatchToken b{tokens[i], i, 0, true};
    ASSERT_TRUE((*e1)->Forward(absl::MakeConstSpan(&b, 1), l1.data()).ok());
    ASSERT_TRUE((*e2)->Forward(absl::MakeConstSpan(&b, 1), l2.data()).ok());
    EXPECT_EQ(std::memcmp(l1.data(), l2.data(), V * sizeof(float)), 0) << "position " << i;
  }
  EXPECT_GT(from_store.blobs_read(), 0u);
}

TEST_P(StoreTest, VerifyAllAndSourceIdentity) {
  const Packed& p = GetPacked(GetParam());
  std::unique_ptr<ExpertStore> store = OpenOk(p.store);
  ASSERT_NE(store, nullptr);
  uint64_t progress = 0;
  StoreVerifyOptions o;
  o.threads = 2;
  o.progress = [&](uint64_t done, uint64_t total) {
    progress = done;
    EXPECT_LE(done, total);
  };
  auto v = store->VerifyAll(o);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->blobs, static_cast<uint64_t>(store->n_layer() * store->n_expert()));
  EXPECT_EQ(v->bytes, store->manifest().experts_bytes + store->manifest().dense.size);
  EXPECT_EQ(progress, v->bytes);

  EXPECT_TRUE(store->CheckSource(p.gguf).ok()) << store->CheckSource(p.gguf);
  EXPECT_EQ(store->manifest().source_name, p.gguf);
  EXPECT_EQ(store->manifest().source.size, fs::file_size(p.gguf));
  const Packed& other = GetPacked(GetParam() == SynthQuant::kQ8_0 ? SynthQuant::kF16 : SynthQuant::kQ8_0);
  const absl::Status s = store->CheckSource(other.gguf);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("is not the file"));
}

INSTANTIATE_TEST_SUITE_P(Quants, StoreTest,
                         ::testing::Values(SynthQuant::kQ8_0, SynthQuant::kF16, SynthQuant::kQ4_K, SynthQuant::kQ3_K_M),
                         [](const auto& info) {
                           switch (info.param) {
                             case SynthQuant::kQ8_0:
                               return std::string("Q8_0");
                             case SynthQuant::kF16:
                               return std::string("F16");
                             case SynthQuant::kQ3_K_M:
                               return std::string("Q3_K_M");
                             default:
                               return std::string("Q4_K_M");
                           }
                         });

TEST(ExpertStore, Q3KMStoreHasTypesOfDifferentActivationsInALayer) {
  std::unique_ptr<ExpertStore> store = OpenOk(GetPacked(SynthQuant::kQ3_K_M).store);
  ASSERT_NE(store, nullptr);
  for (const auto& layer : store->manifest().layers) {
    EXPECT_EQ(layer.gate_type, GgmlType::kQ3_K);
    EXPECT_EQ(layer.up_type, GgmlType::kQ3_K);
    EXPECT_EQ(layer.down_type, GgmlType::kQ5_0);
  }
}

TEST(ExpertStore, Q4KMStoreHasPerLayerTypes) {
  std::unique_ptr<ExpertStore> store = OpenOk(GetPacked(SynthQuant::kQ4_K).store);
  ASSERT_NE(store, nullptr);
  const auto& layers = store->manifest().layers;
  EXPECT_EQ(layers[0].down_type, GgmlType::kQ6_K);
  EXPECT_EQ(layers[1].down_type, GgmlType::kQ4_K);
  EXPECT_EQ(layers[0].gate_type, GgmlType::kQ4_K);
  EXPECT_GT(layers[0].used_bytes(), layers[1].used_bytes());
}

// --- Damaged and mismatched stores ----------------------------------------------------------

TEST(ExpertStore, MissingFiles) {
  const std::string dir = CopyStore(GetPacked(SynthQuant::kQ8_0), "missing");
  auto s = ExpertStore::Open((TempRoot() / "no_such_store").string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  fs::remove(dir + "/experts.bin");
  s = ExpertStore::Open(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("experts.bin"));
}

TEST(ExpertStore, TruncatedExpertsBin) {
  const std::string dir = CopyStore(GetPacked(SynthQuant::kQ8_0), "truncated");
  const uint64_t size = fs::file_size(dir + "/experts.bin");
  fs::resize_file(dir + "/experts.bin", size - 4096);
  auto s = ExpertStore::Open(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("experts.bin is"));
  EXPECT_THAT(s.status().message(), HasSubstr("truncated"));
  fs::resize_file(dir + "/experts.bin", size + 4096);
  s = ExpertStore::Open(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
}

TEST(ExpertStore, WrongManifestVersion) {
  const std::string dir = CopyStore(GetPacked(SynthQuant::kQ8_0), "version");
  {
    std::fstream f(dir + "/manifest", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const char v2[4] = {2, 0, 0, 0};
    f.write(v2, 4);
  }
  auto s = ExpertStore::Open(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("manifest"));
  EXPECT_THAT(s.status().message(), HasSubstr("format version 2; this build reads version 1"));
}

TEST(ExpertStore, FlippedByteInTheManifest) {
  const std::string dir = CopyStore(GetPacked(SynthQuant::kQ8_0), "manifest_flip");
  FlipByte(dir + "/manifest", 30);  // n_expert, in the header
  auto s = ExpertStore::Open(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("header checksum mismatch"));
  FlipByte(dir + "/manifest", 30);
  FlipByte(dir + "/manifest", fs::file_size(dir + "/manifest") - 40);  // the blob table
  s = ExpertStore::Open(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("table checksum mismatch"));
}

TEST(ExpertStore, FlippedByteInABlob) {
  const Packed& p = GetPacked(SynthQuant::kQ8_0);
  const std::string dir = CopyStore(p, "blob_flip");
  uint64_t offset;
  {
    std::unique_ptr<ExpertStore> store = OpenOk(dir);
    ASSERT_NE(store, nullptr);
    offset = store->BlobOffset(1, 3) + 100;
  }
  FlipByte(dir + "/experts.bin", offset);
  std::unique_ptr<ExpertStore> store = OpenOk(dir);  // contents are checked when read
  ASSERT_NE(store, nullptr);

  auto v = store->VerifyAll();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(v.status().message(), HasSubstr("1 of 16 blobs fail their checksum: (layer 1, expert 3)"));

  AlignedBuffer buf = AllocateAligned(store->blob_bytes());
  EXPECT_TRUE(store->ReadBlob(1, 2, buf.get()).ok());
  absl::Status s = store->ReadBlob(1, 3, buf.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("blob (layer 1, expert 3)"));
  s = store->VerifyBlob(1, 3, buf.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("(layer 1, expert 3)"));

  StoreExpertSource source(*store);
  std::vector<ExpertWeights> out(2);
  const int32_t good[] = {0, 2};
  EXPECT_TRUE(source.AcquireLayer(1, good, absl::MakeSpan(out)).ok());
  source.ReleaseLayer(1);
  const int32_t bad[] = {0, 3};
  s = source.AcquireLayer(1, bad, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("(layer 1, expert 3)"));
  source.ReleaseLayer(1);
  const int32_t out_of_range[] = {8};
  EXPECT_EQ(source.AcquireLayer(0, out_of_range, absl::MakeSpan(out)).code(), absl::StatusCode::kInvalidArgument);

  // The engine passes the error on when a token is routed to the damaged expert.
  auto dense = store->LoadDenseWeights();
  ASSERT_TRUE(dense.ok());
  CpuEngineOptions o;
  o.threads = 1;
  o.max_batch_tokens = 64;
  o.max_context_tokens = 64;
  StoreExpertSource engine_source(*store);
  auto engine = CpuEngine::Create(**dense, engine_source, o);
  ASSERT_TRUE(engine.ok());
  std::vector<BatchToken> batch;
  for (int i = 0; i < 64; ++i) batch.push_back({(i * 37) % 300, i, 0, false});
  std::vector<float> logits(300);
  s = (*engine)->Forward(batch, logits.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("(layer 1, expert 3)"));
}

TEST(ExpertStore, MismatchedDenseGguf) {
  // Another model's dense.gguf: of another size (f16 vs q8_0) ...
  const std::string dir = CopyStore(GetPacked(SynthQuant::kQ8_0), "dense_size");
  fs::copy_file(GetPacked(SynthQuant::kF16).store + "/dense.gguf", dir + "/dense.gguf",
                fs::copy_options::overwrite_existing);
  auto s = ExpertStore::Open(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("not this store's dense.gguf"));

  // ... or of the same size and metadata, from a model with other weights (another seed): its
  // header carries the other store's blob-table fingerprint.
  const std::string dir2 = CopyStore(GetPacked(SynthQuant::kQ8_0), "dense_seed");
  fs::copy_file(GetPacked(SynthQuant::kQ8_0, 8).store + "/dense.gguf", dir2 + "/dense.gguf",
                fs::copy_options::overwrite_existing);
  ASSERT_EQ(fs::file_size(dir2 + "/dense.gguf"), fs::file_size(GetPacked(SynthQuant::kQ8_0).store + "/dense.gguf"));
  s = ExpertStore::Open(dir2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("header checksum"));

  // A flipped byte in its tensor data: only a full verification reads that far.
  const std::string dir3 = CopyStore(GetPacked(SynthQuant::kQ8_0), "dense_flip");
  FlipByte(dir3 + "/dense.gguf", fs::file_size(dir3 + "/dense.gguf") - 100);
  std::unique_ptr<ExpertStore> store = OpenOk(dir3);
  ASSERT_NE(store, nullptr);
  auto v = store->VerifyAll();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(v.status().message(), HasSubstr("dense.gguf: checksum"));
  // Loading it checks every byte too: the daemons never serve a damaged dense.gguf.
  auto w = store->LoadDenseWeights();
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(w.status().message(), HasSubstr("dense.gguf: checksum"));
  EXPECT_THAT(w.status().message(), HasSubstr("mer pack --force"));
}

TEST(ExpertStore, PackRefusesToOverwriteUnlessAsked) {
  const Packed& p = GetPacked(SynthQuant::kQ8_0);
  const std::string dir = CopyStore(p, "overwrite");
  PackOptions o;
  o.threads = 2;
  auto s = PackExpertStore(p.gguf, dir, o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kAlreadyExists);
  o.overwrite = true;
  o.direct_io = false;  // the buffered path, too
  int calls = 0;
  o.progress = [&](int done, int n) {
    ++calls;
    EXPECT_EQ(done, calls);
    EXPECT_EQ(n, 2);
  };
  s = PackExpertStore(p.gguf, dir, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->direct_io);
  EXPECT_EQ(calls, 2);
  // Same input, same bytes.
  for (const char* f : {"/experts.bin", "/dense.gguf", "/manifest"}) {
    std::ifstream a(p.store + f, std::ios::binary), b(dir + f, std::ios::binary);
    const std::string x((std::istreambuf_iterator<char>(a)), {}), y((std::istreambuf_iterator<char>(b)), {});
    EXPECT_TRUE(x == y) << f;
  }
  EXPECT_FALSE(fs::exists(dir + "/manifest.tmp"));
}

std::vector<std::string> Staging(const std::string& dir) {
  std::vector<std::string> found;
  const fs::path p(dir);
  for (const auto& e : fs::directory_iterator(p.parent_path())) {
    if (e.path().filename().string().rfind("." + p.filename().string() + ".pack-", 0) == 0)
      found.push_back(e.path().string());
  }
  return found;
}

TEST(ExpertStore, RepackReplacesTheStoreAtOnceAndOpenFilesKeepTheOld) {
  const Packed& a = GetPacked(SynthQuant::kQ8_0);
  const Packed& b = GetPacked(SynthQuant::kQ8_0, 8);
  const std::string dir = CopyStore(a, "repack");
  std::unique_ptr<ExpertStore> old_store = OpenOk(dir);
  ASSERT_NE(old_store, nullptr);
  AlignedBuffer buf = AllocateAligned(old_store->blob_bytes());
  ASSERT_TRUE(old_store->ReadBlob(1, 3, buf.get()).ok());

  PackOptions o;
  o.threads = 2;
  o.overwrite = true;
  ASSERT_TRUE(PackExpertStore(b.gguf, dir, o).ok());
  // A reader of the old store (a live mer-residency) still reads the old, intact blobs.
  EXPECT_TRUE(old_store->ReadBlob(1, 3, buf.get()).ok());
  // The directory is the new store, whole; nothing is left beside it.
  std::unique_ptr<ExpertStore> new_store = OpenOk(dir);
  ASSERT_NE(new_store, nullptr);
  EXPECT_NE(new_store->BlobCrc(1, 3), old_store->BlobCrc(1, 3));
  EXPECT_TRUE(new_store->VerifyAll().ok());
  EXPECT_TRUE(new_store->CheckSource(b.gguf).ok());
  EXPECT_TRUE(Staging(dir).empty());
}

TEST(ExpertStore, PackKilledMidwayLeavesTheStoreIntact) {
  const Packed& a = GetPacked(SynthQuant::kQ8_0);
  const Packed& b = GetPacked(SynthQuant::kQ8_0, 8);
  const std::string dir = CopyStore(a, "killed");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The pack dies after its first layer of experts, as a SIGKILL would leave it: no cleanup.
    PackOptions o;
    o.threads = 1;
    o.overwrite = true;
    o.progress = [](int, int) { _exit(3); };
    (void)PackExpertStore(b.gguf, dir, o);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  // The store is the old one, whole.
  std::unique_ptr<ExpertStore> store = OpenOk(dir);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->VerifyAll().ok());
  EXPECT_TRUE(store->CheckSource(a.gguf).ok());
  ASSERT_EQ(Staging(dir).size(), 1u);  // the dead pack's staging directory
  // The next pack removes it (its writer is gone) and replaces the store.
  PackOptions o;
  o.threads = 2;
  o.overwrite = true;
  ASSERT_TRUE(PackExpertStore(b.gguf, dir, o).ok());
  EXPECT_TRUE(Staging(dir).empty());
  store = OpenOk(dir);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->CheckSource(b.gguf).ok());
}

TEST(ExpertStore, IncompleteStoreIsNamedAsSuch) {
  // What an older mer's interrupted pack left: the files, no manifest.
  const std::string dir = CopyStore(GetPacked(SynthQuant::kQ8_0), "incomplete");
  fs::remove(dir + "/manifest");
  auto s = ExpertStore::Open(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("incomplete store (interrupted pack)"));
  EXPECT_THAT(s.status().message(), HasSubstr("mer pack --force"));
  // A first pack killed before it published: no directory, its staging directory beside.
  const std::string fresh = (TempRoot() / "never_published").string();
  fs::create_directories(TempRoot() / ".never_published.pack-999999999-abcdef");
  s = ExpertStore::Open(fresh);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("interrupted pack"));
  fs::remove(TempRoot() / ".never_published.pack-999999999-abcdef");
  // A directory holding something else is never packed over.
  const std::string other = (TempRoot() / "other_files").string();
  fs::create_directories(other);
  std::ofstream(other + "/notes.txt") << "mine";
  PackOptions o;
  o.overwrite = true;
  auto p = PackExpertStore(GetPacked(SynthQuant::kQ8_0).gguf, other, o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(fs::exists(other + "/notes.txt"));
}

TEST(ExpertStore, PackRefusesAModelWithoutExperts) {
  const Packed& p = GetPacked(SynthQuant::kQ8_0);
  auto s = PackExpertStore(p.store + "/dense.gguf", (TempRoot() / "from_dense").string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("ffn_gate_exps"));
}

}  // namespace
}  // namespace mer

// Removes the temporary models and stores.
class CleanupEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { std::filesystem::remove_all(mer::TempRoot()); }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new CleanupEnvironment);
