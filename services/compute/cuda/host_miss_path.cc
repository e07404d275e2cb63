// The host's side of misses (cuda_engine_impl.h): the arena's LRU and uploads when compute fills
// the arena itself (from the ExpertSource), the per-layer acquire when mer-residency places the
// experts over CUDA IPC, the look-ahead prefetch into VRAM, and Preload.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "services/compute/cuda/cuda_engine_impl.h"

namespace mer {

using namespace cuda_engine_internal;  // NOLINT: this library's own internals

void CudaEngine::Impl::Touch(int32_t s) { lru.MoveToFront(lru_nodes, s); }

int32_t CudaEngine::Impl::TakeVictim() {
  for (uint32_t s = lru.back(); s != kNilIndex; s = lru_nodes[s].prev) {  // least recent first
    if (pin_epoch[s] == epoch) continue;                                  // used by the pass being served
    if (owner[s] >= 0) {
      host_slot_table[owner[s]] = -1;
      --resident;
      ++stats.evictions;
    }
    owner[s] = -1;
    return s;
  }
  return -1;
}

void CudaEngine::Impl::FlushRepack(std::vector<cuda::TypedRepackJob>* jobs, int* staged, cudaStream_t s) {
  cuda::LaunchRepackByType(jobs->data(), static_cast<int>(jobs->size()), s);
  jobs->clear();
  *staged = 0;
}

void CudaEngine::Impl::UploadExpert(int layer, int expert, const ExpertWeights& ew, int32_t slot,
                                    std::vector<cuda::TypedRepackJob>* jobs, int* staged, cudaStream_t s,
                                    uint8_t* staging_base) {
  const ExpertLayout& el = expert_layout[layer];
  uint8_t* dst = arena + int64_t(slot) * slot_bytes;
  const MatrixView* parts[3] = {&ew.gate, &ew.up, &ew.down};
  const auto places = el.matrices();
  // Matrices in another device layout go as raw blocks into a staging slot, from which the repack
  // kernel writes them into the arena slot; the others are copied in place.
  const bool stage = NeedsRepack(el.gate.type) || NeedsRepack(el.up.type) || NeedsRepack(el.down.type);
  if (stage && *staged == o.staging_experts) FlushRepack(jobs, staged, s);
  uint8_t* stage_base = staging_base + int64_t(*staged) * slot_bytes;
  for (int i = 0; i < 3; ++i) {
    const cuda::ExpertMatrixPlace& m = *places[i];
    if (NeedsRepack(m.type)) {
      CUDA_CHECK(cudaMemcpyAsync(stage_base + m.offset, parts[i]->data, m.bytes, cudaMemcpyHostToDevice, s));
      jobs->push_back({DevTypeOf(m.type), {stage_base + m.offset, dst + m.offset, m.bytes, m.cols}});
    } else {
      CUDA_CHECK(cudaMemcpyAsync(dst + m.offset, parts[i]->data, m.bytes, cudaMemcpyHostToDevice, s));
    }
  }
  if (stage) ++*staged;
  const int32_t key = layer * c.n_expert + expert;
  owner[slot] = key;
  host_slot_table[key] = slot;
  ++resident;
  stats.expert_upload_bytes += el.bytes();
}

absl::Status CudaEngine::Impl::CheckView(int layer, int expert, const ExpertWeights& w) const {
  const ExpertLayout& el = expert_layout[layer];
  const auto ok = [](const MatrixView& mv, const cuda::ExpertMatrixPlace& m) {
    return mv.data != nullptr && mv.type == m.type && mv.rows == m.rows && mv.cols == m.cols;
  };
  if (ok(w.gate, el.gate) && ok(w.up, el.up) && ok(w.down, el.down)) return absl::OkStatus();
  const auto name = [](const cuda::ExpertMatrixPlace& m) {
    return absl::StrCat(TypeName(m.type), " [", m.rows, " x ", m.cols, "]");
  };
  return absl::FailedPreconditionError(absl::StrCat("cuda backend: layer ", layer, " expert ", expert,
                                                    " from the expert source is not gate ", name(el.gate), ", up ",
                                                    name(el.up), ", down ", name(el.down), ", the arena's layout"));
}

absl::Status CudaEngine::Impl::AcquireGroup(int layer, absl::Span<const int32_t> group) {
  CHECK(pending_release.empty());  // a source hands out a layer once between releases
  views.resize(group.size());
  if (absl::Status s = source.AcquireLayer(layer, group, absl::MakeSpan(views)); !s.ok()) {
    source.ReleaseLayer(layer);  // as the CPU engine does: a failed acquire holds nothing
    return s;
  }
  pending_release.push_back(layer);
  for (size_t i = 0; i < group.size(); ++i) RETURN_IF_ERROR(CheckView(layer, group[i], views[i]));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaEngine::Preload() {
  Impl& m = *impl_;
  m.MakeCurrent();
  const ModelConfig& c = config_;
  const int group_max = std::max(1, m.source.max_experts_per_acquire());
  int64_t loaded = 0;
  absl::Status status;
  // A large model takes minutes through a cold RAM tier: progress every few seconds on stderr
  // (mer-compute's log; `mer up` shows it while it waits).
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  const int64_t target = std::min<int64_t>(m.n_slots, m.held_experts);
  // Layer by layer, in groups the source can hand out at once; each group's copies are complete
  // (synchronised) before it is released.
  for (int l = 0; l < c.n_layer && m.resident < m.n_slots && status.ok(); ++l) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report >= std::chrono::seconds(3) && loaded > 0) {
      last_report = now;
      const double secs = std::chrono::duration<double>(now - t0).count();
      const double rate = loaded / secs;
      std::fprintf(stderr, "cuda: filling the arena: %lld of %lld experts (%.0f%%), %.1f experts/s, ETA %.0f s\n",
                   static_cast<long long>(loaded), static_cast<long long>(target), 100.0 * loaded / target, rate,
                   (target - loaded) / rate);
    }
    m.missing.clear();
    for (int e = 0; e < c.n_expert && m.resident + int64_t(m.missing.size()) < m.n_slots; ++e)
      if (m.host_slot_table[l * c.n_expert + e] < 0 && m.Runs(l, e)) m.missing.push_back(e);
    for (size_t g0 = 0; g0 < m.missing.size() && status.ok(); g0 += group_max) {
      const absl::Span<const int32_t> group(m.missing.data() + g0, std::min<size_t>(group_max, m.missing.size() - g0));
      status = m.AcquireGroup(l, group);
      if (status.ok()) {
        int staged = 0;
        ++m.epoch;
        for (size_t i = 0; i < group.size(); ++i) {
          const int32_t s = m.TakeVictim();
          CHECK(s >= 0);
          m.pin_epoch[s] = m.epoch;
          m.UploadExpert(l, group[i], m.views[i], s, &m.jobs, &staged, m.stream, m.staging);
          m.Touch(s);
          ++loaded;
        }
        if (!m.jobs.empty()) m.FlushRepack(&m.jobs, &staged, m.stream);
      }
      CUDA_CHECK(cudaStreamSynchronize(m.stream));
      m.ReleaseHeld();
    }
  }
  // The device table follows the host's, also after a failure part way.
  CUDA_CHECK(cudaMemcpyAsync(m.slot_table, m.host_slot_table, m.total_experts * 4, cudaMemcpyHostToDevice, m.stream));
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.stats.expert_upload_bytes = 0;  // preloading is not a miss
  RETURN_IF_ERROR(status);
  return loaded;
}

