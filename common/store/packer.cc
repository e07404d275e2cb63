#include "common/store/packer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "common/model/model_weights.h"
#include "common/store/crc32c.h"
#include "common/store/expert_store.h"
#include "common/store/manifest.h"
#include "common/store/store_internal.h"

namespace mer {

using store_internal::ErrnoStatus;
using store_internal::JoinPath;
using store_internal::PwriteFull;

namespace {

constexpr uint64_t kBatchBytes = 64 << 20;       // blobs filled and written per step
constexpr uint64_t kDensePieceBytes = 16 << 20;  // dense tensors are appended in pieces of this

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// madvise on the pages of [p, p + n) of the read-only model mapping. DONTNEED only drops the
// process's page table entries (the page cache keeps the file), so the range must lie wholly in
// pages of its own or re-reading a neighbour just faults it back in: harmless either way.
void Advise(const uint8_t* p, uint64_t n, int advice) {
  if (n == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, advice);
}

void AdviseLayer(const ModelWeights& w, int layer, int advice) {
  const LayerWeights& l = w.layers[layer];
  for (const MatrixView* m : {&l.gate_exps, &l.up_exps, &l.down_exps})
    Advise(m->data, static_cast<uint64_t>(m->rows) * m->row_bytes(), advice);
}

// Copies one metadata value with GgufWriter's typed adders, exactly: integer scalars are written
// as uint32 (uint64 for 64-bit types), floats as float32, integer arrays as int32 arrays, when
// the values fit; otherwise Unimplemented.
absl::Status CopyValue(GgufWriter& w, absl::string_view key, const GgufValue& v) {
  const auto unsupported = [&](absl::string_view why) {
    return absl::UnimplementedError(absl::StrCat("metadata key '", key, "': ", why,
                                                 " cannot be copied exactly by GgufWriter"));
  };
  using T = GgufValueType;
  switch (v.type()) {
    case T::kUint8: case T::kUint16: case T::kUint32: {
      ASSIGN_OR_RETURN(const uint64_t x, v.AsUint64());
      w.AddUint32(key, static_cast<uint32_t>(x));
      return absl::OkStatus();
    }
    case T::kUint64: {
      ASSIGN_OR_RETURN(const uint64_t x, v.AsUint64());
      w.AddUint64(key, x);
      return absl::OkStatus();
    }
    case T::kInt8: case T::kInt16: case T::kInt32: case T::kInt64: {
      ASSIGN_OR_RETURN(const int64_t x, v.AsInt64());
      if (x < 0) return unsupported(absl::StrCat("the negative ", GgufValueTypeName(v.type()), " ", x));
      if (v.type() == T::kInt64) {
        w.AddUint64(key, static_cast<uint64_t>(x));
      } else {
        w.AddUint32(key, static_cast<uint32_t>(x));
      }
      return absl::OkStatus();
    }
    case T::kFloat32: case T::kFloat64: {
      ASSIGN_OR_RETURN(const double x, v.AsFloat64());
      const float f = static_cast<float>(x);
      if (static_cast<double>(f) != x && !std::isnan(x)) return unsupported(absl::StrCat("the float64 ", x));
      w.AddFloat32(key, f);
      return absl::OkStatus();
    }
    case T::kBool: {
      ASSIGN_OR_RETURN(const bool b, v.AsBool());
      w.AddBool(key, b);
      return absl::OkStatus();
    }
    case T::kString: {
      ASSIGN_OR_RETURN(const absl::string_view s, v.AsString());
      w.AddString(key, s);
      return absl::OkStatus();
    }
    case T::kArray:
      break;
  }
  switch (v.element_type()) {
    case T::kString: {
      ASSIGN_OR_RETURN(const std::vector<absl::string_view> views, v.AsStringArray());
      std::vector<std::string> strings(views.begin(), views.end());
      w.AddStringArray(key, strings);
      return absl::OkStatus();
    }
    case T::kFloat32: case T::kFloat64: {
      ASSIGN_OR_RETURN(const std::vector<double> xs, v.AsFloatArray());
      std::vector<float> fs(xs.size());
      for (size_t i = 0; i < xs.size(); ++i) {
        fs[i] = static_cast<float>(xs[i]);
        if (static_cast<double>(fs[i]) != xs[i] && !std::isnan(xs[i]))
          return unsupported(absl::StrCat("float64 array element ", i));
      }
      w.AddFloat32Array(key, fs);
      return absl::OkStatus();
    }
    case T::kUint8: case T::kInt8: case T::kUint16: case T::kInt16: case T::kUint32:
    case T::kInt32: case T::kUint64: case T::kInt64: {
      auto xs = v.AsIntArray();
      if (!xs.ok()) return unsupported("an array element beyond int64");
      std::vector<int32_t> is(xs->size());
      for (size_t i = 0; i < xs->size(); ++i) {
        if ((*xs)[i] < std::numeric_limits<int32_t>::min() || (*xs)[i] > std::numeric_limits<int32_t>::max())
          return unsupported(absl::StrCat("array element ", i, " = ", (*xs)[i], " (beyond int32)"));
        is[i] = static_cast<int32_t>((*xs)[i]);
      }
      w.AddInt32Array(key, is);
      return absl::OkStatus();
    }
    default:
      return unsupported(absl::StrCat("an array of ", GgufValueTypeName(v.element_type())));
  }
}

absl::Status SyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus(err, "cannot fsync", path);
  return absl::OkStatus();
}

// Whole-file CRC-32C, read in pieces.
absl::StatusOr<uint32_t> FileCrc(const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  std::vector<uint8_t> buf(std::min<uint64_t>(size, kDensePieceBytes));
  uint32_t crc = 0;
  absl::Status s;
  for (uint64_t off = 0; s.ok() && off < size; off += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), size - off);
    s = store_internal::PreadFull(fd, buf.data(), n, off, path);
    if (s.ok()) crc = Crc32cExtend(crc, buf.data(), n);
  }
  ::close(fd);
  RETURN_IF_ERROR(s);
  return crc;
}

