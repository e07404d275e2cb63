// Tests of the GGUF reader (GgufFile) and writer (GgufWriter): round trips of every value type,
// versions 2 and 3, alignments, and the malformed inputs the reader must reject with an
// InvalidArgument that names the problem. Format: docs/gguf.md.
#include "common/gguf/gguf_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/gguf/gguf_writer.h"
#include "common/tensor/ggml_type.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"

// ---------------------------------------------------------------------------------------------
// Hand-built files.

// Little-endian byte accumulator (the test host is little-endian, as mer requires).
struct Bytes {
  std::vector<uint8_t> b;

  template <typename T>
  Bytes& Put(T v) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
    return *this;
  }
  Bytes& U8(uint8_t v) { return Put(v); }
  Bytes& U32(uint32_t v) { return Put(v); }
  Bytes& U64(uint64_t v) { return Put(v); }
  Bytes& Str(absl::string_view s) {
    U64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& Append(const Bytes& other) {
    b.insert(b.end(), other.b.begin(), other.b.end());
    return *this;
  }
  Bytes& PadTo(uint64_t alignment) {
    while (b.size() % alignment != 0) b.push_back(0);
    return *this;
  }
};

uint32_t T(GgufValueType t) { return static_cast<uint32_t>(t); }
uint32_t T(GgmlType t) { return static_cast<uint32_t>(t); }

// Builds a GGUF file byte by byte, so that every field can be set to any value.
class FileBuilder {
 public:
  uint32_t magic = kMagic;
  uint32_t version = 3;
  std::optional<uint64_t> n_kv_override;
  std::optional<uint64_t> n_tensors_override;

  // A key with its value type and the raw bytes of its value.
  FileBuilder& Kv(absl::string_view key, uint32_t type, const Bytes& value) {
    kv_.Str(key).U32(type).Append(value);
    ++n_kv_;
    return *this;
  }
  template <typename V>
  FileBuilder& Scalar(absl::string_view key, GgufValueType type, V v) {
    return Kv(key, T(type), Bytes().Put(v));
  }
  FileBuilder& String(absl::string_view key, absl::string_view v) {
    return Kv(key, T(GgufValueType::kString), Bytes().Str(v));
  }
  FileBuilder& Alignment(uint32_t a) { return Scalar("general.alignment", GgufValueType::kUint32, a); }

  FileBuilder& Tensor(absl::string_view name, uint32_t type, const std::vector<uint64_t>& dims, uint64_t offset) {
    return TensorRaw(name, static_cast<uint32_t>(dims.size()), dims, type, offset);
  }
  FileBuilder& TensorRaw(absl::string_view name, uint32_t n_dims, const std::vector<uint64_t>& dims, uint32_t type,
                         uint64_t offset) {
    infos_.Str(name).U32(n_dims);
    for (uint64_t d : dims) infos_.U64(d);
    infos_.U32(type).U64(offset);
    ++n_tensors_;
    return *this;
  }

  // Header, metadata, tensor infos, padding to `alignment`, then `data_bytes` bytes of a pattern.
  std::vector<uint8_t> Build(uint64_t alignment = 32, uint64_t data_bytes = 0) const {
    Bytes out;
    out.U32(magic).U32(version);
    out.U64(n_tensors_override.value_or(n_tensors_)).U64(n_kv_override.value_or(n_kv_));
    out.Append(kv_).Append(infos_).PadTo(alignment);
    for (uint64_t i = 0; i < data_bytes; ++i) out.U8(static_cast<uint8_t>(i * 7 + 1));
    return out.b;
  }

 private:
  Bytes kv_;
  Bytes infos_;
  uint64_t n_kv_ = 0;
  uint64_t n_tensors_ = 0;
};

// The payload of an array value: element type, count, elements.
Bytes ArrayHeader(GgufValueType elem, uint64_t count) { return Bytes().U32(T(elem)).U64(count); }

// `levels` arrays nested in each other, the innermost holding one uint8.
Bytes NestedArrays(int levels) {
  if (levels == 1) return ArrayHeader(GgufValueType::kUint8, 1).U8(42);
  return ArrayHeader(GgufValueType::kArray, 1).Append(NestedArrays(levels - 1));
}

// The result views `bytes`, which must outlive it (hence no rvalue overload).
absl::StatusOr<std::unique_ptr<GgufFile>> ParseBytes(const std::vector<uint8_t>& bytes) {
  return GgufFile::Parse(absl::MakeConstSpan(bytes));
}
absl::StatusOr<std::unique_ptr<GgufFile>> ParseBytes(std::vector<uint8_t>&& bytes) = delete;

// Success when parsing fails with InvalidArgument and a message containing `needle`.
::testing::AssertionResult RejectsWith(const std::vector<uint8_t>& bytes, absl::string_view needle) {
  auto file = ParseBytes(bytes);
  if (file.ok()) return ::testing::AssertionFailure() << "parsed, expected an error with '" << needle << "'";
  if (!absl::IsInvalidArgument(file.status())) return ::testing::AssertionFailure() << "wrong code: " << file.status();
  if (!absl::StrContains(file.status().message(), needle))
    return ::testing::AssertionFailure() << "message '" << file.status().message() << "' does not contain '" << needle
                                         << "'";
  return ::testing::AssertionSuccess() << file.status();
}

