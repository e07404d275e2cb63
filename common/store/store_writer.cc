#include "common/store/store_writer.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/gguf/gguf_file.h"
#include "common/model/model_weights.h"
#include "common/store/crc32c.h"
#include "common/store/expert_store.h"
#include "common/store/store_internal.h"

namespace mer::store_internal {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Whole-file CRC-32C, read in pieces.
absl::StatusOr<uint32_t> FileCrc(const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  std::vector<uint8_t> buf(std::min<uint64_t>(size, 16 << 20));
  uint32_t crc = 0;
  absl::Status s;
  for (uint64_t off = 0; s.ok() && off < size; off += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), size - off);
    s = PreadFull(fd, buf.data(), n, off, path);
    if (s.ok()) crc = Crc32cExtend(crc, buf.data(), n);
  }
  ::close(fd);
  RETURN_IF_ERROR(s);
  return crc;
}

}  // namespace

StoreLayer LayoutLayer(GgmlType gate, GgmlType up, GgmlType down, int64_t n_embd, int64_t n_ff_exp) {
  StoreLayer l;
  l.gate_type = gate;
  l.up_type = up;
  l.down_type = down;
  l.gate_offset = 0;
  l.gate_bytes = static_cast<uint64_t>(n_ff_exp * RowBytes(gate, n_embd));
  l.up_offset = RoundUp(l.gate_offset + l.gate_bytes, kStoreMatrixAlignment);
  l.up_bytes = static_cast<uint64_t>(n_ff_exp * RowBytes(up, n_embd));
  l.down_offset = RoundUp(l.up_offset + l.up_bytes, kStoreMatrixAlignment);
  l.down_bytes = static_cast<uint64_t>(n_embd * RowBytes(down, n_ff_exp));
  return l;
}

void LayoutBlobs(StoreManifest& m) {
  uint64_t max_used = 0;
  for (const StoreLayer& l : m.layers) max_used = std::max(max_used, l.used_bytes());
  m.blob_bytes = RoundUp(max_used, kStoreBlobAlignment);
  m.blob_stride = m.blob_bytes;
  m.blobs.resize(static_cast<size_t>(m.n_layer) * m.n_expert);
  m.experts_bytes = m.blobs.size() * m.blob_stride;
}

StoreManifest LayoutManifest(int n_layer, int n_expert, int64_t n_embd, int64_t n_ff_exp,
                             const std::function<LayerTypes(int layer)>& types, uint64_t* payload_bytes) {
  StoreManifest m;
  m.n_layer = n_layer;
  m.n_expert = n_expert;
  m.n_embd = n_embd;
  m.n_ff_exp = n_ff_exp;
  m.layers.resize(n_layer);
  *payload_bytes = 0;
  for (int il = 0; il < n_layer; ++il) {
    const LayerTypes t = types(il);
    StoreLayer& l = m.layers[il];
    l = LayoutLayer(t.gate, t.up, t.down, n_embd, n_ff_exp);
    *payload_bytes += (l.gate_bytes + l.up_bytes + l.down_bytes) * m.n_expert;
  }
  LayoutBlobs(m);
  return m;
}

namespace {

constexpr const char* kStoreFiles[] = {kStoreManifestFile, kStoreExpertsFile, kStoreDenseFile, "manifest.tmp"};

bool IsStoreFile(const std::string& name) {
  for (const char* f : kStoreFiles)
    if (name == f) return true;
  return false;
}

// "/a/b/store" -> {"/a/b", "store"}; "store" -> {".", "store"}. Trailing slashes are dropped.
std::pair<std::string, std::string> SplitDir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  if (slash == std::string::npos) return {".", dir};
  return {slash == 0 ? "/" : dir.substr(0, slash), dir.substr(slash + 1)};
}

std::string StagingPrefix(const std::string& base) { return absl::StrCat(".", base, ".pack-"); }

