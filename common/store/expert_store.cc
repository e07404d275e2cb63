#include "common/store/expert_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <future>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/store/crc32c.h"
#include "common/store/store_internal.h"
#include "common/store/store_writer.h"

namespace mer {

using store_internal::ErrnoStatus;
using store_internal::JoinPath;
using store_internal::PreadFull;

namespace {

// The largest manifest a valid header can describe (1024 layers x 4096 experts).
constexpr uint64_t kMaxManifestBytes =
    kStoreHeaderBytes + 1024 * kStoreLayerBytes + uint64_t{1024} * 4096 * kStoreBlobEntryBytes + kStoreMaxSourceName;
constexpr uint64_t kVerifyChunkBytes = 64 << 20;

absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file of at most ", max_bytes, " bytes"));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  const absl::Status s = PreadFull(fd, bytes.data(), bytes.size(), 0, path);
  ::close(fd);
  RETURN_IF_ERROR(s);
  return bytes;
}

absl::StatusOr<uint64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  return static_cast<uint64_t>(st.st_size);
}

std::string BlobName(int layer, int expert) { return absl::StrCat("(layer ", layer, ", expert ", expert, ")"); }

}  // namespace

void AlignedFree::operator()(void* p) const { std::free(p); }

AlignedBuffer AllocateAligned(uint64_t bytes, uint64_t alignment) {
  const uint64_t rounded = std::max<uint64_t>(alignment, (bytes + alignment - 1) / alignment * alignment);
  void* p = std::aligned_alloc(alignment, rounded);
  CHECK_MSG(p != nullptr, "out of memory");
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

absl::StatusOr<StoreFileIdentity> FileIdentity(const std::string& path, uint64_t header_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  StoreFileIdentity id;
  struct stat st;
  absl::Status s;
  if (::fstat(fd, &st) != 0) {
    s = ErrnoStatus(errno, "cannot stat", path);
  } else {
    id.size = static_cast<uint64_t>(st.st_size);
    id.header_bytes = std::min(header_bytes, id.size);
    std::vector<uint8_t> buf(std::min<uint64_t>(id.header_bytes, 4 << 20));
    for (uint64_t off = 0; s.ok() && off < id.header_bytes; off += buf.size()) {
      const uint64_t n = std::min<uint64_t>(buf.size(), id.header_bytes - off);
      s = PreadFull(fd, buf.data(), n, off, path);
      if (s.ok()) id.header_crc = Crc32cExtend(id.header_crc, buf.data(), n);
    }
  }
  ::close(fd);
  RETURN_IF_ERROR(s);
  return id;
}

absl::StatusOr<int64_t> FileMtimeNs(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Open(const std::string& dir) {
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  store->dir_ = dir;
  const std::string manifest_path = JoinPath(dir, kStoreManifestFile);
  if (::access(manifest_path.c_str(), F_OK) != 0 && errno == ENOENT) return store_internal::NoStoreStatus(dir);
  ASSIGN_OR_RETURN(const std::string bytes, ReadSmallFile(manifest_path, kMaxManifestBytes));
  auto parsed = ParseManifest(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  if (!parsed.ok()) return Annotate(parsed.status(), manifest_path);
  store->manifest_ = std::move(*parsed);
  const StoreManifest& m = store->manifest_;

  const std::string experts = store->experts_path();
  ASSIGN_OR_RETURN(const uint64_t experts_size, FileSize(experts));
  if (experts_size != m.experts_bytes)
    return absl::DataLossError(absl::StrCat(experts, " is ", experts_size, " bytes, the manifest describes ",
                                            m.experts_bytes, " (", m.n_layer, " layers x ", m.n_expert, " experts x ",
                                            m.blob_stride, " bytes)",
                                            experts_size < m.experts_bytes ? ": truncated" : ""));
  const std::string dense = store->dense_path();
  ASSIGN_OR_RETURN(const uint64_t dense_size, FileSize(dense));
  if (dense_size != m.dense.size)
    return absl::DataLossError(absl::StrCat(dense, " is ", dense_size, " bytes, the manifest describes ", m.dense.size,
                                            ": not this store's dense.gguf"));
  ASSIGN_OR_RETURN(const StoreFileIdentity dense_id, FileIdentity(dense, m.dense.header_bytes));
  if (dense_id.header_crc != m.dense.header_crc)
    return absl::DataLossError(absl::StrCat(dense, ": header checksum 0x", absl::Hex(dense_id.header_crc),
                                            ", the manifest has 0x", absl::Hex(m.dense.header_crc),
                                            ": not this store's dense.gguf"));

  store->fd_ = ::open(experts.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  store->direct_ = store->fd_ >= 0;
  if (store->fd_ < 0 && errno == EINVAL) store->fd_ = ::open(experts.c_str(), O_RDONLY | O_CLOEXEC);
  if (store->fd_ < 0) return ErrnoStatus(errno, "cannot open", experts);
  return store;
}

ExpertStore::~ExpertStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string ExpertStore::experts_path() const { return JoinPath(dir_, kStoreExpertsFile); }
std::string ExpertStore::dense_path() const { return JoinPath(dir_, kStoreDenseFile); }

uint64_t ExpertStore::BlobOffset(int layer, int expert) const {
  CHECK(layer >= 0 && layer < n_layer() && expert >= 0 && expert < n_expert());
  return manifest_.blob(layer, expert).offset;
}

uint32_t ExpertStore::BlobCrc(int layer, int expert) const {
  CHECK(layer >= 0 && layer < n_layer() && expert >= 0 && expert < n_expert());
  return manifest_.blob(layer, expert).crc;
}

absl::Status ExpertStore::VerifyBlob(int layer, int expert, const void* bytes) const {
  const uint32_t want = BlobCrc(layer, expert);
  const uint32_t got = Crc32c(bytes, manifest_.blob_bytes);
  if (got == want) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("expert store ", dir_, ": blob ", BlobName(layer, expert), " at offset ",
                                          BlobOffset(layer, expert), " fails its checksum (CRC-32C 0x", absl::Hex(got),
                                          ", the manifest has 0x", absl::Hex(want), ")"));
}

ExpertWeights ExpertStore::ExpertView(int layer, int expert, const void* blob) const {
  CHECK(layer >= 0 && layer < n_layer() && expert >= 0 && expert < n_expert());
  CHECK(reinterpret_cast<uintptr_t>(blob) % kStoreMatrixAlignment == 0);
  const StoreLayer& l = manifest_.layers[layer];
  const uint8_t* base = static_cast<const uint8_t*>(blob);
  const int64_t embd = manifest_.n_embd, ff = manifest_.n_ff_exp;
  return {MatrixView{l.gate_type, embd, ff, base + l.gate_offset}, MatrixView{l.up_type, embd, ff, base + l.up_offset},
          MatrixView{l.down_type, ff, embd, base + l.down_offset}};
}

absl::Status ExpertStore::ReadBlob(int layer, int expert, void* buffer) const {
  if (direct_ && reinterpret_cast<uintptr_t>(buffer) % kStoreBlobAlignment != 0)
    return absl::InvalidArgumentError("ExpertStore::ReadBlob: the buffer must be 4096-byte aligned (O_DIRECT)");
  RETURN_IF_ERROR(PreadFull(fd_, buffer, manifest_.blob_bytes, BlobOffset(layer, expert), experts_path()));
  return VerifyBlob(layer, expert, buffer);
}

absl::StatusOr<StoreVerifyStats> ExpertStore::VerifyAll(const StoreVerifyOptions& options) const {
  const auto start = std::chrono::steady_clock::now();
  const StoreManifest& m = manifest_;
  const uint64_t n_blobs = m.blobs.size();
  const uint64_t total = m.experts_bytes + (options.dense ? m.dense.size : 0);
  const uint64_t per_chunk = std::max<uint64_t>(1, kVerifyChunkBytes / m.blob_stride);
  const uint64_t chunk_bytes = per_chunk * m.blob_stride;
  AlignedBuffer buffers[2] = {AllocateAligned(chunk_bytes), AllocateAligned(chunk_bytes)};
  const std::string path = experts_path();
  // Version 1 lays blobs out at index x stride, so a chunk of blobs is one contiguous read.
  const auto read_chunk = [&](uint64_t first, uint8_t* buf) {
    const uint64_t n = std::min(per_chunk, n_blobs - first);
    return PreadFull(fd_, buf, n * m.blob_stride, m.blobs[first].offset, path);
  };

  std::vector<uint64_t> bad;
  std::mutex bad_mu;
  StoreVerifyStats stats;
  std::future<absl::Status> pending = std::async(std::launch::async, read_chunk, uint64_t{0}, buffers[0].get());
  for (uint64_t first = 0, k = 0; first < n_blobs; first += per_chunk, ++k) {
    RETURN_IF_ERROR(pending.get());
    const uint64_t next = first + per_chunk;
    if (next < n_blobs) pending = std::async(std::launch::async, read_chunk, next, buffers[(k + 1) % 2].get());
    const uint8_t* buf = buffers[k % 2].get();
    const uint64_t n = std::min(per_chunk, n_blobs - first);
    store_internal::ParallelFor(static_cast<int64_t>(n), options.threads, [&](int64_t i) {
      const uint64_t index = first + static_cast<uint64_t>(i);
      if (Crc32c(buf + i * m.blob_stride, m.blob_bytes) != m.blobs[index].crc) {
        std::lock_guard<std::mutex> lock(bad_mu);
        bad.push_back(index);
      }
    });
    stats.blobs += n;
    stats.bytes += n * m.blob_stride;
    if (options.progress) options.progress(stats.bytes, total);
  }
  if (!bad.empty()) {
    std::sort(bad.begin(), bad.end());
    std::vector<std::string> names;
    for (size_t i = 0; i < std::min<size_t>(bad.size(), 8); ++i)
      names.push_back(BlobName(static_cast<int>(bad[i] / m.n_expert), static_cast<int>(bad[i] % m.n_expert)));
    return absl::DataLossError(absl::StrCat("expert store ", dir_, ": ", bad.size(), " of ", n_blobs,
                                            " blobs fail their checksum: ", absl::StrJoin(names, ", "),
                                            bad.size() > names.size() ? ", ..." : ""));
  }

  if (options.dense) {
    const std::string dense = dense_path();
    const int fd = ::open(dense.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "cannot open", dense);
    uint32_t crc = 0;
    absl::Status s;
    for (uint64_t off = 0; s.ok() && off < m.dense.size; off += chunk_bytes) {
      const uint64_t n = std::min(chunk_bytes, m.dense.size - off);
      s = PreadFull(fd, buffers[0].get(), n, off, dense);
      if (s.ok()) crc = Crc32cExtend(crc, buffers[0].get(), n);
      stats.bytes += n;
    }
    ::close(fd);
    RETURN_IF_ERROR(s);
    if (crc != m.dense_crc)
      return absl::DataLossError(absl::StrCat(dense, ": checksum 0x", absl::Hex(crc), ", the manifest has 0x",
                                              absl::Hex(m.dense_crc), ": dense.gguf is damaged or not this store's"));
    if (options.progress) options.progress(stats.bytes, total);
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

absl::StatusOr<std::shared_ptr<const GgufFile>> ExpertStore::OpenDense() const {
  const std::string dense = dense_path();
  auto file = GgufFile::Open(dense);
  if (!file.ok()) return Annotate(file.status(), dense);
  std::shared_ptr<const GgufFile> shared(std::move(*file));
  const absl::Span<const uint8_t> bytes = shared->bytes();
  if (bytes.size() != manifest_.dense.size)
    return absl::DataLossError(absl::StrCat(dense, " is ", bytes.size(), " bytes, the manifest describes ",
                                            manifest_.dense.size, ": not this store's dense.gguf"));
  const uint32_t crc = Crc32c(bytes.data(), bytes.size());
  if (crc != manifest_.dense_crc)
    return absl::DataLossError(absl::StrCat(dense, ": checksum 0x", absl::Hex(crc), " over its ", bytes.size(),
                                            " bytes, the manifest has 0x", absl::Hex(manifest_.dense_crc),
                                            ": dense.gguf is damaged (`mer pack --force` writes the store again)"));
  const GgufValue* fingerprint = shared->FindValue(kDenseBlobTableCrcKey);
  const auto value =
      fingerprint == nullptr ? absl::StatusOr<uint64_t>(absl::NotFoundError("absent")) : fingerprint->AsUint64();
  if (!value.ok() || *value != BlobTableCrc(manifest_))
    return absl::DataLossError(absl::StrCat(
        dense, ": ", kDenseBlobTableCrcKey, value.ok() ? absl::StrCat(" is 0x", absl::Hex(*value)) : " is missing",
        ", the manifest's blob table has 0x", absl::Hex(BlobTableCrc(manifest_)), ": not this store's dense.gguf"));
  return shared;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ExpertStore::LoadDenseWeights() const {
  const std::string dense = dense_path();
  ASSIGN_OR_RETURN(std::shared_ptr<const GgufFile> shared, OpenDense());
  auto weights = ModelWeights::LoadDense(shared);
  if (!weights.ok()) return Annotate(weights.status(), dense);
  const ModelConfig& c = (*weights)->config();
  const StoreManifest& m = manifest_;
  if (c.n_layer != static_cast<int64_t>(m.n_layer) || c.n_expert != static_cast<int64_t>(m.n_expert) ||
      c.n_embd != static_cast<int64_t>(m.n_embd) || c.n_ff_exp != static_cast<int64_t>(m.n_ff_exp))
    return absl::InvalidArgumentError(absl::StrCat(
        dense, ": geometry (", c.n_layer, " layers, ", c.n_expert, " experts, n_embd ", c.n_embd, ", n_ff_exp ",
        c.n_ff_exp, ") is not the manifest's (", m.n_layer, ", ", m.n_expert, ", ", m.n_embd, ", ", m.n_ff_exp, ")"));
  return std::move(*weights);
}

absl::Status ExpertStore::CheckSource(const std::string& gguf_path) const {
  const StoreManifest& m = manifest_;
  ASSIGN_OR_RETURN(const StoreFileIdentity id, FileIdentity(gguf_path, m.source.header_bytes));
  ASSIGN_OR_RETURN(const int64_t mtime, FileMtimeNs(gguf_path));
  std::vector<std::string> diffs;
  if (id.size != m.source.size) diffs.push_back(absl::StrCat("size ", id.size, " vs ", m.source.size));
  if (mtime != m.source_mtime_ns) diffs.push_back(absl::StrCat("mtime ", mtime, " vs ", m.source_mtime_ns, " ns"));
  if (id.header_crc != m.source.header_crc)
    diffs.push_back(
        absl::StrCat("header checksum 0x", absl::Hex(id.header_crc), " vs 0x", absl::Hex(m.source.header_crc)));
  if (diffs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(gguf_path, " is not the file ", dir_, " was packed from (",
                                                    m.source_name, "): ", absl::StrJoin(diffs, ", ")));
}

}  // namespace mer