void CudaEngine::Impl::UploadSlotTable() {
  // The upload reads host memory when it runs: from a snapshot, so that the host may change its
  // table (a prefetch) before then. Every upload is followed by a Sync before the next one.
  std::memcpy(host_table_upload, host_slot_table, total_experts * 4);
  CUDA_CHECK(cudaMemcpyAsync(slot_table, host_table_upload, total_experts * 4, cudaMemcpyHostToDevice, stream));
  table_dirty = false;
}

// The host path of one layer: read its routing (one synchronisation), then run its experts in
// passes of at most n_slots experts each. A pass acquires its missing experts from the source in
// groups of at most max_experts_per_acquire() (a RAM tier smaller than a layer's experts), uploads
// them into LRU victims and launches the expert kernels. The views' memory must outlive the copies
// from it: the last group stays held until the next synchronisation (the next layer's routing
// read, or the end of the step) and an earlier group of the same pass or layer is released after a
// synchronisation of its own, since a source hands out a layer once between releases. Then the
// next layer's predicted uploads start (PrefetchLayer).
absl::Status CudaEngine::Impl::ServeLayerExperts(int layer, int n, const ExpertInput& x_act) {
  const int NE = c.n_expert, K = c.n_expert_used;
  const bool predicted = Predicts(layer, n, true);
  CUDA_CHECK(cudaMemcpyAsync(host_groups, groups.n_used, (NE + 2) * 4, cudaMemcpyDeviceToHost, stream));
  if (predicted) CUDA_CHECK(cudaMemcpyAsync(host_pred, pred_chosen, K * 4, cudaMemcpyDeviceToHost, stream));
  if (observer != nullptr)
    CUDA_CHECK(cudaMemcpyAsync(host_chosen, chosen, int64_t(n) * K * 4, cudaMemcpyDeviceToHost, stream));
  Sync();
  ReleaseHeld();  // the previous layer's uploads are complete
  // So are those of a prefetch of an earlier layer (this stream waited for them at that layer).
  if (prefetch_held_layer >= 0 && prefetch_held_layer != layer) ReleasePrefetchHold(true);
  if (observer != nullptr) observer->OnRouting(layer, absl::MakeConstSpan(host_chosen, n * K), K);
  const int n_used = host_groups[0];
  const int32_t* used = host_groups + 2;
  const auto t0 = std::chrono::steady_clock::now();
  if (residency_vram != nullptr) return ServeFromResidency(layer, n, x_act, used, n_used, predicted);
  const int group_max = std::max(1, source.max_experts_per_acquire());

  // This layer's prefetch (issued while the previous layer ran): nothing of it may be touched
  // before it has landed, so the stream waits for it here; its experts were useful or wasted.
  const bool had_prefetch = prefetch_layer == layer;
  if (had_prefetch) {
    CUDA_CHECK(cudaStreamWaitEvent(stream, prefetch_done, 0));
    for (int32_t e : prefetched) {
      if (std::find(used, used + n_used, e) != used + n_used)
        ++stats.vram_prefetch_useful;
      else
        ++stats.vram_prefetch_wasted;
    }
    prefetch_layer = -1;
  }
  const bool multi_pass = n_used > n_slots;

  absl::Status status;
  for (int u0 = 0; u0 < n_used && status.ok(); u0 += n_slots) {
    const int count = std::min(n_slots, n_used - u0);
    if (u0 > 0) {
      Sync();  // the previous pass read the slots this one may evict, and its copies are done
      ReleaseHeld();
    }
    ++epoch;
    missing.clear();
    for (int u = u0; u < u0 + count; ++u) {
      const int32_t s = host_slot_table[layer * NE + used[u]];
      if (s >= 0) {
        pin_epoch[s] = epoch;
      } else if (Runs(layer, used[u])) {  // another rank's expert is that rank's to run
        missing.push_back(used[u]);
      }
    }
    int staged = 0;
    for (size_t g0 = 0; g0 < missing.size(); g0 += group_max) {
      if (g0 > 0) {
        if (!jobs.empty()) FlushRepack(&jobs, &staged, stream);
        Sync();  // the copies from the group held are done
        ReleaseHeld();
      }
      const absl::Span<const int32_t> group(missing.data() + g0, std::min<size_t>(group_max, missing.size() - g0));
      // The source hands out a layer once between releases: a prefetch of this layer lets go first.
      if (prefetch_held_layer == layer) ReleasePrefetchHold(false);
      status = AcquireGroup(layer, group);
      if (!status.ok()) break;  // a group held is released after Forward's synchronisation
      for (size_t i = 0; i < group.size(); ++i) {
        const int32_t s = TakeVictim();
        CHECK(s >= 0);  // count <= n_slots and only this pass's experts are pinned
        pin_epoch[s] = epoch;
        UploadExpert(layer, group[i], views[i], s, &jobs, &staged, stream, staging);
        ++stats.expert_misses;
        table_dirty = true;
      }
    }
    if (!jobs.empty()) FlushRepack(&jobs, &staged, stream);
    // The device table follows the host's before anything reads it, also after a failure.
    if (table_dirty) UploadSlotTable();
    if (!status.ok()) break;
    for (int u = u0; u < u0 + count; ++u)
      if (Runs(layer, used[u])) Touch(host_slot_table[layer * NE + used[u]]);
    Mark("serve: sync, uploads");
    EnqueueExperts(layer, n, x_act, u0, count);
  }
  if (predicted && !multi_pass) PrefetchLayer(layer + 1);
  stats.upload_seconds_x1e6 +=
      static_cast<int64_t>(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  return status;
}

// The host path over CUDA IPC: mer-residency places the experts; each pass of at most n_slots
// experts is acquired (pinned) into the arena, its fresh fills converted, the device table
// updated, and its kernels launched. A pass's pins go at the next synchronisation (ReleaseHeld).
// The look-ahead's prediction becomes a hint (mer-residency moves it into VRAM if it can).
absl::Status CudaEngine::Impl::ServeFromResidency(int layer, int n, const ExpertInput& x_act, const int32_t* used,
                                                  int n_used, bool predicted) {
  const auto t0 = std::chrono::steady_clock::now();
  residency_vram->Routed(layer, absl::MakeConstSpan(used, n_used));
  if (predicted) residency_vram->Predicted(layer + 1, absl::MakeConstSpan(host_pred, c.n_expert_used));
  absl::Status status;
  for (int u0 = 0; u0 < n_used && status.ok(); u0 += n_slots) {
    const int count = std::min(n_slots, n_used - u0);
    if (u0 > 0) {
      Sync();  // the previous pass's kernels are done with the slots this one may need
      ReleaseHeld();
    }
    absl::StatusOr<int> demanded = residency_vram->Acquire(layer, absl::MakeConstSpan(used + u0, count),
                                                           host_slot_table + int64_t(layer) * c.n_expert, stream);
    if (!demanded.ok()) {
      status = demanded.status();
      break;
    }
    stats.expert_misses += *demanded;
    UploadSlotTable();
    Mark("serve: residency");
    EnqueueExperts(layer, n, x_act, u0, count);
  }
  stats.upload_seconds_x1e6 +=
      static_cast<int64_t>(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  return status;
}

bool CudaEngine::Impl::Predicts(int layer, int n, bool host_path) const {
  if (!o.vram_prefetch || !host_path || n != 1 || layer + 1 >= c.n_layer) return false;
  if (o.placement != nullptr) return false;         // a rank's arena holds all it runs
  if (n_slots < 4 * c.n_expert_used) return false;  // an arena this small has no room to guess
  // The prediction rides in the fused routing launch (EnqueueLayer).
  return layers[layer].router_type == GgmlType::kF32 && layers[layer + 1].router_type == GgmlType::kF32 &&
         cuda::RouterTopK1Supported(c.n_embd, c.n_expert);
}

// Uploads the predicted experts of `layer` that are not resident, on copy_stream, into LRU
// victims that the current pass does not use. Best effort: a source error leaves the demand path
// to report it. Never more than the prefetch staging holds, so it never waits for itself.
void CudaEngine::Impl::PrefetchLayer(int layer) {
  const int NE = c.n_expert, K = c.n_expert_used;
  prefetched.clear();
  std::vector<int32_t> ids;
  const int most = std::min(o.staging_experts, std::max(1, source.max_experts_per_acquire()));
  for (int j = 0; j < K && static_cast<int>(ids.size()) < most; ++j) {
    const int32_t e = host_pred[j];
    if (e < 0 || e >= NE || host_slot_table[layer * NE + e] >= 0) continue;
    if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
  }
  if (ids.empty()) return;
  // One hold at a time (a RAM tier may have few slots): the last prefetch's, if this layer had no
  // miss that released it, goes now.
  ReleasePrefetchHold(false);
  std::vector<ExpertWeights> views(ids.size());
  if (!source.AcquireLayer(layer, ids, absl::MakeSpan(views)).ok()) {
    source.ReleaseLayer(layer);
    return;
  }
  prefetch_held_layer = layer;
  std::vector<cuda::TypedRepackJob> jobs;
  int staged = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t s = TakeVictim();
    if (s < 0) break;
    pin_epoch[s] = epoch;  // not a victim of the rest of this step's layer
    UploadExpert(layer, ids[i], views[i], s, &jobs, &staged, copy_stream, prefetch_staging);
    Touch(s);
    prefetched.push_back(ids[i]);
    ++stats.vram_prefetch_issued;
  }
  if (!jobs.empty()) FlushRepack(&jobs, &staged, copy_stream);
  CUDA_CHECK(cudaEventRecord(prefetch_done, copy_stream));
  table_dirty = true;
  prefetch_layer = layer;
}

}  // namespace mer
