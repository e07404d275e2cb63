#include "common/gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr int kMaxDims = 4;                  // ggml's GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 8;

int ScalarBytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    default:
      return 0;  // string, array: variable
  }
}

bool IsKnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }
bool IsInteger(GgufValueType t) {
  return ScalarBytes(t) != 0 && t != GgufValueType::kFloat32 && t != GgufValueType::kFloat64 &&
         t != GgufValueType::kBool;
}
bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}

// Sign-extends or zero-extends `n` little-endian bytes at `p` into an int64 / uint64 pair.
uint64_t LoadLittleEndian(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct IntValue {
  bool negative;
  uint64_t magnitude_bits;  // the value as int64 bits if negative, as uint64 otherwise
};

IntValue DecodeInt(GgufValueType t, uint64_t bits) {
  const int n = ScalarBytes(t);
  if (IsSigned(t)) {
    const int shift = 64 - 8 * n;
    const int64_t v = static_cast<int64_t>(bits << shift) >> shift;
    return {v < 0, static_cast<uint64_t>(v)};
  }
  return {false, bits};
}

double DecodeFloat(GgufValueType t, uint64_t bits) {
  if (t == GgufValueType::kFloat32) {
    float f;
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b, 4);
    return f;
  }
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

absl::Status WrongType(GgufValueType have, absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat("GGUF value is ", GgufValueTypeName(have), ", expected ", want));
}

// For the array getters: names the element type too ("array of float32").
absl::Status WrongArrayType(GgufValueType have, GgufValueType have_element, absl::string_view want) {
  if (have != GgufValueType::kArray) return WrongType(have, want);
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF value is array of ", GgufValueTypeName(have_element), ", expected ", want));
}

}  // namespace