// A small valid file with metadata of several kinds and two tensors whose data ends the file.
std::vector<uint8_t> SmallValidFile(uint32_t version = 3) {
  FileBuilder f;
  f.version = version;
  f.String("general.architecture", "test");
  f.Scalar("a.u32", GgufValueType::kUint32, uint32_t{7});
  f.Kv("a.ints", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kInt16, 2).Put(int16_t{-1}).Put(int16_t{2}));
  f.Kv("a.strs", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kString, 2).Str("x").Str("yz"));
  f.Kv("a.nested", T(GgufValueType::kArray), NestedArrays(2));
  f.Tensor("a", T(GgmlType::kF32), {4}, 0);      // 16 bytes
  f.Tensor("b", T(GgmlType::kF16), {8, 2}, 32);  // 32 bytes, ends the file
  return f.Build(32, 64);
}

// ---------------------------------------------------------------------------------------------
// Files on disk.

std::string TempPath(absl::string_view tag) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(::testing::TempDir(), "/gguf_file_test_", getpid(), "_", info->name(), "_", tag, ".gguf");
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  ASSERT_TRUE(out.good()) << path;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Round trips.

TEST(GgufWriterTest, RoundTripsEveryMetadataTypeAndTensorType) {
  const std::string path = TempPath("rt");
  GgufWriter w;
  w.AddString("general.architecture", "qwen3moe");
  w.AddString("empty.string", "");
  w.AddUint32("u32", 4000000000u);
  w.AddUint64("u64", std::numeric_limits<uint64_t>::max());
  w.AddFloat32("f32", -2.5f);
  w.AddBool("yes", true);
  w.AddBool("no", false);
  const std::vector<std::string> strs = {"a", "", "hello world"};
  w.AddStringArray("strs", strs);
  const std::vector<int32_t> ints = {-2147483647 - 1, 0, 5};
  w.AddInt32Array("ints", ints);
  const std::vector<float> floats = {0.5f, -1.0f};
  w.AddFloat32Array("floats", floats);
  w.AddInt32Array("empty.ints", {});

  struct Spec {
    std::string name;
    GgmlType type;
    std::vector<int64_t> shape;
    uint64_t bytes;
  };
  const std::vector<Spec> specs = {
      {"t.f32", GgmlType::kF32, {2, 3, 4, 5}, 480},  // 4-D
      {"t.f16", GgmlType::kF16, {3, 5}, 30},         // not a multiple of 32: padded
      {"t.bf16", GgmlType::kBF16, {4}, 8},          {"t.q8_0", GgmlType::kQ8_0, {64, 2}, 2 * 2 * 34},
      {"t.q4_k", GgmlType::kQ4_K, {256, 1}, 144},   {"t.q6_k", GgmlType::kQ6_K, {256, 2}, 420},
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    const int index = w.AddTensor(specs[i].name, specs[i].type, specs[i].shape);
    EXPECT_EQ(index, static_cast<int>(i));
    EXPECT_EQ(w.TensorBytes(index), specs[i].bytes) << specs[i].name;
  }
  ASSERT_TRUE(w.Open(path).ok());
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<uint8_t> data = Pattern(specs[i].bytes, static_cast<uint8_t>(i));
    // In two pieces: the writer streams.
    const size_t half = data.size() / 2;
    ASSERT_TRUE(w.Append(absl::MakeConstSpan(data).subspan(0, half)).ok());
    ASSERT_TRUE(w.Append(absl::MakeConstSpan(data).subspan(half)).ok());
  }
  ASSERT_TRUE(w.Finish().ok());

  auto opened = GgufFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const GgufFile& f = **opened;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.file_size(), ReadAll(path).size());
  ASSERT_EQ(f.metadata().size(), 11u);
  EXPECT_EQ(f.metadata()[0].key, "general.architecture");  // file order kept

  EXPECT_EQ(*f.GetString("general.architecture"), "qwen3moe");
  EXPECT_EQ(*f.GetString("empty.string"), "");
  EXPECT_EQ(*f.GetUint64("u32"), 4000000000u);
  EXPECT_EQ(f.FindValue("u32")->type(), GgufValueType::kUint32);
  EXPECT_EQ(*f.GetUint64("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(f.FindValue("u64")->AsInt64().ok());  // does not fit
  EXPECT_EQ(*f.GetFloat64("u32"), 4000000000.0);     // integers convert to double
  EXPECT_EQ(*f.GetFloat64("f32"), -2.5);
  EXPECT_EQ(f.FindValue("f32")->type(), GgufValueType::kFloat32);
  EXPECT_TRUE(*f.GetBool("yes"));
  EXPECT_FALSE(*f.GetBool("no"));

  const GgufValue* sv = f.FindValue("strs");
  ASSERT_NE(sv, nullptr);
  EXPECT_EQ(sv->type(), GgufValueType::kArray);
  EXPECT_EQ(sv->element_type(), GgufValueType::kString);
  EXPECT_EQ(sv->size(), 3u);
  EXPECT_THAT(*sv->AsStringArray(), ElementsAre("a", "", "hello world"));
  EXPECT_THAT(*f.FindValue("ints")->AsIntArray(), ElementsAre(-2147483647 - 1, 0, 5));
  EXPECT_THAT(*f.FindValue("ints")->AsFloatArray(), ElementsAre(-2147483648.0, 0.0, 5.0));
  EXPECT_THAT(*f.FindValue("floats")->AsFloatArray(), ElementsAre(0.5, -1.0));
  EXPECT_TRUE(f.FindValue("empty.ints")->AsIntArray()->empty());

  // Typed lookups: NotFound when absent, InvalidArgument naming the key when of the wrong type.
  EXPECT_TRUE(absl::IsNotFound(f.GetUint64("absent").status()));
  EXPECT_THAT(f.GetUint64("absent").status().message(), HasSubstr("'absent'"));
  EXPECT_EQ(f.FindValue("absent"), nullptr);
  const absl::Status wrong = f.GetUint64("general.architecture").status();
  EXPECT_TRUE(absl::IsInvalidArgument(wrong));
  EXPECT_THAT(wrong.message(), HasSubstr("'general.architecture'"));
  EXPECT_THAT(wrong.message(), HasSubstr("string"));
  EXPECT_TRUE(absl::IsInvalidArgument(f.GetString("u32").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(f.GetBool("u32").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(f.GetFloat64("strs").status()));
  EXPECT_FALSE(f.FindValue("floats")->AsIntArray().ok());
  EXPECT_THAT(f.FindValue("floats")->AsIntArray().status().message(), HasSubstr("array of float32"));
  EXPECT_FALSE(f.FindValue("strs")->AsFloatArray().ok());
  EXPECT_FALSE(f.FindValue("ints")->AsStringArray().ok());
  EXPECT_FALSE(f.FindValue("u32")->AsIntArray().ok());

  ASSERT_EQ(f.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(specs[i].name);
    const GgufTensorInfo* t = f.FindTensor(specs[i].name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t, &f.tensors()[i]);
    EXPECT_EQ(t->name, specs[i].name);
    EXPECT_EQ(t->type, specs[i].type);
    EXPECT_EQ(t->shape, specs[i].shape);
    EXPECT_EQ(t->size_bytes, specs[i].bytes);
    EXPECT_EQ(t->offset % 32, 0u);
    EXPECT_EQ(t->rows() * t->shape[0], t->elements());
    const std::vector<uint8_t> want = Pattern(specs[i].bytes, static_cast<uint8_t>(i));
    EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->size_bytes), want);
    EXPECT_EQ(t->data, f.tensors()[0].data - f.tensors()[0].offset + t->offset);
  }
  EXPECT_EQ(f.FindTensor("t.f32")->elements(), 120);
  EXPECT_EQ(f.FindTensor("t.f32")->rows(), 60);
  EXPECT_EQ(f.FindTensor("absent"), nullptr);

  // Parse() of the same bytes gives the same file.
  const std::vector<uint8_t> bytes = ReadAll(path);
  auto parsed = ParseBytes(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)->data_offset(), f.data_offset());
  EXPECT_EQ((*parsed)->tensors().size(), f.tensors().size());
  EXPECT_EQ((*parsed)->path(), "");
  std::remove(path.c_str());
}

