#include "common/store/manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/store/crc32c.h"

namespace mer {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBlob = 12288;

// A valid manifest: 2 layers x 3 experts, n_embd 64, n_ff_exp 32; layer 0 all q8_0, layer 1 with
// an f16 down (so the layers' blobs differ in use).
StoreManifest MakeManifest() {
  StoreManifest m;
  m.n_layer = 2;
  m.n_expert = 3;
  m.n_embd = 64;
  m.n_ff_exp = 32;
  m.layers.resize(2);
  for (int il = 0; il < 2; ++il) {
    StoreLayer& l = m.layers[il];
    l.gate_type = l.up_type = GgmlType::kQ8_0;
    l.down_type = il == 0 ? GgmlType::kQ8_0 : GgmlType::kF16;
    l.gate_bytes = l.up_bytes = 32 * RowBytes(GgmlType::kQ8_0, 64);  // 2176
    l.down_bytes = 64 * RowBytes(l.down_type, 32);
    l.gate_offset = 0;
    l.up_offset = 2176;  // multiple of 64
    l.down_offset = 4352;
  }
  m.blob_bytes = kBlob;  // layer 1 uses 4352 + 4096 bytes
  m.blob_stride = kBlob;
  m.blobs.resize(6);
  for (int i = 0; i < 6; ++i) m.blobs[i] = {static_cast<uint64_t>(i) * kBlob, 0x1000u + i};
  m.experts_bytes = 6 * kBlob;
  m.dense = {123456, 4000, 0xabcdef01u};
  m.dense_crc = 0x12345678u;
  m.source = {999999, 5000, 0x0badf00du};
  m.source_mtime_ns = 1700000000123456789;
  m.source_name = "/models/x.gguf";
  return m;
}

absl::StatusOr<StoreManifest> Parse(const std::string& bytes, bool verify = true) {
  ManifestParseOptions o;
  o.verify_checksums = verify;
  return ParseManifest(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), o);
}

void Put32(std::string& s, size_t off, uint32_t v) { std::memcpy(&s[off], &v, 4); }
void Put64(std::string& s, size_t off, uint64_t v) { std::memcpy(&s[off], &v, 8); }

// Recomputes both checksums after a field was patched, so the parser's other checks are reached.
void Reseal(std::string& s) {
  Put32(s, 16, Crc32c(s.data() + kStoreHeaderBytes, s.size() - kStoreHeaderBytes));
  Put32(s, 12, 0);
  Put32(s, 12, Crc32c(s.data(), kStoreHeaderBytes));
}

TEST(StoreManifest, RoundTrips) {
  const StoreManifest m = MakeManifest();
  const std::string bytes = SerializeManifest(m);
  EXPECT_EQ(bytes.size(), kStoreHeaderBytes + 2 * kStoreLayerBytes + 6 * kStoreBlobEntryBytes + m.source_name.size());
  EXPECT_EQ(bytes.substr(0, 8), "MERSTORE");
  auto p = Parse(bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->version, 1u);
  EXPECT_EQ(p->n_layer, 2u);
  EXPECT_EQ(p->n_expert, 3u);
  EXPECT_EQ(p->n_embd, 64u);
  EXPECT_EQ(p->n_ff_exp, 32u);
  EXPECT_EQ(p->blob_bytes, kBlob);
  EXPECT_EQ(p->blob_stride, kBlob);
  EXPECT_EQ(p->experts_bytes, 6 * kBlob);
  EXPECT_EQ(p->dense.size, 123456u);
  EXPECT_EQ(p->dense.header_bytes, 4000u);
  EXPECT_EQ(p->dense.header_crc, 0xabcdef01u);
  EXPECT_EQ(p->dense_crc, 0x12345678u);
  EXPECT_EQ(p->source.size, 999999u);
  EXPECT_EQ(p->source.header_bytes, 5000u);
  EXPECT_EQ(p->source.header_crc, 0x0badf00du);
  EXPECT_EQ(p->source_mtime_ns, 1700000000123456789);
  EXPECT_EQ(p->source_name, "/models/x.gguf");
  ASSERT_EQ(p->layers.size(), 2u);
  EXPECT_EQ(p->layers[1].down_type, GgmlType::kF16);
  EXPECT_EQ(p->layers[1].down_bytes, 64u * 64);
  EXPECT_EQ(p->layers[0].up_offset, 2176u);
  ASSERT_EQ(p->blobs.size(), 6u);
  EXPECT_EQ(p->blob(1, 2).offset, 5 * kBlob);
  EXPECT_EQ(p->blob(1, 2).crc, 0x1005u);
  EXPECT_EQ(SerializeManifest(*p), bytes);
}