// Staging directories of earlier packs of `base` in `parent` whose writer is gone.
void RemoveStaleStaging(const std::string& parent, const std::string& base) {
  const std::string prefix = StagingPrefix(base);
  DIR* d = ::opendir(parent.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)) continue;  // alive
    stale.push_back(JoinPath(parent, name.c_str()));
  }
  ::closedir(d);
  for (const std::string& s : stale) RemoveStoreFiles(s);
}

}  // namespace

absl::Status NoStoreStatus(const std::string& dir) {
  std::vector<std::string> present;
  for (const char* f : {kStoreExpertsFile, kStoreDenseFile}) {
    if (::access(JoinPath(dir, f).c_str(), F_OK) == 0) present.push_back(f);
  }
  if (!present.empty())
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": incomplete store (interrupted pack): ", absl::StrJoin(present, " and "),
                     " but no manifest; pack it again with `mer pack --force`"));
  const auto [parent, base] = SplitDir(dir);
  const std::string prefix = StagingPrefix(base);
  std::string staging;
  if (DIR* d = ::opendir(parent.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) staging = JoinPath(parent, e->d_name);
    }
    ::closedir(d);
  }
  if (!staging.empty())
    return absl::FailedPreconditionError(absl::StrCat(dir, ": no expert store: an interrupted pack left ", staging,
                                                      " (incomplete store); run `mer pack` again"));
  return absl::NotFoundError(
      absl::StrCat(dir, ": no expert store (", JoinPath(dir, kStoreManifestFile), " does not exist)"));
}

void RemoveStoreFiles(const std::string& dir) {
  for (const char* f : kStoreFiles) (void)::unlink(JoinPath(dir, f).c_str());
  (void)::rmdir(dir.c_str());
}

absl::StatusOr<StagedStore> StagedStore::Begin(const std::string& dir, bool overwrite) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(dir, " is not a directory"));
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus(errno, "cannot read", dir);
    std::vector<std::string> foreign;
    bool manifest = false;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      if (name == kStoreManifestFile) manifest = true;
      if (!IsStoreFile(name)) foreign.push_back(name);
    }
    ::closedir(d);
    if (manifest && !overwrite)
      return absl::AlreadyExistsError(
          absl::StrCat(dir, " already holds an expert store (", JoinPath(dir, kStoreManifestFile), " exists)"));
    if (!foreign.empty())
      return absl::InvalidArgumentError(absl::StrCat(dir, " holds files that are not an expert store's ('",
                                                     foreign.front(), "'): give a new or empty directory"));
  } else if (errno != ENOENT) {
    return ErrnoStatus(errno, "cannot stat", dir);
  }
  const auto [parent, base] = SplitDir(dir);
  RemoveStaleStaging(parent, base);
  std::string staging = JoinPath(parent, absl::StrCat(StagingPrefix(base), ::getpid(), "-XXXXXX").c_str());
  if (::mkdtemp(staging.data()) == nullptr) return ErrnoStatus(errno, "cannot create a directory beside", dir);
  ::chmod(staging.c_str(), 0755);  // mkdtemp makes it 0700; a store is read by the daemons' user
  return StagedStore(dir, std::move(staging));
}

StagedStore::StagedStore(StagedStore&& other) noexcept
    : dir_(std::move(other.dir_)), staging_(std::move(other.staging_)) {
  other.staging_.clear();
}

StagedStore::~StagedStore() {
  if (!staging_.empty()) RemoveStoreFiles(staging_);
}