TEST(GgufWriterTest, EmptyFileRoundTrips) {
  const std::string path = TempPath("empty");
  GgufWriter w;
  ASSERT_TRUE(w.Open(path).ok());
  ASSERT_TRUE(w.Finish().ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->metadata().empty());
  EXPECT_TRUE((*f)->tensors().empty());
  EXPECT_EQ((*f)->file_size(), 32u);  // the 24-byte header, padded to the alignment
  std::remove(path.c_str());
}

TEST(GgufWriterTest, FinishFailsWhenATensorIsIncomplete) {
  const std::string path = TempPath("incomplete");
  GgufWriter w;
  const int64_t shape[] = {8};
  w.AddTensor("x", GgmlType::kF32, shape);
  ASSERT_TRUE(w.Open(path).ok());
  const std::vector<uint8_t> some(16);
  ASSERT_TRUE(w.Append(some).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(w.Finish()));
  std::remove(path.c_str());
}

// The value types the writer has no method for, and nested arrays, written by hand: together with
// the round trip above every one of the 13 GGUF value types is read.
TEST(GgufFileTest, ReadsEveryValueType) {
  FileBuilder b;
  b.Scalar("u8", GgufValueType::kUint8, uint8_t{250});
  b.Scalar("i8", GgufValueType::kInt8, int8_t{-100});
  b.Scalar("u16", GgufValueType::kUint16, uint16_t{65000});
  b.Scalar("i16", GgufValueType::kInt16, int16_t{-30000});
  b.Scalar("u32", GgufValueType::kUint32, uint32_t{4000000000u});
  b.Scalar("i32", GgufValueType::kInt32, int32_t{-2000000000});
  b.Scalar("f32", GgufValueType::kFloat32, 1.5f);
  b.Scalar("bool", GgufValueType::kBool, uint8_t{1});
  b.String("string", "text");
  b.Kv("array", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kUint8, 3).U8(1).U8(2).U8(255));
  b.Scalar("u64", GgufValueType::kUint64, uint64_t{1} << 63);
  b.Scalar("i64", GgufValueType::kInt64, std::numeric_limits<int64_t>::min());
  b.Scalar("f64", GgufValueType::kFloat64, 0.1);
  // Arrays of the other element types.
  b.Kv("a.i8", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kInt8, 2).Put(int8_t{-1}).Put(int8_t{127}));
  b.Kv("a.u16", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kUint16, 1).Put(uint16_t{65535}));
  b.Kv("a.i16", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kInt16, 1).Put(int16_t{-32768}));
  b.Kv("a.u32", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kUint32, 1).Put(uint32_t{0xffffffff}));
  b.Kv("a.u64", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kUint64, 2).U64(7).U64(~uint64_t{0}));
  b.Kv("a.i64", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kInt64, 1).Put(int64_t{-5}));
  b.Kv("a.f64", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kFloat64, 2).Put(0.25).Put(-8.0));
  b.Kv("a.bool", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kBool, 2).U8(1).U8(0));
  b.Kv("a.empty_strs", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kString, 0));
  // An array of arrays: [[1, 2, 3] as int32, ["p", "qr"]], each element its own element type.
  b.Kv("nested", T(GgufValueType::kArray),
       ArrayHeader(GgufValueType::kArray, 2)
           .Append(ArrayHeader(GgufValueType::kInt32, 3).Put(int32_t{1}).Put(int32_t{2}).Put(int32_t{3}))
           .Append(ArrayHeader(GgufValueType::kString, 2).Str("p").Str("qr")));
  b.Kv("deep", T(GgufValueType::kArray), NestedArrays(8));  // the deepest nesting accepted
  b.Scalar("after", GgufValueType::kUint32, uint32_t{99});  // parsing resumes after the arrays
  const std::vector<uint8_t> bytes = b.Build();
  auto parsed = ParseBytes(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const GgufFile& f = **parsed;

  const auto value = [&](absl::string_view key) {
    const GgufValue* v = f.FindValue(key);
    EXPECT_NE(v, nullptr) << key;
    return v;
  };
  EXPECT_EQ(value("u8")->type(), GgufValueType::kUint8);
  EXPECT_EQ(*f.GetUint64("u8"), 250u);
  EXPECT_EQ(value("i8")->type(), GgufValueType::kInt8);
  EXPECT_EQ(*value("i8")->AsInt64(), -100);
  EXPECT_EQ(*f.GetFloat64("i8"), -100.0);
  EXPECT_TRUE(absl::IsInvalidArgument(f.GetUint64("i8").status()));  // negative
  EXPECT_THAT(f.GetUint64("i8").status().message(), HasSubstr("negative"));
  EXPECT_EQ(*f.GetUint64("u16"), 65000u);
  EXPECT_EQ(*value("i16")->AsInt64(), -30000);
  EXPECT_EQ(*value("u32")->AsInt64(), 4000000000);
  EXPECT_EQ(*value("i32")->AsInt64(), -2000000000);
  EXPECT_EQ(*f.GetFloat64("f32"), 1.5);
  EXPECT_FALSE(value("f32")->AsInt64().ok());
  EXPECT_TRUE(*f.GetBool("bool"));
  EXPECT_FALSE(value("bool")->AsUint64().ok());
  EXPECT_EQ(*f.GetString("string"), "text");
  EXPECT_EQ(value("array")->element_type(), GgufValueType::kUint8);
  EXPECT_THAT(*value("array")->AsIntArray(), ElementsAre(1, 2, 255));
  EXPECT_EQ(*f.GetUint64("u64"), uint64_t{1} << 63);
  EXPECT_FALSE(value("u64")->AsInt64().ok());
  EXPECT_EQ(*value("i64")->AsInt64(), std::numeric_limits<int64_t>::min());
  EXPECT_FALSE(value("i64")->AsUint64().ok());
  EXPECT_EQ(*f.GetFloat64("f64"), 0.1);
  EXPECT_EQ(value("f64")->type(), GgufValueType::kFloat64);

  EXPECT_THAT(*value("a.i8")->AsIntArray(), ElementsAre(-1, 127));
  EXPECT_THAT(*value("a.u16")->AsIntArray(), ElementsAre(65535));
  EXPECT_THAT(*value("a.i16")->AsIntArray(), ElementsAre(-32768));
  EXPECT_THAT(*value("a.u32")->AsIntArray(), ElementsAre(4294967295));
  EXPECT_FALSE(value("a.u64")->AsIntArray().ok());  // the second element does not fit
  EXPECT_THAT(*value("a.i64")->AsIntArray(), ElementsAre(-5));
  EXPECT_THAT(*value("a.f64")->AsFloatArray(), ElementsAre(0.25, -8.0));
  EXPECT_FALSE(value("a.f64")->AsIntArray().ok());
  EXPECT_EQ(value("a.bool")->size(), 2u);
  EXPECT_FALSE(value("a.bool")->AsIntArray().ok());
  EXPECT_TRUE(value("a.empty_strs")->AsStringArray()->empty());

  const GgufValue* nested = value("nested");
  EXPECT_EQ(nested->element_type(), GgufValueType::kArray);
  ASSERT_EQ(nested->nested().size(), 2u);
  EXPECT_THAT(*nested->nested()[0].AsIntArray(), ElementsAre(1, 2, 3));
  EXPECT_EQ(nested->nested()[0].element_type(), GgufValueType::kInt32);
  EXPECT_THAT(*nested->nested()[1].AsStringArray(), ElementsAre("p", "qr"));
  EXPECT_FALSE(nested->AsFloatArray().ok());
  EXPECT_THAT(nested->AsIntArray().status().message(), HasSubstr("array of array"));

  const GgufValue* deep = value("deep");
  for (int i = 0; i < 7; ++i) {
    ASSERT_EQ(deep->nested().size(), 1u);
    deep = &deep->nested()[0];
  }
  EXPECT_THAT(*deep->AsIntArray(), ElementsAre(42));
  EXPECT_EQ(*f.GetUint64("after"), 99u);
  EXPECT_EQ(GgufValueTypeName(GgufValueType::kFloat64), "float64");
  EXPECT_EQ(GgufValueTypeName(static_cast<GgufValueType>(13)), "unknown");
}