TEST(StoreManifest, EveryFlippedByteIsRefused) {
  const std::string good = SerializeManifest(MakeManifest());
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x10;
    auto p = Parse(bad);
    ASSERT_FALSE(p.ok()) << "byte " << i;
    if (i >= 12) {
      // Past magic and version: a checksum names it.
      EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss) << i << ": " << p.status();
      EXPECT_THAT(p.status().message(), HasSubstr("checksum mismatch")) << i;
    }
  }
}

TEST(StoreManifest, MagicAndVersion) {
  std::string bytes = SerializeManifest(MakeManifest());
  std::string bad = bytes;
  bad[0] = 'X';
  EXPECT_EQ(Parse(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Parse(bad).status().message(), HasSubstr("bad magic"));
  EXPECT_EQ(Parse(std::string("GGUF\3\0\0\0", 8)).status().code(), absl::StatusCode::kInvalidArgument);

  bad = bytes;
  Put32(bad, 8, 2);
  Reseal(bad);  // a well-formed manifest of another version
  EXPECT_EQ(Parse(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Parse(bad).status().message(), HasSubstr("format version 2; this build reads version 1"));
}

TEST(StoreManifest, TruncatedOrExtended) {
  const std::string bytes = SerializeManifest(MakeManifest());
  for (size_t n : {size_t{0}, size_t{7}, size_t{8}, size_t{127}, size_t{128}, size_t{200}, bytes.size() - 1}) {
    auto p = Parse(bytes.substr(0, n));
    ASSERT_FALSE(p.ok()) << n;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss) << n << ": " << p.status();
    EXPECT_THAT(p.status().message(), HasSubstr("truncated")) << n;
  }
  auto p = Parse(bytes + "x");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(p.status().message(), HasSubstr("trailing bytes"));
}

// Checksums that match but fields that do not make sense: InvalidArgument naming the field.
TEST(StoreManifest, RefusesImpossibleStores) {
  struct Case {
    const char* name;
    void (*mutate)(StoreManifest&);
    const char* message;
  };
  const Case cases[] = {
      {"no layers",
       [](StoreManifest& m) {
         m.n_layer = 0;
         m.layers.clear();
         m.blobs.clear();
         m.experts_bytes = 0;
       },
       "n_layer = 0"},
      {"huge n_embd", [](StoreManifest& m) { m.n_embd = 1 << 20; }, "n_embd"},
      {"unaligned blob", [](StoreManifest& m) { m.blob_bytes = 8000; }, "blob size 8000"},
      {"stride below blob",
       [](StoreManifest& m) {
         m.blob_stride = 8192;
         m.experts_bytes = 6 * 8192;
       },
       "blob stride"},
      {"experts size", [](StoreManifest& m) { m.experts_bytes += 4096; }, "experts.bin size"},
      {"bad type", [](StoreManifest& m) { m.layers[0].gate_type = static_cast<GgmlType>(29); },
       "unsupported tensor type 29"},
      {"q8_1 type", [](StoreManifest& m) { m.layers[0].gate_type = GgmlType::kQ8_1; }, "unsupported tensor type 9"},
      {"q8_k type", [](StoreManifest& m) { m.layers[0].gate_type = GgmlType::kQ8_K; }, "unsupported tensor type 15"},
      {"block", [](StoreManifest& m) { m.layers[1].up_type = GgmlType::kQ4_K; }, "not a multiple of the q4_k block"},
      {"matrix size", [](StoreManifest& m) { m.layers[1].down_bytes += 2; }, "layer 1 down is"},
      {"matrix offset", [](StoreManifest& m) { m.layers[0].up_offset = 2180; }, "offset 2180"},
      {"overlap", [](StoreManifest& m) { m.layers[0].up_offset = 2112; }, "not in order"},
      {"past blob", [](StoreManifest& m) { m.layers[1].down_offset = kBlob - 64; }, "not in order"},
      {"huge offset", [](StoreManifest& m) { m.layers[1].down_offset = ~uint64_t{63}; }, "not in order"},
      {"oversized blob",
       [](StoreManifest& m) {
         m.blob_bytes = m.blob_stride = 16384;  // 7936 bytes above the largest expert
         m.experts_bytes = 6 * 16384;
         for (int i = 0; i < 6; ++i) m.blobs[i].offset = i * 16384;
       },
       "more than one block above"},
      {"blob offset", [](StoreManifest& m) { m.blobs[4].offset = 0; }, "blob (layer 1, expert 1) at offset 0"},
      {"dense header", [](StoreManifest& m) { m.dense.header_bytes = m.dense.size + 1; }, "dense.gguf header size"},
      {"source header", [](StoreManifest& m) { m.source.header_bytes = 3; }, "source header size"},
  };
  for (const Case& c : cases) {
    StoreManifest m = MakeManifest();
    c.mutate(m);
    auto p = Parse(SerializeManifest(m));
    ASSERT_FALSE(p.ok()) << c.name;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << p.status();
    EXPECT_THAT(p.status().message(), HasSubstr(c.message)) << c.name;
  }
  // Raw fields SerializeManifest would not write.
  std::string bytes = SerializeManifest(MakeManifest());
  std::string bad = bytes;
  Put32(bad, 20, 256);
  Reseal(bad);
  EXPECT_THAT(Parse(bad).status().message(), HasSubstr("header size 256"));
  bad = bytes;
  bad[125] = 1;
  Reseal(bad);
  EXPECT_THAT(Parse(bad).status().message(), HasSubstr("reserved header byte 125"));
  bad = bytes;
  Put32(bad, kStoreHeaderBytes + 12, 7);
  Reseal(bad);
  EXPECT_THAT(Parse(bad).status().message(), HasSubstr("layer 0: reserved"));
  bad = bytes;
  Put32(bad, 116, 5000);
  Reseal(bad);
  EXPECT_THAT(Parse(bad).status().message(), HasSubstr("source name of 5000 bytes"));
  bad = bytes;
  Put32(bad, 28, 4096);  // n_expert: the tables would be far larger than the file
  Reseal(bad);
  EXPECT_EQ(Parse(bad).status().code(), absl::StatusCode::kInvalidArgument);  // experts.bin size
  Put64(bad, 56, uint64_t{2} * 4096 * kBlob);
  Reseal(bad);
  EXPECT_EQ(Parse(bad).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Parse(bad).status().message(), HasSubstr("truncated"));
}

TEST(StoreManifest, SkippingChecksumsSkipsOnlyThem) {
  std::string bytes = SerializeManifest(MakeManifest());
  bytes[kStoreHeaderBytes + 2 * kStoreLayerBytes + 8] ^= 1;  // a blob CRC: body checksum breaks
  EXPECT_EQ(Parse(bytes).status().code(), absl::StatusCode::kDataLoss);
  auto p = Parse(bytes, /*verify=*/false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->blobs[0].crc, 0x1001u);
}

TEST(StoreManifest, BlobTableCrcCoversOffsetsAndCrcs) {
  StoreManifest m = MakeManifest();
  const uint32_t a = BlobTableCrc(m);
  m.blobs[5].crc ^= 1;
  EXPECT_NE(BlobTableCrc(m), a);
  const std::string bytes = SerializeManifest(MakeManifest());
  const size_t table = kStoreHeaderBytes + 2 * kStoreLayerBytes;
  EXPECT_EQ(a, Crc32c(bytes.data() + table, 6 * kStoreBlobEntryBytes));
}

// Seeds for tests/fuzz/store_manifest_fuzz.cc, written when MER_STORE_CORPUS_DIR names a
// directory:
//   MER_STORE_CORPUS_DIR=tests/fuzz/corpus/store_manifest ./build/bin/store_manifest_test
//       --gtest_filter='*Seed*'
TEST(StoreManifestFuzzSeeds, WriteSeedCorpus) {
  const char* dir = std::getenv("MER_STORE_CORPUS_DIR");
  if (dir == nullptr) GTEST_SKIP() << "set MER_STORE_CORPUS_DIR to write the fuzz seed corpus";
  const auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(std::string(dir) + "/" + name, std::ios::binary) << bytes;
  };
  write("small.seed", SerializeManifest(MakeManifest()));
  StoreManifest one = MakeManifest();
  one.n_layer = 1;
  one.n_expert = 1;
  one.layers.resize(1);
  one.blobs.resize(1);
  one.experts_bytes = kBlob;
  one.source_name.clear();
  write("one_blob.seed", SerializeManifest(one));
  StoreManifest kq = MakeManifest();
  kq.n_embd = 256;
  kq.n_ff_exp = 256;
  for (StoreLayer& l : kq.layers) {
    l.gate_type = l.up_type = GgmlType::kQ4_K;
    l.gate_bytes = l.up_bytes = 256 * RowBytes(GgmlType::kQ4_K, 256);
    l.down_type = GgmlType::kQ6_K;
    l.down_bytes = 256 * RowBytes(GgmlType::kQ6_K, 256);
    l.up_offset = l.gate_bytes;
    l.down_offset = 2 * l.gate_bytes;
  }
  kq.blob_bytes = kq.blob_stride = (kq.layers[0].used_bytes() + 4095) / 4096 * 4096;
  for (int i = 0; i < 6; ++i) kq.blobs[i].offset = i * kq.blob_stride;
  kq.experts_bytes = 6 * kq.blob_stride;
  write("kquants.seed", SerializeManifest(kq));
  std::string bad = SerializeManifest(MakeManifest());
  Put32(bad, 8, 2);
  write("version2.seed", bad);
  write("truncated.seed", SerializeManifest(MakeManifest()).substr(0, 150));
}

}  // namespace
}  // namespace mer
