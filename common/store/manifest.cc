#include "common/store/manifest.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/store/crc32c.h"

namespace mer {
namespace {

// Field offsets in the 128-byte header (docs/expert_store.md).
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 8;
constexpr size_t kOffHeaderCrc = 12;
constexpr size_t kOffBodyCrc = 16;
constexpr size_t kOffHeaderSize = 20;
constexpr size_t kOffNLayer = 24;
constexpr size_t kOffNExpert = 28;
constexpr size_t kOffNEmbd = 32;
constexpr size_t kOffNFfExp = 36;
constexpr size_t kOffBlobBytes = 40;
constexpr size_t kOffBlobStride = 48;
constexpr size_t kOffExpertsBytes = 56;
constexpr size_t kOffDenseBytes = 64;
constexpr size_t kOffDenseHeaderBytes = 72;
constexpr size_t kOffDenseHeaderCrc = 80;
constexpr size_t kOffDenseCrc = 84;
constexpr size_t kOffSourceBytes = 88;
constexpr size_t kOffSourceMtime = 96;
constexpr size_t kOffSourceHeaderBytes = 104;
constexpr size_t kOffSourceHeaderCrc = 112;
constexpr size_t kOffSourceNameBytes = 116;
constexpr size_t kOffReserved = 120;  // 8 zero bytes

constexpr uint32_t kMaxLayers = 1024;
constexpr uint32_t kMaxExperts = 4096;
constexpr uint32_t kMaxEmbd = 1 << 16;
constexpr uint32_t kMaxFfExp = 1 << 18;
constexpr uint64_t kMaxBlobBytes = uint64_t{1} << 40;

uint64_t Load(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t Load32(const uint8_t* p) { return static_cast<uint32_t>(Load(p, 4)); }
uint64_t Load64(const uint8_t* p) { return Load(p, 8); }

void Store(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint32_t HeaderCrc(const uint8_t* header) {
  uint8_t copy[kStoreHeaderBytes];
  std::memcpy(copy, header, kStoreHeaderBytes);
  Store(copy + kOffHeaderCrc, 0, 4);
  return Crc32c(copy, kStoreHeaderBytes);
}

bool IsWeightType(uint32_t t) {
  const std::optional<GgmlTypeTraits> traits = FindGgmlType(t);
  return traits.has_value() && traits->weight;
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("expert store manifest: ", what));
}
absl::Status Loss(absl::string_view what) { return absl::DataLossError(absl::StrCat("expert store manifest: ", what)); }

// Reads one matrix of a layer entry: its type must be a weight type whose block divides `cols`,
// its size must be rows x RowBytes(type, cols), its offset a multiple of 64.
absl::Status ParseMatrix(const uint8_t* type_field, const uint8_t* offset_field, int layer, const char* name,
                         int64_t cols, int64_t rows, GgmlType& type, uint64_t& offset, uint64_t& bytes) {
  const uint32_t t = Load32(type_field);
  if (!IsWeightType(t)) return Invalid(absl::StrCat("layer ", layer, " ", name, " has unsupported tensor type ", t));
  type = static_cast<GgmlType>(t);
  if (!IsRowSizeValid(type, cols))
    return Invalid(absl::StrCat("layer ", layer, " ", name, ": row length ", cols, " is not a multiple of the ",
                                TypeName(type), " block"));
  offset = Load64(offset_field);
  bytes = Load64(offset_field + 8);
  const uint64_t want = static_cast<uint64_t>(RowBytes(type, cols)) * static_cast<uint64_t>(rows);
  if (bytes != want)
    return Invalid(absl::StrCat("layer ", layer, " ", name, " is ", bytes, " bytes, expected ", want, " (", rows,
                                " rows of ", cols, " ", TypeName(type), ")"));
  if (offset % kStoreMatrixAlignment != 0)
    return Invalid(
        absl::StrCat("layer ", layer, " ", name, " offset ", offset, " is not a multiple of ", kStoreMatrixAlignment));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StoreManifest> ParseManifest(absl::Span<const uint8_t> bytes, const ManifestParseOptions& options) {
  const uint8_t* h = bytes.data();
  if (bytes.size() < kStoreHeaderBytes) {
    if (bytes.size() >= 8 && std::memcmp(h, kStoreManifestMagic, 8) != 0)
      return Invalid("bad magic (not an expert store manifest)");
    return Loss(absl::StrCat("truncated: ", bytes.size(), " bytes, the header alone is ", kStoreHeaderBytes));
  }
  if (std::memcmp(h + kOffMagic, kStoreManifestMagic, 8) != 0)
    return Invalid(absl::StrCat("bad magic \"",
                                absl::CHexEscape(absl::string_view(reinterpret_cast<const char*>(h), 8)),
                                "\" (not an expert store manifest)"));
  StoreManifest m;
  m.version = Load32(h + kOffVersion);
  if (m.version != kStoreFormatVersion)
    return Invalid(absl::StrCat("format version ", m.version, "; this build reads version ", kStoreFormatVersion,
                                " (re-run mer pack)"));
  const uint32_t header_crc = Load32(h + kOffHeaderCrc);
  if (options.verify_checksums && header_crc != HeaderCrc(h))
    return Loss(absl::StrCat("header checksum mismatch (stored 0x", absl::Hex(header_crc), ", computed 0x",
                             absl::Hex(HeaderCrc(h)), ")"));
  const uint32_t header_size = Load32(h + kOffHeaderSize);
  if (header_size != kStoreHeaderBytes)
    return Invalid(absl::StrCat("header size ", header_size, ", version 1 has ", kStoreHeaderBytes));
  for (size_t i = kOffReserved; i < kStoreHeaderBytes; ++i)
    if (h[i] != 0) return Invalid(absl::StrCat("reserved header byte ", i, " is not zero"));

  m.n_layer = Load32(h + kOffNLayer);
  m.n_expert = Load32(h + kOffNExpert);
  m.n_embd = Load32(h + kOffNEmbd);
  m.n_ff_exp = Load32(h + kOffNFfExp);
  for (auto [v, max, name] : {std::tuple<uint32_t, uint32_t, const char*>{m.n_layer, kMaxLayers, "n_layer"},
                              {m.n_expert, kMaxExperts, "n_expert"},
                              {m.n_embd, kMaxEmbd, "n_embd"},
                              {m.n_ff_exp, kMaxFfExp, "n_ff_exp"}}) {
    if (v < 1 || v > max) return Invalid(absl::StrCat(name, " = ", v, " is out of range [1, ", max, "]"));
  }
  const uint64_t n_blobs = uint64_t{m.n_layer} * m.n_expert;  // <= 2^22

  m.blob_bytes = Load64(h + kOffBlobBytes);
  m.blob_stride = Load64(h + kOffBlobStride);
  m.experts_bytes = Load64(h + kOffExpertsBytes);
  if (m.blob_bytes == 0 || m.blob_bytes > kMaxBlobBytes || m.blob_bytes % kStoreBlobAlignment != 0)
    return Invalid(absl::StrCat("blob size ", m.blob_bytes, " is not a positive multiple of ", kStoreBlobAlignment,
                                " up to 2^40"));
  if (m.blob_stride < m.blob_bytes || m.blob_stride > kMaxBlobBytes || m.blob_stride % kStoreBlobAlignment != 0)
    return Invalid(absl::StrCat("blob stride ", m.blob_stride, " is not a multiple of ", kStoreBlobAlignment,
                                " in [blob size ", m.blob_bytes, ", 2^40]"));
  if (m.experts_bytes != n_blobs * m.blob_stride)  // <= 2^62: no overflow
    return Invalid(
        absl::StrCat("experts.bin size ", m.experts_bytes, " is not ", n_blobs, " blobs x stride ", m.blob_stride));

  m.dense.size = Load64(h + kOffDenseBytes);
  m.dense.header_bytes = Load64(h + kOffDenseHeaderBytes);
  m.dense.header_crc = Load32(h + kOffDenseHeaderCrc);
  m.dense_crc = Load32(h + kOffDenseCrc);
  if (m.dense.header_bytes < 24 || m.dense.header_bytes > m.dense.size)
    return Invalid(
        absl::StrCat("dense.gguf header size ", m.dense.header_bytes, " is not in [24, file size ", m.dense.size, "]"));
  m.source.size = Load64(h + kOffSourceBytes);
  m.source_mtime_ns = static_cast<int64_t>(Load64(h + kOffSourceMtime));
  m.source.header_bytes = Load64(h + kOffSourceHeaderBytes);
  m.source.header_crc = Load32(h + kOffSourceHeaderCrc);
  if (m.source.header_bytes < 24 || m.source.header_bytes > m.source.size)
    return Invalid(
        absl::StrCat("source header size ", m.source.header_bytes, " is not in [24, file size ", m.source.size, "]"));
  const uint32_t name_bytes = Load32(h + kOffSourceNameBytes);
  if (name_bytes > kStoreMaxSourceName)
    return Invalid(absl::StrCat("source name of ", name_bytes, " bytes (at most ", kStoreMaxSourceName, ")"));

  // The body: layer table, blob table, source name; its size follows from the header.
  const uint64_t layer_table = uint64_t{m.n_layer} * kStoreLayerBytes;
  const uint64_t blob_table = n_blobs * kStoreBlobEntryBytes;
  const uint64_t want_size = kStoreHeaderBytes + layer_table + blob_table + name_bytes;
  if (bytes.size() != want_size)
    return Loss(absl::StrCat(bytes.size() < want_size ? "truncated: " : "trailing bytes: ", bytes.size(),
                             " bytes, the header describes ", want_size, " (", m.n_layer, " layers, ", n_blobs,
                             " blobs, a ", name_bytes, "-byte source name)"));
  const uint32_t body_crc = Load32(h + kOffBodyCrc);
  if (options.verify_checksums) {
    const uint32_t crc = Crc32c(h + kStoreHeaderBytes, bytes.size() - kStoreHeaderBytes);
    if (crc != body_crc)
      return Loss(absl::StrCat("table checksum mismatch (stored 0x", absl::Hex(body_crc), ", computed 0x",
                               absl::Hex(crc), ")"));
  }

  const uint8_t* p = h + kStoreHeaderBytes;
  m.layers.resize(m.n_layer);
  uint64_t max_used = 0;
  for (uint32_t il = 0; il < m.n_layer; ++il, p += kStoreLayerBytes) {
    StoreLayer& l = m.layers[il];
    const int layer = static_cast<int>(il);
    RETURN_IF_ERROR(
        ParseMatrix(p + 0, p + 16, layer, "gate", m.n_embd, m.n_ff_exp, l.gate_type, l.gate_offset, l.gate_bytes));
    RETURN_IF_ERROR(ParseMatrix(p + 4, p + 32, layer, "up", m.n_embd, m.n_ff_exp, l.up_type, l.up_offset, l.up_bytes));
    RETURN_IF_ERROR(
        ParseMatrix(p + 8, p + 48, layer, "down", m.n_ff_exp, m.n_embd, l.down_type, l.down_offset, l.down_bytes));
    if (Load32(p + 12) != 0) return Invalid(absl::StrCat("layer ", layer, ": reserved field is not zero"));
    // gate, up, down in this order, not overlapping, inside the blob. Sizes are < 2^37 and
    // offsets are compared against blob_bytes <= 2^40 before they are added: no overflow.
    if (l.gate_offset > m.blob_bytes || l.up_offset > m.blob_bytes || l.down_offset > m.blob_bytes ||
        l.gate_offset + l.gate_bytes > l.up_offset || l.up_offset + l.up_bytes > l.down_offset ||
        l.down_offset + l.down_bytes > m.blob_bytes)
      return Invalid(absl::StrCat("layer ", layer, ": gate [", l.gate_offset, ", +", l.gate_bytes, "), up [",
                                  l.up_offset, ", +", l.up_bytes, "), down [", l.down_offset, ", +", l.down_bytes,
                                  ") are not in order inside a blob of ", m.blob_bytes, " bytes"));
    max_used = std::max(max_used, l.used_bytes());
  }
  if (m.blob_bytes - max_used >= kStoreBlobAlignment)
    return Invalid(absl::StrCat("blob size ", m.blob_bytes, " is more than one block above the ", max_used,
                                " bytes of the largest expert"));

  m.blobs.resize(n_blobs);
  for (uint64_t i = 0; i < n_blobs; ++i, p += kStoreBlobEntryBytes) {
    StoreBlob& b = m.blobs[i];
    b.offset = Load64(p);
    b.crc = Load32(p + 8);
    if (b.offset != i * m.blob_stride || Load32(p + 12) != 0)
      return Invalid(absl::StrCat("blob (layer ", i / m.n_expert, ", expert ", i % m.n_expert, ") at offset ", b.offset,
                                  ", version 1 places it at ", i * m.blob_stride));
  }
  m.source_name.assign(reinterpret_cast<const char*>(p), name_bytes);
  return m;
}

std::string SerializeManifest(const StoreManifest& m) {
  CHECK(m.layers.size() == m.n_layer);
  CHECK(m.blobs.size() == static_cast<size_t>(m.n_layer) * m.n_expert);
  CHECK(m.source_name.size() <= kStoreMaxSourceName);
  std::string out(kStoreHeaderBytes + m.layers.size() * kStoreLayerBytes + m.blobs.size() * kStoreBlobEntryBytes +
                      m.source_name.size(),
                  '\0');
  uint8_t* h = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(h + kOffMagic, kStoreManifestMagic, 8);
  Store(h + kOffVersion, m.version, 4);
  Store(h + kOffHeaderSize, kStoreHeaderBytes, 4);
  Store(h + kOffNLayer, m.n_layer, 4);
  Store(h + kOffNExpert, m.n_expert, 4);
  Store(h + kOffNEmbd, m.n_embd, 4);
  Store(h + kOffNFfExp, m.n_ff_exp, 4);
  Store(h + kOffBlobBytes, m.blob_bytes, 8);
  Store(h + kOffBlobStride, m.blob_stride, 8);
  Store(h + kOffExpertsBytes, m.experts_bytes, 8);
  Store(h + kOffDenseBytes, m.dense.size, 8);
  Store(h + kOffDenseHeaderBytes, m.dense.header_bytes, 8);
  Store(h + kOffDenseHeaderCrc, m.dense.header_crc, 4);
  Store(h + kOffDenseCrc, m.dense_crc, 4);
  Store(h + kOffSourceBytes, m.source.size, 8);
  Store(h + kOffSourceMtime, static_cast<uint64_t>(m.source_mtime_ns), 8);
  Store(h + kOffSourceHeaderBytes, m.source.header_bytes, 8);
  Store(h + kOffSourceHeaderCrc, m.source.header_crc, 4);
  Store(h + kOffSourceNameBytes, m.source_name.size(), 4);
  uint8_t* p = h + kStoreHeaderBytes;
  for (const StoreLayer& l : m.layers) {
    Store(p + 0, static_cast<uint32_t>(l.gate_type), 4);
    Store(p + 4, static_cast<uint32_t>(l.up_type), 4);
    Store(p + 8, static_cast<uint32_t>(l.down_type), 4);
    Store(p + 16, l.gate_offset, 8);
    Store(p + 24, l.gate_bytes, 8);
    Store(p + 32, l.up_offset, 8);
    Store(p + 40, l.up_bytes, 8);
    Store(p + 48, l.down_offset, 8);
    Store(p + 56, l.down_bytes, 8);
    p += kStoreLayerBytes;
  }
  for (const StoreBlob& b : m.blobs) {
    Store(p, b.offset, 8);
    Store(p + 8, b.crc, 4);
    p += kStoreBlobEntryBytes;
  }
  std::memcpy(p, m.source_name.data(), m.source_name.size());
  Store(h + kOffBodyCrc, Crc32c(h + kStoreHeaderBytes, out.size() - kStoreHeaderBytes), 4);
  Store(h + kOffHeaderCrc, HeaderCrc(h), 4);
  return out;
}

uint32_t BlobTableCrc(const StoreManifest& m) {
  uint8_t entry[kStoreBlobEntryBytes];
  uint32_t crc = 0;
  for (const StoreBlob& b : m.blobs) {
    std::memset(entry, 0, sizeof(entry));
    Store(entry, b.offset, 8);
    Store(entry + 8, b.crc, 4);
    crc = Crc32cExtend(crc, entry, sizeof(entry));
  }
  return crc;
}

}  // namespace mer