TEST(GgufFileTest, ReadsVersions2And3) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE(version);
    const std::vector<uint8_t> bytes = SmallValidFile(version);
    auto f = ParseBytes(bytes);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->version(), version);
    EXPECT_EQ(*(*f)->GetString("general.architecture"), "test");
    ASSERT_EQ((*f)->tensors().size(), 2u);
    EXPECT_EQ((*f)->tensors()[1].shape, (std::vector<int64_t>{8, 2}));
    EXPECT_EQ((*f)->tensors()[1].data + 32, (*f)->tensors()[0].data + 64);  // ends the file
    EXPECT_THAT(*(*f)->FindValue("a.ints")->AsIntArray(), ElementsAre(-1, 2));
  }
}

TEST(GgufFileTest, HonoursGeneralAlignment) {
  for (uint32_t alignment : {1u, 2u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    FileBuilder b;
    b.Alignment(alignment);
    b.String("k", "abc");  // an odd-length header, so the padding matters
    b.Tensor("x", T(GgmlType::kF32), {3}, 0);
    const uint64_t second = (12 + alignment - 1) / alignment * alignment;
    b.Tensor("y", T(GgmlType::kBF16), {5}, second);
    const std::vector<uint8_t> bytes = b.Build(alignment, second + 10);
    auto f = ParseBytes(bytes);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->alignment(), alignment);
    EXPECT_EQ((*f)->data_offset() % alignment, 0u);
    EXPECT_EQ((*f)->data_offset(), bytes.size() - second - 10);
    EXPECT_EQ((*f)->tensors()[0].data, bytes.data() + (*f)->data_offset());
    EXPECT_EQ((*f)->tensors()[1].data, bytes.data() + (*f)->data_offset() + second);
  }
  // general.alignment may have any unsigned integer type.
  FileBuilder b;
  b.Scalar("general.alignment", GgufValueType::kUint64, uint64_t{16});
  b.Tensor("x", T(GgmlType::kF32), {1}, 16);
  const std::vector<uint8_t> bytes = b.Build(16, 20);
  auto f = ParseBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 16u);
}