absl::Status StagedStore::Publish() {
  RETURN_IF_ERROR(SyncPath(staging_, true));
  const std::string parent = SplitDir(dir_).first;
  bool exchanged = false;
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) == 0) {
    exchanged = true;  // the old store is at staging_ now
  } else if (errno == ENOENT) {
    if (::rename(staging_.c_str(), dir_.c_str()) != 0) return ErrnoStatus(errno, "cannot rename into", dir_);
  } else if (errno == EINVAL || errno == ENOSYS) {
    // No RENAME_EXCHANGE on this file system: move the old store aside, then the new one in.
    const std::string aside = absl::StrCat(staging_, ".old");
    if (::rename(dir_.c_str(), aside.c_str()) != 0) return ErrnoStatus(errno, "cannot rename", dir_);
    if (::rename(staging_.c_str(), dir_.c_str()) != 0) {
      const absl::Status s = ErrnoStatus(errno, "cannot rename into", dir_);
      (void)::rename(aside.c_str(), dir_.c_str());
      return s;
    }
    RETURN_IF_ERROR(SyncPath(parent, true));
    RemoveStoreFiles(aside);
    staging_.clear();
    return absl::OkStatus();
  } else {
    return ErrnoStatus(errno, "cannot exchange into", dir_);
  }
  RETURN_IF_ERROR(SyncPath(parent, true));
  if (exchanged) RemoveStoreFiles(staging_);
  staging_.clear();
  return absl::OkStatus();
}

absl::Status WriteExpertsFile(StoreManifest& m, const std::string& path, const BlobFiller& fill,
                              const ExpertsFileOptions& options, bool* direct_out) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = options.direct_io ? ::open(path.c_str(), flags | O_DIRECT, 0644) : -1;
  const bool direct = fd >= 0;
  *direct_out = direct;
  if (fd < 0) fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", path);

  const uint64_t n_blobs = m.blobs.size();
  const uint64_t stride = m.blob_stride;
  const uint64_t per_batch = std::max<uint64_t>(1, options.batch_bytes / stride);
  AlignedBuffer buffers[2] = {AllocateAligned(per_batch * stride), AllocateAligned(per_batch * stride)};
  // Buffered writes are pushed to disk as they go and then dropped from the page cache, so a
  // 30 GB store does not fill memory with dirty pages.
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
  std::future<absl::Status> pending;
  absl::Status status;
  for (uint64_t first = 0, k = 0; first < n_blobs && status.ok(); first += per_batch, ++k) {
    const uint64_t n = std::min(per_batch, n_blobs - first);
    if (options.before_batch) options.before_batch(first, n);
    uint8_t* buf = buffers[k % 2].get();
    ParallelFor(static_cast<int64_t>(n), options.threads, [&](int64_t i) {
      const uint64_t index = first + static_cast<uint64_t>(i);
      const int layer = static_cast<int>(index / n_expert);
      const int expert = static_cast<int>(index % n_expert);
      const StoreLayer& l = m.layers[layer];
      uint8_t* blob = buf + static_cast<uint64_t>(i) * stride;
      fill(layer, expert, blob);
      std::memset(blob + l.gate_offset + l.gate_bytes, 0, l.up_offset - l.gate_offset - l.gate_bytes);
      std::memset(blob + l.up_offset + l.up_bytes, 0, l.down_offset - l.up_offset - l.up_bytes);
      std::memset(blob + l.used_bytes(), 0, stride - l.used_bytes());
      m.blobs[index].offset = index * stride;
      m.blobs[index].crc = Crc32c(blob, m.blob_bytes);
    });
    if (pending.valid()) status = pending.get();
    if (!status.ok()) break;
    pending = std::async(std::launch::async, write_batch, buf, first * stride, n * stride);
    if (options.after_batch) options.after_batch(first + n);
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

absl::Status SyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus(err, "cannot fsync", path);
  return absl::OkStatus();
}

absl::Status CommitStore(StoreManifest& m, const std::string& dir, PackStats* stats) {
  const std::string dense_path = JoinPath(dir, kStoreDenseFile);
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

  const std::string manifest_path = JoinPath(dir, kStoreManifestFile);
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
  stats->manifest_bytes = bytes.size();
  stats->blob_bytes = m.blob_bytes;
  stats->blob_count = m.blobs.size();
  stats->experts_bytes = m.experts_bytes;
  stats->dense_bytes = m.dense.size;
  return absl::OkStatus();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace mer::store_internal
