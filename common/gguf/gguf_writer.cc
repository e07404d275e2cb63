#include "common/gguf/gguf_writer.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"

namespace mer {

GgufWriter::~GgufWriter() {
  if (out_ != nullptr) std::fclose(out_);
}

void GgufWriter::PutString(absl::string_view s) {
  const uint64_t n = s.size();
  Put(&n, 8);
  Put(s.data(), s.size());
}

void GgufWriter::PutKey(absl::string_view key, GgufValueType type) {
  CHECK(out_ == nullptr);  // metadata goes before Open
  PutString(key);
  const uint32_t t = static_cast<uint32_t>(type);
  Put(&t, 4);
  ++n_metadata_;
}

void GgufWriter::AddString(absl::string_view key, absl::string_view value) {
  PutKey(key, GgufValueType::kString);
  PutString(value);
}
void GgufWriter::AddUint32(absl::string_view key, uint32_t value) {
  PutKey(key, GgufValueType::kUint32);
  Put(&value, 4);
}
void GgufWriter::AddUint64(absl::string_view key, uint64_t value) {
  PutKey(key, GgufValueType::kUint64);
  Put(&value, 8);
}
void GgufWriter::AddFloat32(absl::string_view key, float value) {
  PutKey(key, GgufValueType::kFloat32);
  Put(&value, 4);
}
void GgufWriter::AddBool(absl::string_view key, bool value) {
  PutKey(key, GgufValueType::kBool);
  const uint8_t b = value ? 1 : 0;
  Put(&b, 1);
}

namespace {
template <typename T>
void PutArrayHeader(std::string& out, GgufValueType elem, uint64_t n) {
  const uint32_t t = static_cast<uint32_t>(elem);
  out.append(reinterpret_cast<const char*>(&t), 4);
  out.append(reinterpret_cast<const char*>(&n), 8);
}
}  // namespace

void GgufWriter::AddStringArray(absl::string_view key, absl::Span<const std::string> values) {
  PutKey(key, GgufValueType::kArray);
  PutArrayHeader<std::string>(header_, GgufValueType::kString, values.size());
  for (const std::string& v : values) PutString(v);
}
void GgufWriter::AddInt32Array(absl::string_view key, absl::Span<const int32_t> values) {
  PutKey(key, GgufValueType::kArray);
  PutArrayHeader<int32_t>(header_, GgufValueType::kInt32, values.size());
  Put(values.data(), values.size() * 4);
}
void GgufWriter::AddFloat32Array(absl::string_view key, absl::Span<const float> values) {
  PutKey(key, GgufValueType::kArray);
  PutArrayHeader<float>(header_, GgufValueType::kFloat32, values.size());
  Put(values.data(), values.size() * 4);
}

int GgufWriter::AddTensor(absl::string_view name, GgmlType type, absl::Span<const int64_t> shape) {
  CHECK(out_ == nullptr);
  CHECK(!shape.empty() && shape.size() <= 4);
  int64_t elements = 1;
  for (int64_t d : shape) {
    CHECK_MSG(d > 0, "GGUF writer: tensor dimensions must be positive");
    elements *= d;
  }
  Tensor t{std::string(name), type, std::vector<int64_t>(shape.begin(), shape.end()), data_bytes_,
           static_cast<uint64_t>(RowBytes(type, shape[0]) * (elements / shape[0]))};
  data_bytes_ += (t.size_bytes + kAlignment - 1) / kAlignment * kAlignment;
  tensors_.push_back(std::move(t));
  return static_cast<int>(tensors_.size()) - 1;
}

absl::Status GgufWriter::WriteRaw(const void* p, size_t n) {
  if (n != 0 && std::fwrite(p, 1, n, out_) != n)
    return absl::UnavailableError(absl::StrCat("writing ", path_, ": ", std::strerror(errno)));
  written_ += n;
  return absl::OkStatus();
}

absl::Status GgufWriter::PadTo(uint64_t alignment) {
  static const uint8_t kZeros[64] = {};
  while (written_ % alignment != 0) {
    const uint64_t n = std::min<uint64_t>(sizeof(kZeros), alignment - written_ % alignment);
    RETURN_IF_ERROR(WriteRaw(kZeros, n));
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::Open(const std::string& path) {
  CHECK(out_ == nullptr);
  path_ = path;
  out_ = std::fopen(path.c_str(), "wb");
  if (out_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  std::setvbuf(out_, nullptr, _IOFBF, 1 << 20);
  const std::string header = EncodeHeader();
  RETURN_IF_ERROR(WriteRaw(header.data(), header.size()));
  data_start_ = written_;
  return absl::OkStatus();
}

std::string GgufWriter::EncodeHeader() const {
  std::string out;
  const uint32_t magic_version[2] = {0x46554747, 3};
  const uint64_t counts[2] = {tensors_.size(), n_metadata_};
  out.append(reinterpret_cast<const char*>(magic_version), 8);
  out.append(reinterpret_cast<const char*>(counts), 16);
  out.append(header_);
  for (const Tensor& t : tensors_) {
    const uint64_t n = t.name.size();
    out.append(reinterpret_cast<const char*>(&n), 8).append(t.name);
    const uint32_t n_dims = static_cast<uint32_t>(t.shape.size());
    out.append(reinterpret_cast<const char*>(&n_dims), 4);
    for (int64_t d : t.shape) out.append(reinterpret_cast<const char*>(&d), 8);
    const uint32_t type = static_cast<uint32_t>(t.type);
    out.append(reinterpret_cast<const char*>(&type), 4);
    out.append(reinterpret_cast<const char*>(&t.offset), 8);
  }
  out.resize((out.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');
  return out;
}

absl::Status GgufWriter::Append(absl::Span<const uint8_t> bytes) {
  CHECK(out_ != nullptr);
  while (!bytes.empty()) {
    CHECK_MSG(current_ < tensors_.size(), "more tensor data than declared");
    const Tensor& t = tensors_[current_];
    if (current_written_ == 0) CHECK(written_ - data_start_ == t.offset);
    const uint64_t n = std::min<uint64_t>(bytes.size(), t.size_bytes - current_written_);
    RETURN_IF_ERROR(WriteRaw(bytes.data(), n));
    bytes.remove_prefix(n);
    current_written_ += n;
    if (current_written_ == t.size_bytes) {
      RETURN_IF_ERROR(PadTo(kAlignment));
      ++current_;
      current_written_ = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::Finish() {
  CHECK(out_ != nullptr);
  if (current_ != tensors_.size())
    return absl::FailedPreconditionError(
        absl::StrCat("GGUF writer: tensor ", current_, " of ", tensors_.size(), " not written"));
  const int rc = std::fclose(out_);
  out_ = nullptr;
  if (rc != 0) return absl::UnavailableError(absl::StrCat("closing ", path_, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace mer