TEST(GgufFileTest, TensorOffsetsAreCheckedAgainstTheDeclaredAlignment) {
  FileBuilder b;
  b.Alignment(64);
  b.Tensor("x", T(GgmlType::kF32), {8}, 32);  // fine for the default 32, not for 64
  EXPECT_TRUE(RejectsWith(b.Build(64, 128), "GGUF tensor 'x' offset 32 is not aligned to 64"));
}

// ---------------------------------------------------------------------------------------------
// Malformed files.

TEST(GgufFileTest, RejectsWrongMagic) {
  FileBuilder b;
  b.magic = 0x46554746;  // "FGUF"
  EXPECT_TRUE(RejectsWith(b.Build(), "wrong magic"));
  std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'};
  EXPECT_TRUE(RejectsWith(text, "not a GGUF file"));
}

TEST(GgufFileTest, RejectsBadVersion) {
  for (uint32_t version : {0u, 1u, 4u, 0x03000000u /* a big-endian v3 file */}) {
    FileBuilder b;
    b.version = version;
    EXPECT_TRUE(RejectsWith(b.Build(), absl::StrCat("unsupported GGUF version ", version)));
  }
}

TEST(GgufFileTest, EveryTruncatedPrefixIsAnError) {
  std::vector<std::vector<uint8_t>> files = {SmallValidFile(3), SmallValidFile(2)};
  // And one from the writer, whose last tensor fills its padding exactly.
  {
    const std::string path = TempPath("trunc");
    GgufWriter w;
    w.AddString("general.architecture", "x");
    w.AddFloat32Array("f", std::vector<float>{1, 2, 3});
    const int64_t s1[] = {32, 1};
    const int64_t s2[] = {8};
    w.AddTensor("q", GgmlType::kQ8_0, s1);
    w.AddTensor("v", GgmlType::kF32, s2);
    ASSERT_TRUE(w.Open(path).ok());
    ASSERT_TRUE(w.Append(Pattern(34, 1)).ok());
    ASSERT_TRUE(w.Append(Pattern(32, 2)).ok());
    ASSERT_TRUE(w.Finish().ok());
    files.push_back(ReadAll(path));
    std::remove(path.c_str());
  }
  for (const std::vector<uint8_t>& full : files) {
    ASSERT_TRUE(ParseBytes(full).ok());
    for (size_t n = 0; n < full.size(); ++n) {
      // A copy of exactly n bytes, so that ASan sees any read past the prefix.
      const std::vector<uint8_t> prefix(full.begin(), full.begin() + n);
      EXPECT_TRUE(RejectsWith(prefix, "truncated")) << "prefix of " << n << " of " << full.size();
    }
  }
}

TEST(GgufFileTest, RejectsStringLengthPastTheEnd) {
  FileBuilder b;
  b.Kv("general.name", T(GgufValueType::kString), Bytes().U64(1000).Str("short"));
  EXPECT_TRUE(RejectsWith(b.Build(), "string value of 'general.name' (length 1000)"));
  // A key length past the end, and one so large that pos + len would wrap.
  for (uint64_t len : {uint64_t{100}, ~uint64_t{0}}) {
    std::vector<uint8_t> bytes = Bytes().U32(kMagic).U32(3).U64(0).U64(1).U64(len).Str("k").b;
    bytes.resize(bytes.size() + 16);
    EXPECT_TRUE(RejectsWith(bytes, "metadata key"));
  }
  FileBuilder strs;
  strs.Kv("s", T(GgufValueType::kArray), ArrayHeader(GgufValueType::kString, 2).Str("ok").U64(77));
  EXPECT_TRUE(RejectsWith(strs.Build(), "element 1 of 's' (length 77)"));
  std::vector<uint8_t> bytes = Bytes().U32(kMagic).U32(3).U64(1).U64(0).U64(5000).b;
  bytes.resize(bytes.size() + 40);
  EXPECT_TRUE(RejectsWith(bytes, "tensor name (length 5000)"));
}