// experts.bin: batches of blobs, filled in parallel, each written while the next is filled.
absl::Status WriteExperts(const ModelWeights& w, StoreManifest& m, const std::string& path,
                          const PackOptions& options, bool& direct) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = options.direct_io ? ::open(path.c_str(), flags | O_DIRECT, 0644) : -1;
  direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", path);

  const uint64_t n_blobs = m.blobs.size();
  const uint64_t stride = m.blob_stride;
  const uint64_t per_batch = std::max<uint64_t>(1, kBatchBytes / stride);
  AlignedBuffer buffers[2] = {AllocateAligned(per_batch * stride), AllocateAligned(per_batch * stride)};
  // Buffered writes are pushed to disk as they go and then dropped from the page cache, so a
  // 30 GB pack does not fill memory with dirty pages.
  uint64_t flushed_to = 0;
  const auto write_batch = [&, fd](const uint8_t* buf, uint64_t offset, uint64_t bytes) -> absl::Status {
    RETURN_IF_ERROR(PwriteFull(fd, buf, bytes, offset, path));
    if (!direct) {
      (void)::sync_file_range(fd, offset, bytes, SYNC_FILE_RANGE_WRITE);
      if (offset > flushed_to) {
        (void)::sync_file_range(fd, flushed_to, offset - flushed_to,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        (void)::posix_fadvise(fd, flushed_to, offset - flushed_to, POSIX_FADV_DONTNEED);
        flushed_to = offset;
      }
    }
    return absl::OkStatus();
  };

  const int n_expert = static_cast<int>(m.n_expert);
  int advised = 0, released = 0;  // layers given MADV_WILLNEED / MADV_DONTNEED so far
  std::future<absl::Status> pending;
  absl::Status status;
  for (uint64_t first = 0, k = 0; first < n_blobs && status.ok(); first += per_batch, ++k) {
    const uint64_t n = std::min(per_batch, n_blobs - first);
    // Read ahead: the layers this batch and the next touch.
    const int last_layer = static_cast<int>(std::min(n_blobs, first + 2 * per_batch) - 1) / n_expert;
    for (; advised <= last_layer; ++advised) AdviseLayer(w, advised, MADV_WILLNEED);

    uint8_t* buf = buffers[k % 2].get();
    store_internal::ParallelFor(static_cast<int64_t>(n), options.threads, [&](int64_t i) {
      const uint64_t index = first + static_cast<uint64_t>(i);
      const int layer = static_cast<int>(index / n_expert);
      const int expert = static_cast<int>(index % n_expert);
      const StoreLayer& l = m.layers[layer];
      const ExpertWeights e = w.Expert(layer, expert);
      uint8_t* blob = buf + static_cast<uint64_t>(i) * stride;
      std::memcpy(blob + l.gate_offset, e.gate.data, l.gate_bytes);
      std::memset(blob + l.gate_offset + l.gate_bytes, 0, l.up_offset - l.gate_offset - l.gate_bytes);
      std::memcpy(blob + l.up_offset, e.up.data, l.up_bytes);
      std::memset(blob + l.up_offset + l.up_bytes, 0, l.down_offset - l.up_offset - l.up_bytes);
      std::memcpy(blob + l.down_offset, e.down.data, l.down_bytes);
      std::memset(blob + l.used_bytes(), 0, stride - l.used_bytes());
      m.blobs[index].offset = index * stride;
      m.blobs[index].crc = Crc32c(blob, m.blob_bytes);
    });
    if (pending.valid()) status = pending.get();
    if (!status.ok()) break;
    pending = std::async(std::launch::async, write_batch, buf, first * stride, n * stride);

    // Layers wholly packed no longer need their pages.
    const int done_layers = static_cast<int>((first + n) / n_expert);
    for (; released < done_layers; ++released) {
      AdviseLayer(w, released, MADV_DONTNEED);
      if (options.progress) options.progress(released + 1, static_cast<int>(m.n_layer));
    }
  }
  if (pending.valid()) {
    const absl::Status s = pending.get();
    if (status.ok()) status = s;
  }
  if (status.ok() && ::fdatasync(fd) != 0) status = ErrnoStatus(errno, "cannot fsync", path);
  if (!direct) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (::close(fd) != 0 && status.ok()) status = ErrnoStatus(errno, "cannot close", path);
  return status;
}