absl::string_view GgufValueTypeName(GgufValueType type) {
  static constexpr absl::string_view kNames[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                                 "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const uint32_t i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

absl::StatusOr<uint64_t> GgufValue::AsUint64() const {
  if (!IsInteger(type_)) return WrongType(type_, "an unsigned integer");
  const IntValue v = DecodeInt(type_, bits_);
  if (v.negative) return absl::InvalidArgumentError("GGUF value is negative, expected unsigned");
  return v.magnitude_bits;
}

absl::StatusOr<int64_t> GgufValue::AsInt64() const {
  if (!IsInteger(type_)) return WrongType(type_, "an integer");
  const IntValue v = DecodeInt(type_, bits_);
  if (!v.negative && v.magnitude_bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return absl::InvalidArgumentError("GGUF integer does not fit in int64");
  return static_cast<int64_t>(v.magnitude_bits);
}

absl::StatusOr<double> GgufValue::AsFloat64() const {
  if (type_ == GgufValueType::kFloat32 || type_ == GgufValueType::kFloat64) return DecodeFloat(type_, bits_);
  if (IsInteger(type_)) {
    const IntValue v = DecodeInt(type_, bits_);
    return v.negative ? static_cast<double>(static_cast<int64_t>(v.magnitude_bits))
                      : static_cast<double>(v.magnitude_bits);
  }
  return WrongType(type_, "a number");
}

absl::StatusOr<bool> GgufValue::AsBool() const {
  if (type_ != GgufValueType::kBool) return WrongType(type_, "bool");
  return bits_ != 0;
}

absl::StatusOr<absl::string_view> GgufValue::AsString() const {
  if (type_ != GgufValueType::kString) return WrongType(type_, "string");
  return string_;
}

absl::StatusOr<std::vector<absl::string_view>> GgufValue::AsStringArray() const {
  if (type_ != GgufValueType::kArray || element_type_ != GgufValueType::kString)
    return WrongArrayType(type_, element_type_, "array of strings");
  return strings_;
}

absl::StatusOr<std::vector<int64_t>> GgufValue::AsIntArray() const {
  if (type_ != GgufValueType::kArray || !IsInteger(element_type_))
    return WrongArrayType(type_, element_type_, "array of integers");
  const int n = ScalarBytes(element_type_);
  std::vector<int64_t> out(count_);
  for (uint64_t i = 0; i < count_; ++i) {
    const IntValue v = DecodeInt(element_type_, LoadLittleEndian(elements_ + i * n, n));
    if (!v.negative && v.magnitude_bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return absl::InvalidArgumentError("GGUF array element does not fit in int64");
    out[i] = static_cast<int64_t>(v.magnitude_bits);
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufValue::AsFloatArray() const {
  if (type_ != GgufValueType::kArray) return WrongArrayType(type_, element_type_, "array of numbers");
  if (IsInteger(element_type_)) {
    ASSIGN_OR_RETURN(std::vector<int64_t> ints, AsIntArray());
    return std::vector<double>(ints.begin(), ints.end());
  }
  if (element_type_ != GgufValueType::kFloat32 && element_type_ != GgufValueType::kFloat64)
    return WrongArrayType(type_, element_type_, "array of numbers");
  const int n = ScalarBytes(element_type_);
  std::vector<double> out(count_);
  for (uint64_t i = 0; i < count_; ++i) out[i] = DecodeFloat(element_type_, LoadLittleEndian(elements_ + i * n, n));
  return out;
}

int64_t GgufTensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Cursor over the file's bytes; every read checks the remaining length first.
class GgufParser {
 public:
  explicit GgufParser(absl::Span<const uint8_t> bytes) : bytes_(bytes) {}

  absl::Status Parse(GgufFile& file);

 private:
  uint64_t remaining() const { return bytes_.size() - pos_; }

  absl::Status Truncated(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("GGUF truncated: ", what, " at byte ", pos_,
                                                   " runs past the end (file is ", bytes_.size(), " bytes)"));
  }

  absl::StatusOr<uint64_t> ReadUint(int n, absl::string_view what) {
    if (remaining() < static_cast<uint64_t>(n)) return Truncated(what);
    const uint64_t v = LoadLittleEndian(bytes_.data() + pos_, n);
    pos_ += n;
    return v;
  }

  absl::StatusOr<absl::string_view> ReadString(absl::string_view what) {
    ASSIGN_OR_RETURN(const uint64_t len, ReadUint(8, what));
    if (len > remaining()) return Truncated(absl::StrCat(what, " (length ", len, ")"));
    absl::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  absl::Status ReadValue(GgufValueType type, GgufValue& out, absl::string_view key, int depth);

  absl::Span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

absl::Status GgufParser::ReadValue(GgufValueType type, GgufValue& out, absl::string_view key, int depth) {
  out.type_ = type;
  if (type == GgufValueType::kString) {
    ASSIGN_OR_RETURN(out.string_, ReadString(absl::StrCat("string value of '", key, "'")));
    return absl::OkStatus();
  }
  if (type != GgufValueType::kArray) {
    ASSIGN_OR_RETURN(out.bits_, ReadUint(ScalarBytes(type), absl::StrCat("value of '", key, "'")));
    return absl::OkStatus();
  }
  if (depth >= kMaxArrayNesting)
    return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "': arrays nested too deep"));
  ASSIGN_OR_RETURN(const uint64_t elem_type, ReadUint(4, "array element type"));
  if (!IsKnownValueType(elem_type))
    return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "': unknown array element type ", elem_type));
  out.element_type_ = static_cast<GgufValueType>(elem_type);
  ASSIGN_OR_RETURN(out.count_, ReadUint(8, "array length"));
  const int elem_bytes = ScalarBytes(out.element_type_);
  if (elem_bytes != 0) {
    if (out.count_ > remaining() / elem_bytes)
      return Truncated(absl::StrCat("array '", key, "' of ", out.count_, " elements"));
    out.elements_ = bytes_.data() + pos_;
    pos_ += out.count_ * elem_bytes;
    return absl::OkStatus();
  }
  // Strings take at least 8 bytes each and arrays at least 12: bound the count before reserving.
  const uint64_t min_elem_bytes = out.element_type_ == GgufValueType::kString ? 8 : 12;
  if (out.count_ > remaining() / min_elem_bytes)
    return Truncated(absl::StrCat("array '", key, "' of ", out.count_, " elements"));
  if (out.element_type_ == GgufValueType::kString) {
    out.strings_.reserve(out.count_);
    for (uint64_t i = 0; i < out.count_; ++i) {
      ASSIGN_OR_RETURN(absl::string_view s, ReadString(absl::StrCat("element ", i, " of '", key, "'")));
      out.strings_.push_back(s);
    }
    return absl::OkStatus();
  }
  // An element of an array of arrays is itself an array without a type tag of its own: its
  // element type, its count and its elements (as gguf-py writes and llama.cpp reads them).
  out.nested_.resize(out.count_);
  for (uint64_t i = 0; i < out.count_; ++i)
    RETURN_IF_ERROR(ReadValue(GgufValueType::kArray, out.nested_[i], key, depth + 1));
  return absl::OkStatus();
}

absl::Status GgufParser::Parse(GgufFile& file) {
  ASSIGN_OR_RETURN(const uint64_t magic, ReadUint(4, "magic"));
  if (magic != kGgufMagic) return absl::InvalidArgumentError("not a GGUF file: wrong magic (expected \"GGUF\")");
  ASSIGN_OR_RETURN(const uint64_t version, ReadUint(4, "version"));
  if (version != 2 && version != 3)
    return absl::InvalidArgumentError(absl::StrCat("unsupported GGUF version ", version, " (supported: 2, 3)"));
  file.version_ = static_cast<uint32_t>(version);
  ASSIGN_OR_RETURN(const uint64_t n_tensors, ReadUint(8, "tensor count"));
  ASSIGN_OR_RETURN(const uint64_t n_kv, ReadUint(8, "metadata count"));
  // A key-value pair takes at least 8 + 4 + 1 bytes, a tensor info at least 8 + 4 + 8 + 4 + 8.
  if (n_kv > remaining() / 13) return Truncated(absl::StrCat(n_kv, " metadata entries"));
  if (n_tensors > remaining() / 32) return Truncated(absl::StrCat(n_tensors, " tensor infos"));

  std::unordered_set<std::string_view> keys;
  file.metadata_.resize(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufMetadataEntry& e = file.metadata_[i];
    ASSIGN_OR_RETURN(e.key, ReadString("metadata key"));
    if (!keys.insert(std::string_view(e.key.data(), e.key.size())).second)
      return absl::InvalidArgumentError(absl::StrCat("GGUF metadata key '", e.key, "' appears twice"));
    ASSIGN_OR_RETURN(const uint64_t type, ReadUint(4, "metadata value type"));
    if (!IsKnownValueType(type))
      return absl::InvalidArgumentError(absl::StrCat("GGUF key '", e.key, "' has unknown value type ", type));
    RETURN_IF_ERROR(ReadValue(static_cast<GgufValueType>(type), e.value, e.key, 0));
  }

  if (const GgufValue* a = file.FindValue("general.alignment")) {
    auto alignment = a->AsUint64();
    if (!alignment.ok() || *alignment == 0 || (*alignment & (*alignment - 1)) != 0 || *alignment > (1u << 20))
      return absl::InvalidArgumentError("GGUF general.alignment must be a power of two <= 1 MiB");
    file.alignment_ = *alignment;
  }

  std::unordered_set<std::string_view> names;
  file.tensors_.resize(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo& t = file.tensors_[i];
    ASSIGN_OR_RETURN(t.name, ReadString("tensor name"));
    if (!names.insert(std::string_view(t.name.data(), t.name.size())).second)
      return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", t.name, "' appears twice"));
    ASSIGN_OR_RETURN(const uint64_t n_dims, ReadUint(4, "tensor dimension count"));
    if (n_dims < 1 || n_dims > kMaxDims)
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF tensor '", t.name, "' has ", n_dims, " dimensions (1 to 4 allowed)"));
    uint64_t elements = 1;
    for (uint64_t d = 0; d < n_dims; ++d) {
      ASSIGN_OR_RETURN(const uint64_t ne, ReadUint(8, "tensor dimension"));
      // Bound each dimension and the product so sizes cannot overflow below.
      if (ne == 0 || ne > (uint64_t{1} << 40) || elements > (uint64_t{1} << 50) / ne)
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF tensor '", t.name, "' has dimension ", d, " of size ", ne, ", out of range"));
      elements *= ne;
      t.shape.push_back(static_cast<int64_t>(ne));
    }
    ASSIGN_OR_RETURN(const uint64_t type, ReadUint(4, "tensor type"));
    const std::optional<GgmlTypeTraits> traits = FindGgmlType(static_cast<uint32_t>(type));
    if (!traits || !traits->weight)
      return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", t.name, "' has tensor type ", type,
                                                     ", which mer does not support (supported: ", WeightTypeNames(),
                                                     ")"));
    t.type = static_cast<GgmlType>(type);
    if (t.shape[0] % traits->block_elements != 0)
      return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", t.name, "': row length ", t.shape[0],
                                                     " is not a multiple of the ", traits->name, " block size ",
                                                     traits->block_elements));
    t.size_bytes = elements / traits->block_elements * traits->block_bytes;
    ASSIGN_OR_RETURN(t.offset, ReadUint(8, "tensor offset"));
    if (t.offset % file.alignment_ != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF tensor '", t.name, "' offset ", t.offset, " is not aligned to ", file.alignment_));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t data_offset = (pos_ + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  if (data_offset > bytes_.size() && n_tensors > 0) return Truncated("tensor data section");
  file.data_offset_ = data_offset;
  const uint64_t data_size = bytes_.size() > data_offset ? bytes_.size() - data_offset : 0;
  for (GgufTensorInfo& t : file.tensors_) {
    if (t.offset > data_size || t.size_bytes > data_size - t.offset)
      return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", t.name, "' data (offset ", t.offset, ", ",
                                                     t.size_bytes, " bytes) lies outside the data section of ",
                                                     data_size, " bytes (truncated file?)"));
    t.data = bytes_.data() + data_offset + t.offset;
  }
  // No two tensors share bytes: a tensor whose type or shape was changed without moving the
  // others (its size then runs into its neighbour) is refused, as llama.cpp refuses it.
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(file.tensors_.size());
  for (const GgufTensorInfo& t : file.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& a = *by_offset[i - 1];
    const GgufTensorInfo& b = *by_offset[i];
    if (a.offset + a.size_bytes > b.offset)
      return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", a.name, "' (", TypeName(a.type), ", offset ",
                                                     a.offset, ", ", a.size_bytes, " bytes) overlaps tensor '", b.name,
                                                     "' at offset ", b.offset,
                                                     " (a wrong type or shape in its tensor info?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(absl::Span<const uint8_t> bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->bytes_ = bytes;
  GgufParser parser(bytes);
  RETURN_IF_ERROR(parser.Parse(*file));
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("cannot open model file ", path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::UnavailableError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  void* mapping = nullptr;
  if (st.st_size > 0) {
    mapping = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (mapping == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::ResourceExhaustedError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(err)));
    }
  }
  ::close(fd);
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->bytes_ = absl::Span<const uint8_t>(static_cast<const uint8_t*>(mapping), st.st_size);
  GgufParser parser(file->bytes_);
  absl::Status status = parser.Parse(*file);
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  return file;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, bytes_.size());
}

const GgufValue* GgufFile::FindValue(absl::string_view key) const {
  for (const GgufMetadataEntry& e : metadata_) {
    if (e.key == key) return &e.value;
  }
  return nullptr;
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  for (const GgufTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {
template <typename T>
absl::StatusOr<T> Annotate(absl::StatusOr<T> v, absl::string_view key) {
  if (v.ok()) return v;
  return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "': ", v.status().message()));
}
}  // namespace

#define MER_GGUF_GETTER(Name, Type, Method)                                                                 \
  absl::StatusOr<Type> GgufFile::Name(absl::string_view key) const {                                        \
    const GgufValue* v = FindValue(key);                                                                    \
    if (v == nullptr) return absl::NotFoundError(absl::StrCat("GGUF metadata key '", key, "' is missing")); \
    return Annotate(v->Method(), key);                                                                      \
  }
MER_GGUF_GETTER(GetUint64, uint64_t, AsUint64)
MER_GGUF_GETTER(GetFloat64, double, AsFloat64)
MER_GGUF_GETTER(GetString, absl::string_view, AsString)
MER_GGUF_GETTER(GetBool, bool, AsBool)
#undef MER_GGUF_GETTER

}  // namespace mer
