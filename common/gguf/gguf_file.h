// Reader for GGUF files (llama.cpp's model format), versions 2 and 3.
//
// The file is memory-mapped and parsed once; metadata strings and tensor data are views into the
// mapping, valid as long as the GgufFile lives. Every length, count, offset and shape read from the
// file is checked against the file's size before it is used, so a malformed or hostile file yields
// an InvalidArgument naming the problem, never an out-of-bounds read. Format: docs/gguf.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor/ggml_type.h"

namespace mer {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
absl::string_view GgufValueTypeName(GgufValueType type);

// One metadata value. Scalars are held decoded; arrays of numbers keep a view of their
// little-endian elements in the file, arrays of strings a view per string, arrays of arrays
// their elements. The typed getters convert where the conversion is exact and fail otherwise.
class GgufValue {
 public:
  GgufValueType type() const { return type_; }

  absl::StatusOr<uint64_t> AsUint64() const;  // any integer type, non-negative
  absl::StatusOr<int64_t> AsInt64() const;    // any integer type that fits
  absl::StatusOr<double> AsFloat64() const;   // float32, float64 or integer
  absl::StatusOr<bool> AsBool() const;
  absl::StatusOr<absl::string_view> AsString() const;

  // Arrays.
  GgufValueType element_type() const { return element_type_; }
  uint64_t size() const { return count_; }
  absl::StatusOr<std::vector<absl::string_view>> AsStringArray() const;
  absl::StatusOr<std::vector<int64_t>> AsIntArray() const;   // integer elements
  absl::StatusOr<std::vector<double>> AsFloatArray() const;  // float or integer elements
  const std::vector<GgufValue>& nested() const { return nested_; }

 private:
  friend class GgufParser;
  GgufValueType type_ = GgufValueType::kUint8;
  uint64_t bits_ = 0;         // scalar payload, as read (sign/float reinterpretation on access)
  absl::string_view string_;  // kString
  GgufValueType element_type_ = GgufValueType::kUint8;  // kArray
  uint64_t count_ = 0;
  const uint8_t* elements_ = nullptr;       // numeric arrays: count_ packed elements
  std::vector<absl::string_view> strings_;  // string arrays
  std::vector<GgufValue> nested_;           // arrays of arrays
};

struct GgufMetadataEntry {
  absl::string_view key;
  GgufValue value;
};

struct GgufTensorInfo {
  absl::string_view name;
  GgmlType type;
  std::vector<int64_t> shape;  // ne[0] first: ne[0] is the row length (contiguous elements)
  uint64_t offset = 0;         // from the start of the data section
  uint64_t size_bytes = 0;
  const uint8_t* data = nullptr;

  int64_t elements() const;
  int64_t rows() const { return elements() / shape[0]; }
};

class GgufFile {
 public:
  // Maps and parses `path`. NotFound / PermissionDenied for the OS errors, InvalidArgument for a bad file.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes already in memory; they must outlive the result (tests, fuzzing).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(absl::Span<const uint8_t> bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return bytes_.size(); }
  // Every byte of the file, as mapped (checksums over the whole file).
  absl::Span<const uint8_t> bytes() const { return bytes_; }
  uint64_t data_offset() const { return data_offset_; }  // where the tensor data section starts
  const std::string& path() const { return path_; }
  const std::vector<GgufMetadataEntry>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufValue* FindValue(absl::string_view key) const;
  const GgufTensorInfo* FindTensor(absl::string_view name) const;

  // Typed lookups: NotFound naming the key when absent, InvalidArgument when of the wrong type.
  absl::StatusOr<uint64_t> GetUint64(absl::string_view key) const;
  absl::StatusOr<double> GetFloat64(absl::string_view key) const;
  absl::StatusOr<absl::string_view> GetString(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;

 private:
  friend class GgufParser;
  GgufFile() = default;

  std::string path_;
  absl::Span<const uint8_t> bytes_;
  void* mapping_ = nullptr;  // munmap'ed by the destructor when Open mapped the file
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufMetadataEntry> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

}  // namespace mer