// dense.gguf: every metadata key of the source (but general.alignment, which GgufWriter fixes)
// plus the blob-table fingerprint, and every tensor but the merged experts, in source order.
absl::Status WriteDense(const GgufFile& file, const ModelWeights& w, const StoreManifest& m,
                        const std::string& path, uint64_t& tensors) {
  GgufWriter writer;
  for (const GgufMetadataEntry& e : file.metadata()) {
    if (e.key == "general.alignment" || e.key == kDenseBlobTableCrcKey) continue;
    RETURN_IF_ERROR(CopyValue(writer, e.key, e.value));
  }
  writer.AddUint32(kDenseBlobTableCrcKey, BlobTableCrc(m));
  std::set<std::string> expert_tensors;
  for (uint32_t il = 0; il < m.n_layer; ++il) {
    for (const char* part : {"gate", "up", "down"})
      expert_tensors.insert(absl::StrCat("blk.", il, ".ffn_", part, "_exps.weight"));
  }
  std::vector<const GgufTensorInfo*> dense;
  for (const GgufTensorInfo& t : file.tensors()) {
    if (expert_tensors.count(std::string(t.name)) != 0) continue;
    writer.AddTensor(t.name, t.type, t.shape);
    dense.push_back(&t);
  }
  RETURN_IF_ERROR(writer.Open(path));
  for (const GgufTensorInfo* t : dense) {
    for (uint64_t off = 0; off < t->size_bytes; off += kDensePieceBytes) {
      const uint64_t n = std::min(kDensePieceBytes, t->size_bytes - off);
      RETURN_IF_ERROR(writer.Append(absl::MakeConstSpan(t->data + off, n)));
      Advise(t->data + off, n, MADV_DONTNEED);
    }
  }
  RETURN_IF_ERROR(writer.Finish());
  tensors = dense.size();
  return SyncPath(path, false);
}

}  // namespace

