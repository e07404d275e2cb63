#include "common/store/synth_store.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/base/threads.h"
#include "common/gguf/gguf_writer.h"
#include "common/store/crc32c.h"
#include "common/store/expert_store.h"
#include "common/store/manifest.h"
#include "common/store/store_internal.h"
#include "common/store/store_writer.h"

namespace mer {
namespace {

using store_internal::JoinPath;
using store_internal::SecondsSince;

constexpr uint64_t kDenseChunkBytes = 64 << 20;  // dense rows generated and appended per step

// The three merged expert tensors of one layer (ffn_{gate,up,down}_exps), whose rows e * n .. (e +
// 1) * n - 1 are expert e's matrix.
struct LayerExperts {
  const SynthTensor* part[3] = {};  // gate, up, down
};

// dense.gguf: the model's metadata, then the blob-table fingerprint, then every tensor but the
// merged experts, in file order -- what the packer's copy of the metadata and tensors gives.
absl::Status WriteDense(const SynthOptions& synth, const std::vector<SynthTensor>& tensors,
                        const std::vector<bool>& is_expert, const StoreManifest& m, const std::string& path,
                        int threads) {
  GgufWriter w;
  ASSIGN_OR_RETURN(const std::vector<SynthTensor> again, PlanSynthModel(synth, w));  // metadata
  (void)again;
  w.AddUint32(kDenseBlobTableCrcKey, BlobTableCrc(m));
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!is_expert[i]) w.AddTensor(tensors[i].name, tensors[i].type, tensors[i].shape);
  RETURN_IF_ERROR(w.Open(path));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (is_expert[i]) continue;
    const SynthTensor& t = tensors[i];
    const int64_t cols = t.shape[0];
    const int64_t rows = t.rows();
    const int64_t row_bytes = RowBytes(t.type, cols);
    const int64_t chunk_rows =
        std::min(rows, std::max<int64_t>(1, kDenseChunkBytes / std::max<int64_t>(row_bytes, cols * 4)));
    std::vector<uint8_t> chunk(chunk_rows * row_bytes);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - r0);
      store_internal::ParallelFor(n, threads, [&](int64_t r) {
        thread_local std::vector<float> scratch;
        scratch.resize(cols);
        SynthRows(t, r0 + r, 1, scratch.data(), chunk.data() + r * row_bytes);
      });
      RETURN_IF_ERROR(w.Append(absl::MakeConstSpan(chunk.data(), n * row_bytes)));
    }
  }
  RETURN_IF_ERROR(w.Finish());
  return store_internal::SyncPath(path, false);
}

}  // namespace

absl::StatusOr<PackStats> WriteSynthStore(const SynthOptions& synth, const std::string& dir, const PackOptions& pack) {
  const auto start = std::chrono::steady_clock::now();
  PackStats stats;
  GgufWriter whole;  // the GGUF `mer synth --out` would write: for the source identity only
  ASSIGN_OR_RETURN(const std::vector<SynthTensor> tensors, PlanSynthModel(synth, whole));
  for (const SynthTensor& t : tensors) whole.AddTensor(t.name, t.type, t.shape);
  const SynthGeometry& g = synth.geometry;

  // The experts: blk.L.ffn_{gate,up,down}_exps.weight.
  std::vector<LayerExperts> layers(g.n_layer);
  std::vector<bool> is_expert(tensors.size(), false);
  {
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < tensors.size(); ++i) index[tensors[i].name] = i;
    const char* parts[3] = {"gate", "up", "down"};
    for (int l = 0; l < g.n_layer; ++l) {
      for (int p = 0; p < 3; ++p) {
        auto it = index.find(absl::StrCat("blk.", l, ".ffn_", parts[p], "_exps.weight"));
        if (it == index.end())
          return absl::InternalError(absl::StrCat("synth store: layer ", l, " has no ", parts[p], " experts"));
        layers[l].part[p] = &tensors[it->second];
        is_expert[it->second] = true;
      }
    }
  }
  StoreManifest m = store_internal::LayoutManifest(
      g.n_layer, g.n_expert, g.n_embd, g.n_ff_exp,
      [&](int l) {
        return store_internal::LayerTypes{layers[l].part[0]->type, layers[l].part[1]->type, layers[l].part[2]->type};
      },
      &stats.expert_payload_bytes);
  const std::string header = whole.EncodeHeader();
  m.source.size = whole.FileBytes();
  m.source.header_bytes = header.size();
  m.source.header_crc = Crc32c(header.data(), header.size());
  m.source_mtime_ns = 0;
  m.source_name = absl::StrCat("mer synth (", g.n_layer, " layers x ", g.n_expert, " experts, seed ", synth.seed,
                               ", router skew ", synth.router_skew, "), never written");

  ASSIGN_OR_RETURN(store_internal::StagedStore staged, store_internal::StagedStore::Begin(dir, pack.overwrite));
  const std::string& out = staged.path();
  const int threads = ResolveThreads(pack.threads);
  store_internal::ExpertsFileOptions o;
  o.threads = threads;
  o.direct_io = pack.direct_io;
  // Generating a blob is much slower than copying one: batches of a few blobs per thread.
  o.batch_bytes = std::max<uint64_t>(64 << 20, uint64_t{4} * threads * m.blob_stride);
  const int n_expert = g.n_expert;
  int layers_done = 0;
  if (pack.progress)
    o.after_batch = [&](uint64_t end) {
      for (; layers_done < static_cast<int>(end / n_expert); ++layers_done) pack.progress(layers_done + 1, g.n_layer);
    };
  const auto fill = [&](int layer, int expert, uint8_t* blob) {
    const StoreLayer& l = m.layers[layer];
    const uint64_t offsets[3] = {l.gate_offset, l.up_offset, l.down_offset};
    thread_local std::vector<float> scratch;
    for (int p = 0; p < 3; ++p) {
      const SynthTensor& t = *layers[layer].part[p];
      const int64_t rows = t.shape[1];  // [cols, rows per expert, n_expert]
      scratch.resize(t.shape[0]);
      SynthRows(t, int64_t(expert) * rows, rows, scratch.data(), blob + offsets[p]);
    }
  };
  const auto experts_start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(store_internal::WriteExpertsFile(m, JoinPath(out, kStoreExpertsFile), fill, o, &stats.direct_io));
  stats.experts_seconds = SecondsSince(experts_start);
  RETURN_IF_ERROR(WriteDense(synth, tensors, is_expert, m, JoinPath(out, kStoreDenseFile), threads));
  for (bool e : is_expert) stats.dense_tensors += e ? 0 : 1;
  RETURN_IF_ERROR(store_internal::CommitStore(m, out, &stats));
  RETURN_IF_ERROR(staged.Publish());
  stats.seconds = SecondsSince(start);
  return stats;
}

}  // namespace mer
