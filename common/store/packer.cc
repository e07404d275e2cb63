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
#include "common/store/store_writer.h"

namespace mer {

using store_internal::JoinPath;
using store_internal::SecondsSince;

namespace {

constexpr uint64_t kBatchBytes = 64 << 20;       // blobs filled and written per step
constexpr uint64_t kDensePieceBytes = 16 << 20;  // dense tensors are appended in pieces of this

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
    return absl::UnimplementedError(
        absl::StrCat("metadata key '", key, "': ", why, " cannot be copied exactly by GgufWriter"));
  };
  using T = GgufValueType;
  switch (v.type()) {
    case T::kUint8:
    case T::kUint16:
    case T::kUint32: {
      ASSIGN_OR_RETURN(const uint64_t x, v.AsUint64());
      w.AddUint32(key, static_cast<uint32_t>(x));
      return absl::OkStatus();
    }
    case T::kUint64: {
      ASSIGN_OR_RETURN(const uint64_t x, v.AsUint64());
      w.AddUint64(key, x);
      return absl::OkStatus();
    }
    case T::kInt8:
    case T::kInt16:
    case T::kInt32:
    case T::kInt64: {
      ASSIGN_OR_RETURN(const int64_t x, v.AsInt64());
      if (x < 0) return unsupported(absl::StrCat("the negative ", GgufValueTypeName(v.type()), " ", x));
      if (v.type() == T::kInt64) {
        w.AddUint64(key, static_cast<uint64_t>(x));
      } else {
        w.AddUint32(key, static_cast<uint32_t>(x));
      }
      return absl::OkStatus();
    }
    case T::kFloat32:
    case T::kFloat64: {
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
    case T::kFloat32:
    case T::kFloat64: {
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
    case T::kUint8:
    case T::kInt8:
    case T::kUint16:
    case T::kInt16:
    case T::kUint32:
    case T::kInt32:
    case T::kUint64:
    case T::kInt64: {
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

// experts.bin: each blob copied from the mapping; the source's pages are read ahead a batch or two
// early and dropped once their layer is packed.
absl::Status WriteExperts(const ModelWeights& w, StoreManifest& m, const std::string& path, const PackOptions& options,
                          bool& direct) {
  const int n_expert = static_cast<int>(m.n_expert);
  int advised = 0, released = 0;  // layers given MADV_WILLNEED / MADV_DONTNEED so far
  store_internal::ExpertsFileOptions o;
  o.threads = options.threads;
  o.direct_io = options.direct_io;
  o.batch_bytes = kBatchBytes;
  o.before_batch = [&](uint64_t first, uint64_t n) {
    // Read ahead: the layers this batch and the next touch.
    const int last_layer = static_cast<int>(std::min<uint64_t>(m.blobs.size(), first + 2 * n) - 1) / n_expert;
    for (; advised <= last_layer; ++advised) AdviseLayer(w, advised, MADV_WILLNEED);
  };
  o.after_batch = [&](uint64_t end) {
    // Layers wholly packed no longer need their pages.
    const int done_layers = static_cast<int>(end / n_expert);
    for (; released < done_layers; ++released) {
      AdviseLayer(w, released, MADV_DONTNEED);
      if (options.progress) options.progress(released + 1, static_cast<int>(m.n_layer));
    }
  };
  const auto fill = [&](int layer, int expert, uint8_t* blob) {
    const StoreLayer& l = m.layers[layer];
    const ExpertWeights e = w.Expert(layer, expert);
    std::memcpy(blob + l.gate_offset, e.gate.data, l.gate_bytes);
    std::memcpy(blob + l.up_offset, e.up.data, l.up_bytes);
    std::memcpy(blob + l.down_offset, e.down.data, l.down_bytes);
  };
  return store_internal::WriteExpertsFile(m, path, fill, o, &direct);
}

// dense.gguf: every metadata key of the source (but general.alignment, which GgufWriter fixes)
// plus the blob-table fingerprint, and every tensor but the merged experts, in source order.
absl::Status WriteDense(const GgufFile& file, const ModelWeights& w, const StoreManifest& m, const std::string& path,
                        uint64_t& tensors) {
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
  return store_internal::SyncPath(path, false);
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

  StoreManifest m = store_internal::LayoutManifest(
      c.n_layer, c.n_expert, c.n_embd, c.n_ff_exp,
      [&](int il) {
        const ExpertWeights e = w.Expert(il, 0);
        return store_internal::LayerTypes{e.gate.type, e.up.type, e.down.type};
      },
      &stats.expert_payload_bytes);
  ASSIGN_OR_RETURN(m.source, FileIdentity(gguf_path, file->data_offset()));
  m.source_mtime_ns = mtime;
  m.source_name = gguf_path.substr(0, kStoreMaxSourceName);

  ASSIGN_OR_RETURN(store_internal::StagedStore staged, store_internal::StagedStore::Begin(dir, options.overwrite));
  const std::string& out = staged.path();
  const auto experts_start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(WriteExperts(w, m, JoinPath(out, kStoreExpertsFile), options, stats.direct_io));
  stats.experts_seconds = SecondsSince(experts_start);
  RETURN_IF_ERROR(WriteDense(*file, w, m, JoinPath(out, kStoreDenseFile), stats.dense_tensors));
  RETURN_IF_ERROR(store_internal::CommitStore(m, out, &stats));
  RETURN_IF_ERROR(staged.Publish());
  stats.seconds = SecondsSince(start);
  return stats;
}

}  // namespace mer