absl::StatusOr<PackStats> PackExpertStore(const std::string& gguf_path, const std::string& dir,
                                          const PackOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  PackStats stats;
  ASSIGN_OR_RETURN(const int64_t mtime, FileMtimeNs(gguf_path));
  auto opened = GgufFile::Open(gguf_path);
  if (!opened.ok())
    return absl::Status(opened.status().code(), absl::StrCat(gguf_path, ": ", opened.status().message()));
  std::shared_ptr<const GgufFile> file(std::move(*opened));
  auto loaded = ModelWeights::Load(file);
  if (!loaded.ok())
    return absl::Status(loaded.status().code(), absl::StrCat(gguf_path, ": ", loaded.status().message()));
  const ModelWeights& w = **loaded;
  const ModelConfig& c = w.config();

  StoreManifest m;
  m.n_layer = c.n_layer;
  m.n_expert = c.n_expert;
  m.n_embd = c.n_embd;
  m.n_ff_exp = c.n_ff_exp;
  m.layers.resize(c.n_layer);
  uint64_t max_used = 0;
  for (int il = 0; il < c.n_layer; ++il) {
    const ExpertWeights e = w.Expert(il, 0);
    StoreLayer& l = m.layers[il];
    l.gate_type = e.gate.type;
    l.up_type = e.up.type;
    l.down_type = e.down.type;
    l.gate_offset = 0;
    l.gate_bytes = static_cast<uint64_t>(e.gate.rows * e.gate.row_bytes());
    l.up_offset = RoundUp(l.gate_offset + l.gate_bytes, kStoreMatrixAlignment);
    l.up_bytes = static_cast<uint64_t>(e.up.rows * e.up.row_bytes());
    l.down_offset = RoundUp(l.up_offset + l.up_bytes, kStoreMatrixAlignment);
    l.down_bytes = static_cast<uint64_t>(e.down.rows * e.down.row_bytes());
    max_used = std::max(max_used, l.used_bytes());
    stats.expert_payload_bytes += (l.gate_bytes + l.up_bytes + l.down_bytes) * m.n_expert;
  }
  m.blob_bytes = RoundUp(max_used, kStoreBlobAlignment);
  m.blob_stride = m.blob_bytes;
  m.blobs.resize(static_cast<size_t>(m.n_layer) * m.n_expert);
  m.experts_bytes = m.blobs.size() * m.blob_stride;
  ASSIGN_OR_RETURN(m.source, FileIdentity(gguf_path, file->data_offset()));
  m.source_mtime_ns = mtime;
  m.source_name = gguf_path.substr(0, kStoreMaxSourceName);

  // The directory; an existing store there loses its manifest first, so that an interrupted
  // pack never leaves a manifest describing files that are being rewritten.
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoStatus(errno, "cannot create", dir);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", dir);
  if (!S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(dir, " is not a directory"));
  const std::string manifest_path = JoinPath(dir, kStoreManifestFile);
  if (::access(manifest_path.c_str(), F_OK) == 0) {
    if (!options.overwrite)
      return absl::AlreadyExistsError(absl::StrCat(dir, " already holds an expert store (",
                                                   manifest_path, " exists)"));
    if (::unlink(manifest_path.c_str()) != 0) return ErrnoStatus(errno, "cannot remove", manifest_path);
  }

  const auto experts_start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(WriteExperts(w, m, JoinPath(dir, kStoreExpertsFile), options, stats.direct_io));
  stats.experts_seconds = Since(experts_start);

  const std::string dense_path = JoinPath(dir, kStoreDenseFile);
  RETURN_IF_ERROR(WriteDense(*file, w, m, dense_path, stats.dense_tensors));
  {
    // The dense file must load as the engine will load it; its identity goes into the manifest.
    auto dense = GgufFile::Open(dense_path);
    if (!dense.ok()) return absl::InternalError(absl::StrCat(dense_path, ": ", dense.status().message()));
    std::shared_ptr<const GgufFile> dense_file(std::move(*dense));
    auto dense_weights = ModelWeights::LoadDense(dense_file);
    if (!dense_weights.ok())
      return absl::InternalError(absl::StrCat(dense_path, ": ", dense_weights.status().message()));
    ASSIGN_OR_RETURN(m.dense, FileIdentity(dense_path, dense_file->data_offset()));
    ASSIGN_OR_RETURN(m.dense_crc, FileCrc(dense_path, m.dense.size));
  }

  const std::string bytes = SerializeManifest(m);
  const std::string tmp = manifest_path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", tmp);
  absl::Status s = PwriteFull(fd, bytes.data(), bytes.size(), 0, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoStatus(errno, "cannot fsync", tmp);
  ::close(fd);
  RETURN_IF_ERROR(s);
  if (::rename(tmp.c_str(), manifest_path.c_str()) != 0) return ErrnoStatus(errno, "cannot rename", tmp);
  RETURN_IF_ERROR(SyncPath(dir, true));

  stats.blob_bytes = m.blob_bytes;
  stats.blob_count = m.blobs.size();
  stats.experts_bytes = m.experts_bytes;
  stats.dense_bytes = m.dense.size;
  stats.manifest_bytes = bytes.size();
  stats.seconds = Since(start);
  return stats;
}

}  // namespace mer