TEST(GgufFileTest, RejectsArrayCountPastTheEnd) {
  for (GgufValueType elem :
       {GgufValueType::kUint8, GgufValueType::kFloat64, GgufValueType::kString, GgufValueType::kArray}) {
    SCOPED_TRACE(GgufValueTypeName(elem));
    for (uint64_t count : {uint64_t{1000}, uint64_t{1} << 61, ~uint64_t{0}}) {
      FileBuilder b;
      b.Kv("arr", T(GgufValueType::kArray), ArrayHeader(elem, count).U64(0));
      EXPECT_TRUE(RejectsWith(b.Build(), absl::StrCat("array 'arr' of ", count, " elements")));
    }
  }
  FileBuilder inner;
  inner.Kv("arr", T(GgufValueType::kArray),
           ArrayHeader(GgufValueType::kArray, 1).Append(ArrayHeader(GgufValueType::kInt32, 100)).U32(1));
  EXPECT_TRUE(RejectsWith(inner.Build(), "array 'arr' of 100 elements"));
}

TEST(GgufFileTest, RejectsBadValueTypes) {
  FileBuilder b;
  b.Kv("k", 13, Bytes().U64(0));
  EXPECT_TRUE(RejectsWith(b.Build(), "GGUF key 'k' has unknown value type 13"));
  FileBuilder a;
  a.Kv("k", T(GgufValueType::kArray), Bytes().U32(0xffffffff).U64(0));
  EXPECT_TRUE(RejectsWith(a.Build(), "GGUF key 'k': unknown array element type 4294967295"));
  FileBuilder deep;
  deep.Kv("deep", T(GgufValueType::kArray), NestedArrays(9));
  EXPECT_TRUE(RejectsWith(deep.Build(), "GGUF key 'deep': arrays nested too deep"));
}

TEST(GgufFileTest, RejectsHugeCounts) {
  FileBuilder kv;
  kv.n_kv_override = ~uint64_t{0};
  EXPECT_TRUE(RejectsWith(kv.Build(32, 64), "metadata entries"));
  FileBuilder tensors;
  tensors.n_tensors_override = uint64_t{1} << 40;
  EXPECT_TRUE(RejectsWith(tensors.Build(32, 64), "tensor infos"));
}

TEST(GgufFileTest, RejectsBadDimensionCount) {
  for (uint32_t n_dims : {0u, 5u, 0x80000000u}) {
    FileBuilder b;
    b.TensorRaw("t", n_dims, {4, 4, 4, 4, 4}, T(GgmlType::kF32), 0);
    EXPECT_TRUE(
        RejectsWith(b.Build(32, 4096), absl::StrCat("GGUF tensor 't' has ", n_dims, " dimensions (1 to 4 allowed)")));
  }
}

TEST(GgufFileTest, RejectsZeroDimension) {
  FileBuilder b;
  b.Tensor("t", T(GgmlType::kF32), {4, 0, 2}, 0);
  EXPECT_TRUE(RejectsWith(b.Build(32, 64), "GGUF tensor 't' has dimension 1 of size 0, out of range"));
}

TEST(GgufFileTest, RejectsDimensionProductOverflow) {
  // Each dimension is modest but the product wraps a uint64 (2^64), or is absurd (2^60).
  const std::vector<std::vector<uint64_t>> cases = {
      {uint64_t{1} << 32, uint64_t{1} << 32},
      {uint64_t{1} << 20, uint64_t{1} << 20, uint64_t{1} << 20},
      {uint64_t{1} << 16, uint64_t{1} << 16, uint64_t{1} << 16, uint64_t{1} << 16},
      {uint64_t{1} << 41},  // one huge dimension
      {~uint64_t{0}},       // -1 as int64
      {8, uint64_t{1} << 63},
  };
  for (const auto& dims : cases) {
    FileBuilder b;
    b.Tensor("t", T(GgmlType::kF32), dims, 0);
    EXPECT_TRUE(RejectsWith(b.Build(32, 64), "out of range"));
  }
}

TEST(GgufFileTest, RejectsUnsupportedTensorTypes) {
  // 29 = IQ1_M and 24 = I8 are real ggml types mer does not read, 9 = Q8_1 and 15 = Q8_K are
  // not storage types, 99 and 2^32 - 1 are unknown.
  for (uint32_t type : {29u, 24u, 9u, 15u, 99u, 0xffffffffu}) {
    FileBuilder b;
    b.Tensor("w", type, {256}, 0);
    EXPECT_TRUE(RejectsWith(b.Build(32, 1024),
                            absl::StrCat("GGUF tensor 'w' has tensor type ", type, ", which mer does not support")));
  }
}

TEST(GgufFileTest, RejectsRowLengthNotAMultipleOfTheBlock) {
  const struct {
    GgmlType type;
    uint64_t ne0;
    const char* message;
  } cases[] = {
      {GgmlType::kQ8_0, 48, "row length 48 is not a multiple of the q8_0 block size 32"},
      {GgmlType::kQ4_K, 128, "row length 128 is not a multiple of the q4_k block size 256"},
      {GgmlType::kQ6_K, 257, "row length 257 is not a multiple of the q6_k block size 256"},
  };
  for (const auto& c : cases) {
    FileBuilder b;
    b.Tensor("w", T(c.type), {c.ne0, 2}, 0);
    EXPECT_TRUE(RejectsWith(b.Build(32, 2048), c.message));
  }
}

