// `mer synth --store-out` (WriteSynthStore) against `mer synth --out` then `mer pack`: the same
// experts.bin and dense.gguf byte for byte, the same manifest but for the source's mtime and name
// (its size and header checksum are those of the file it never writes), a store that opens and
// verifies, and the same refusals as the packer.
#include "common/store/synth_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/store/expert_store.h"
#include "common/store/packer.h"

namespace mer {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class SynthStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mer_synth_store_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

struct Variant {
  const char* preset;
  SynthQuant quant;
  double skew;
};

TEST_F(SynthStoreTest, EqualsPackOfTheSynthesizedFile) {
  for (const Variant& v : {Variant{"micro", SynthQuant::kQ8_0, 0.5}, Variant{"micro", SynthQuant::kF16, 0.0},
                           Variant{"tiny", SynthQuant::kQ4_K, 0.3}}) {
    SCOPED_TRACE(std::string(v.preset) + " " + std::to_string(static_cast<int>(v.quant)));
    SynthOptions o;
    o.geometry = *SynthPreset(v.preset);
    o.quant = v.quant;
    o.router_skew = v.skew;
    o.seed = 5;
    o.threads = 2;
    const fs::path gguf = dir_ / "m.gguf", packed = dir_ / "packed", synthesized = dir_ / "synth";
    ASSERT_TRUE(WriteSynthModel(o, gguf.string()).ok());
    PackOptions po;
    po.threads = 2;
    po.overwrite = true;
    ASSERT_TRUE(PackExpertStore(gguf.string(), packed.string(), po).ok());
    int progress_calls = 0;
    po.progress = [&](int done, int n) {
      ++progress_calls;
      EXPECT_EQ(done, progress_calls);
      EXPECT_EQ(n, o.geometry.n_layer);
    };
    auto stats = WriteSynthStore(o, synthesized.string(), po);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(progress_calls, o.geometry.n_layer);
    for (const char* f : {kStoreExpertsFile, kStoreDenseFile})
      EXPECT_TRUE(Slurp(packed / f) == Slurp(synthesized / f)) << f << " differs";

    auto a = ExpertStore::Open(packed.string());
    auto b = ExpertStore::Open(synthesized.string());
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    const StoreManifest& ma = (*a)->manifest();
    const StoreManifest& mb = (*b)->manifest();
    EXPECT_EQ(mb.source.size, fs::file_size(gguf));
    EXPECT_EQ(mb.source.size, ma.source.size);
    EXPECT_EQ(mb.source.header_bytes, ma.source.header_bytes);
    EXPECT_EQ(mb.source.header_crc, ma.source.header_crc);
    EXPECT_EQ(mb.source_mtime_ns, 0);
    EXPECT_THAT(mb.source_name, ::testing::HasSubstr("mer synth"));
    // With the source's mtime and name made equal, the manifests are the same bytes.
    StoreManifest same = mb;
    same.source_mtime_ns = ma.source_mtime_ns;
    same.source_name = ma.source_name;
    EXPECT_TRUE(SerializeManifest(same) == SerializeManifest(ma));
    EXPECT_EQ(stats->blob_count, ma.blobs.size());
    EXPECT_EQ(stats->experts_bytes, ma.experts_bytes);
    EXPECT_TRUE((*b)->VerifyAll().ok());
    EXPECT_TRUE((*b)->LoadDenseWeights().ok());
    // The store does not claim the GGUF as its source: its mtime differs (and `mer up --model`
    // would pack again).
    EXPECT_FALSE((*b)->CheckSource(gguf.string()).ok());
    fs::remove_all(packed);
    fs::remove_all(synthesized);
  }
}

TEST_F(SynthStoreTest, RefusesAnExistingStoreAndABadGeometry) {
  SynthOptions o;
  o.geometry = *SynthPreset("micro");
  o.threads = 2;
  const std::string out = (dir_ / "s").string();
  ASSERT_TRUE(WriteSynthStore(o, out).ok());
  EXPECT_EQ(WriteSynthStore(o, out).status().code(), absl::StatusCode::kAlreadyExists);
  PackOptions po;
  po.overwrite = true;
  EXPECT_TRUE(WriteSynthStore(o, out, po).ok());
  o.geometry.n_embd = 40;  // not a multiple of 32
  EXPECT_EQ(WriteSynthStore(o, (dir_ / "bad").string()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mer
