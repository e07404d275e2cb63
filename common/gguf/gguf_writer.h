// Streaming GGUF (version 3) writer: declare metadata and tensors, then write each tensor's data in
// declaration order. Tensor data is never held by the writer, so multi-GB files stream through.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"
#include "common/tensor/ggml_type.h"

namespace mer {

class GgufWriter {
 public:
  static constexpr uint64_t kAlignment = 32;  // GGUF's default general.alignment

  GgufWriter() = default;
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Metadata, in the order it will appear in the file.
  void AddString(absl::string_view key, absl::string_view value);
  void AddUint32(absl::string_view key, uint32_t value);
  void AddUint64(absl::string_view key, uint64_t value);
  void AddFloat32(absl::string_view key, float value);
  void AddBool(absl::string_view key, bool value);
  void AddStringArray(absl::string_view key, absl::Span<const std::string> values);
  void AddInt32Array(absl::string_view key, absl::Span<const int32_t> values);
  void AddFloat32Array(absl::string_view key, absl::Span<const float> values);

  // Declares a tensor; `shape` is ne[0] (row length) first. Returns its index.
  int AddTensor(absl::string_view name, GgmlType type, absl::Span<const int64_t> shape);
  uint64_t TensorBytes(int index) const { return tensors_[index].size_bytes; }

  // The bytes Open writes before the tensor data (header, metadata, tensor infos, padding to the
  // alignment), and the size the file will have once every tensor is appended: the identity of a
  // file without writing it (common/store/synth_store.h).
  std::string EncodeHeader() const;
  uint64_t FileBytes() const { return EncodeHeader().size() + data_bytes_; }

  // Creates `path` and writes header, metadata and tensor infos.
  absl::Status Open(const std::string& path);
  // Appends the data of the next tensor in declaration order; `bytes` may come in several pieces
  // (a tensor is complete once TensorBytes(index) bytes were appended).
  absl::Status Append(absl::Span<const uint8_t> bytes);
  // Checks that every tensor was written completely, flushes and closes.
  absl::Status Finish();

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> shape;
    uint64_t offset;
    uint64_t size_bytes;
  };
  void Put(const void* p, size_t n) { header_.append(static_cast<const char*>(p), n); }
  void PutString(absl::string_view s);
  void PutKey(absl::string_view key, GgufValueType type);
  absl::Status WriteRaw(const void* p, size_t n);
  absl::Status PadTo(uint64_t alignment);

  std::string header_;  // metadata bytes, accumulated until Open
  uint64_t n_metadata_ = 0;
  std::vector<Tensor> tensors_;
  uint64_t data_bytes_ = 0;  // running offset of the next declared tensor

  std::string path_;
  std::FILE* out_ = nullptr;
  uint64_t written_ = 0;     // bytes written to the file
  uint64_t data_start_ = 0;  // file offset of the data section
  size_t current_ = 0;       // tensor whose data is being appended
  uint64_t current_written_ = 0;
};

}  // namespace mer