TEST(GgufFileTest, RejectsUnalignedTensorOffset) {
  FileBuilder b;
  b.Tensor("w", T(GgmlType::kF32), {4}, 16);
  EXPECT_TRUE(RejectsWith(b.Build(32, 64), "GGUF tensor 'w' offset 16 is not aligned to 32"));
}

TEST(GgufFileTest, RejectsTensorDataPastTheEnd) {
  FileBuilder b;
  b.Tensor("w", T(GgmlType::kF32), {16}, 0);  // 64 bytes, 63 present
  EXPECT_TRUE(RejectsWith(b.Build(32, 63), "GGUF tensor 'w' data (offset 0, 64 bytes) lies outside"));
  // An offset beyond the file, and one so large that offset + size would wrap.
  for (uint64_t offset : {uint64_t{1024}, ~uint64_t{0} - 31}) {
    FileBuilder o;
    o.Tensor("w", T(GgmlType::kF32), {8}, offset);
    EXPECT_TRUE(RejectsWith(o.Build(32, 64), "lies outside the data section of 64 bytes"));
  }
  // The header padding itself is cut.
  FileBuilder h;
  h.Tensor("w", T(GgmlType::kF32), {1}, 0);
  std::vector<uint8_t> bytes = h.Build(32, 0);
  bytes.resize(bytes.size() - 1);
  EXPECT_TRUE(RejectsWith(bytes, "tensor data section"));
}

TEST(GgufFileTest, RejectsDuplicateKey) {
  FileBuilder b;
  b.Scalar("dup.key", GgufValueType::kUint32, uint32_t{1});
  b.String("other", "x");
  b.Scalar("dup.key", GgufValueType::kUint8, uint8_t{2});
  EXPECT_TRUE(RejectsWith(b.Build(), "GGUF metadata key 'dup.key' appears twice"));
}

TEST(GgufFileTest, RejectsDuplicateTensorName) {
  FileBuilder b;
  b.Tensor("blk.0.w", T(GgmlType::kF32), {8}, 0);
  b.Tensor("blk.0.w", T(GgmlType::kF32), {8}, 32);
  EXPECT_TRUE(RejectsWith(b.Build(32, 64), "GGUF tensor 'blk.0.w' appears twice"));
}

TEST(GgufFileTest, RejectsBadAlignment) {
  for (uint32_t alignment : {0u, 3u, 48u, 1u << 21}) {
    FileBuilder b;
    b.Alignment(alignment);
    EXPECT_TRUE(RejectsWith(b.Build(), "general.alignment must be a power of two"));
  }
  FileBuilder s;
  s.String("general.alignment", "32");
  EXPECT_TRUE(RejectsWith(s.Build(), "general.alignment"));
  FileBuilder neg;
  neg.Scalar("general.alignment", GgufValueType::kInt32, int32_t{-32});
  EXPECT_TRUE(RejectsWith(neg.Build(), "general.alignment"));
}

// ---------------------------------------------------------------------------------------------
// Open().

TEST(GgufFileTest, OpenMissingFileIsNotFound) {
  auto f = GgufFile::Open(absl::StrCat(::testing::TempDir(), "/does/not/exist.gguf"));
  EXPECT_TRUE(absl::IsNotFound(f.status())) << f.status();
  EXPECT_THAT(f.status().message(), HasSubstr("exist.gguf"));
}

TEST(GgufFileTest, OpenDirectoryIsAnError) {
  auto f = GgufFile::Open(::testing::TempDir());
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
  EXPECT_THAT(f.status().message(), HasSubstr("not a regular file"));
}

TEST(GgufFileTest, OpenEmptyAndMalformedFilesNamesThePath) {
  const std::string empty = TempPath("empty");
  WriteAll(empty, {});
  auto e = GgufFile::Open(empty);
  EXPECT_TRUE(absl::IsInvalidArgument(e.status())) << e.status();
  EXPECT_THAT(e.status().message(), HasSubstr(empty));
  EXPECT_THAT(e.status().message(), HasSubstr("truncated"));

  const std::string bad = TempPath("bad");
  FileBuilder b;
  b.Tensor("w", T(GgmlType::kF32), {4}, 16);
  WriteAll(bad, b.Build(32, 64));
  auto f = GgufFile::Open(bad);
  EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
  EXPECT_THAT(f.status().message(), HasSubstr(bad));
  EXPECT_THAT(f.status().message(), HasSubstr("not aligned"));

  const std::string good = TempPath("good");
  WriteAll(good, SmallValidFile());
  auto g = GgufFile::Open(good);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->tensors()[1].data[31], SmallValidFile()[SmallValidFile().size() - 1]);
  std::remove(empty.c_str());
  std::remove(bad.c_str());
  std::remove(good.c_str());
}

// ---------------------------------------------------------------------------------------------
// Seeds for tests/fuzz/gguf_fuzz.cc, named *.seed because .gitignore keeps *.gguf (models) out of
// the repository. Written only when MER_GGUF_CORPUS_DIR names a directory:
//   MER_GGUF_CORPUS_DIR=tests/fuzz/corpus/gguf ./build/bin/gguf_file_test --gtest_filter='*Seed*'

// A minimal valid qwen3moe model with f32 weights of tiny shapes (ReadModelConfig and
// ModelWeights::Load accept it), so that the fuzzer starts from inputs reaching the model loader.
void WriteTinyQwen3MoeModel(const std::string& path) {
  constexpr int64_t kEmbd = 4, kHead = 2, kHeadKv = 1, kHeadDim = 2, kExpert = 2, kFf = 4, kVocab = 4;
  GgufWriter w;
  w.AddString("general.architecture", "qwen3moe");
  w.AddUint32("qwen3moe.context_length", 16);
  w.AddUint32("qwen3moe.embedding_length", kEmbd);
  w.AddUint32("qwen3moe.block_count", 1);
  w.AddUint32("qwen3moe.attention.head_count", kHead);
  w.AddUint32("qwen3moe.attention.head_count_kv", kHeadKv);
  w.AddUint32("qwen3moe.attention.key_length", kHeadDim);
  w.AddUint32("qwen3moe.expert_count", kExpert);
  w.AddUint32("qwen3moe.expert_used_count", 1);
  w.AddUint32("qwen3moe.expert_feed_forward_length", kFf);
  w.AddFloat32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
  w.AddFloat32("qwen3moe.rope.freq_base", 1e6f);
  using S = std::vector<int64_t>;
  const std::vector<std::pair<std::string, S>> tensors = {
      {"token_embd.weight", {kEmbd, kVocab}},
      {"output_norm.weight", {kEmbd}},
      {"blk.0.attn_norm.weight", {kEmbd}},
      {"blk.0.attn_q.weight", {kEmbd, kHead * kHeadDim}},
      {"blk.0.attn_k.weight", {kEmbd, kHeadKv * kHeadDim}},
      {"blk.0.attn_v.weight", {kEmbd, kHeadKv * kHeadDim}},
      {"blk.0.attn_output.weight", {kHead * kHeadDim, kEmbd}},
      {"blk.0.attn_q_norm.weight", {kHeadDim}},
      {"blk.0.attn_k_norm.weight", {kHeadDim}},
      {"blk.0.ffn_norm.weight", {kEmbd}},
      {"blk.0.ffn_gate_inp.weight", {kEmbd, kExpert}},
      {"blk.0.ffn_gate_exps.weight", {kEmbd, kFf, kExpert}},
      {"blk.0.ffn_up_exps.weight", {kEmbd, kFf, kExpert}},
      {"blk.0.ffn_down_exps.weight", {kFf, kEmbd, kExpert}},
  };
  for (const auto& [name, shape] : tensors) w.AddTensor(name, GgmlType::kF32, shape);
  ASSERT_TRUE(w.Open(path).ok());
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSERT_TRUE(w.Append(Pattern(w.TensorBytes(static_cast<int>(i)), static_cast<uint8_t>(i))).ok());
  }
  ASSERT_TRUE(w.Finish().ok());
}

TEST(GgufFuzzSeeds, WriteSeedCorpus) {
  const char* dir = std::getenv("MER_GGUF_CORPUS_DIR");
  if (dir == nullptr) GTEST_SKIP() << "set MER_GGUF_CORPUS_DIR to write the fuzz seed corpus";
  const std::string d(dir);
  WriteTinyQwen3MoeModel(d + "/tiny_qwen3moe.seed");
  ASSERT_TRUE(GgufFile::Open(d + "/tiny_qwen3moe.seed").ok());
  WriteAll(d + "/small_v3.seed", SmallValidFile(3));

  // Every value type, nested arrays, version 2, alignment 8, a q8_0 tensor.
  FileBuilder b;
  b.version = 2;
  b.Alignment(8);
  b.Scalar("u8", GgufValueType::kUint8, uint8_t{1});
  b.Scalar("i8", GgufValueType::kInt8, int8_t{-1});
  b.Scalar("u16", GgufValueType::kUint16, uint16_t{2});
  b.Scalar("i16", GgufValueType::kInt16, int16_t{-2});
  b.Scalar("i32", GgufValueType::kInt32, int32_t{-3});
  b.Scalar("f32", GgufValueType::kFloat32, 0.5f);
  b.Scalar("bool", GgufValueType::kBool, uint8_t{1});
  b.String("str", "s");
  b.Scalar("u64", GgufValueType::kUint64, uint64_t{4});
  b.Scalar("i64", GgufValueType::kInt64, int64_t{-4});
  b.Scalar("f64", GgufValueType::kFloat64, 0.25);
  b.Kv("nested", T(GgufValueType::kArray),
       ArrayHeader(GgufValueType::kArray, 2)
           .Append(ArrayHeader(GgufValueType::kFloat32, 1).Put(1.0f))
           .Append(ArrayHeader(GgufValueType::kString, 1).Str("t")));
  b.Tensor("q", T(GgmlType::kQ8_0), {32, 1}, 0);
  b.Tensor("h", T(GgmlType::kF16), {3}, 40);
  const std::vector<uint8_t> all_types = b.Build(8, 46);
  ASSERT_TRUE(ParseBytes(all_types).ok());
  WriteAll(d + "/all_types_v2_align8.seed", all_types);

  // Invalid: the tiny model cut short in its tensor data.
  std::vector<uint8_t> cut = ReadAll(d + "/tiny_qwen3moe.seed");
  cut.resize(cut.size() - 100);
  ASSERT_FALSE(ParseBytes(cut).ok());
  WriteAll(d + "/truncated_model.seed", cut);
}

}  // namespace
}  // namespace mer
