#include "services/compute/cuda/vram_miss_service.h"

#include <cuda_runtime.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/stream_memops.h"

namespace mer::cuda {

absl::StatusOr<std::unique_ptr<VramMissService>> VramMissService::Create(ResidencyVram& residency,
                                                                         const VramMissServiceOptions& options,
                                                                         const uint8_t* ring, int32_t capacity,
                                                                         int32_t record_bytes, int32_t* slot_table,
                                                                         uint32_t* gates) {
  if (options.n_slots < options.n_expert + options.reserve_slots)
    return absl::FailedPreconditionError(absl::StrCat("an arena of ", options.n_slots,
                                                      " slots cannot take every expert of a layer (", options.n_expert,
                                                      ") beside ", options.reserve_slots, " reserved slots"));
  std::unique_ptr<VramMissService> s(
      new VramMissService(residency, options, ring, capacity, record_bytes, slot_table, gates));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  s->watchdog_ = std::thread([p = s.get()] { p->Watchdog(); });
  return s;
}

VramMissService::VramMissService(ResidencyVram& residency, const VramMissServiceOptions& options, const uint8_t* ring,
                                 int32_t capacity, int32_t record_bytes, int32_t* slot_table, uint32_t* gates)
    : residency_(residency),
      o_(options),
      reader_(ring, capacity, record_bytes, options.n_layer, options.n_expert, options.k),
      slot_table_(slot_table),
      gates_(gates),
      published_(options.n_layer, options.n_expert, options.policy, options.n_slots),
      attachment_(residency.attachment()) {
  CUDA_CHECK(cudaSetDevice(o_.device));
  CUDA_CHECK(cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(&stream_), cudaStreamNonBlocking));
  CUDA_CHECK(cudaMallocHost(&host_table_, int64_t(o_.n_layer) * o_.n_expert * 4));
  std::fill(host_table_, host_table_ + int64_t(o_.n_layer) * o_.n_expert, -1);
  missing_.reserve(o_.n_expert);
  place_row_.assign(o_.n_expert, -1);
  retirees_.reserve(o_.n_expert + o_.reserve_slots);
}

VramMissService::~VramMissService() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (watchdog_.joinable()) watchdog_.join();
  CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream_)));
  // Every expert the table published is unpinned: the engine frees the arena after this.
  for (int l = 0; l < o_.n_layer; ++l)
    for (int e = 0; e < o_.n_expert; ++e)
      if (published_.slot(l, e) >= 0) residency_.Unpin(l, e);
  CUDA_CHECK(cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream_)));
  CUDA_CHECK(cudaFreeHost(host_table_));
}

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void VramMissService::Loop() {
  CUDA_CHECK(cudaSetDevice(o_.device));
  RoutingRecord r;
  r.used.reserve(o_.n_expert);
  r.pred.reserve(o_.k);
  int idle_spins = 0;
  last_record_ns_.store(NowNs());
  while (!stop_.load(std::memory_order_relaxed)) {
    if (reader_.Next(&r)) {
      idle_spins = 0;
      last_record_ns_.store(NowNs(), std::memory_order_relaxed);
      position_.store(reader_.position(), std::memory_order_release);
      if (o_.debug && stats().records < 400)
        std::fprintf(stderr, "cuda: miss service: record step %u layer %u: %u used, %u missing, %u predicted\n",
                     r.header.step, r.header.layer, r.header.n_used, r.header.n_missing, r.header.n_pred);
      std::lock_guard<std::mutex> lock(mu_);
      Serve(r);
      continue;
    }
    // While a step runs a record comes every few microseconds and a miss must be seen at once;
    // between steps the thread sleeps.
    if (inflight_.load(std::memory_order_relaxed) > 0 || ++idle_spins < 20000) {
      _mm_pause();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

void VramMissService::WaitForRecords(uint64_t n) const {
  for (int spins = 0; position_.load(std::memory_order_acquire) < n && !stop_.load(std::memory_order_relaxed);
       ++spins) {
    if (spins < 4000) {
      _mm_pause();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(10));
    }
  }
}

void VramMissService::Watchdog() {
  int64_t last_report = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    const int64_t now = NowNs();
    if (inflight_.load(std::memory_order_relaxed) <= 0 || now - last_report < 2'000'000'000) continue;
    const int64_t serving_since = serving_since_ns_.load();
    if (serving_since != 0 && now - serving_since > 2'000'000'000) {
      last_report = now;
      std::fprintf(stderr,
                   "cuda: miss service: placing %d experts of layer %d (step %u) has taken %.1f s: waiting for "
                   "mer-residency\n",
                   serving_missing_.load(), serving_layer_.load(), serving_step_.load(), (now - serving_since) * 1e-9);
    } else if (serving_since == 0 && now - last_record_ns_.load() > 2'000'000'000) {
      last_report = now;
      std::fprintf(stderr,
                   "cuda: miss service: %d step(s) in flight and no routing record for %.1f s (records read %llu, "
                   "next position %llu)\n",
                   inflight_.load(), (now - last_record_ns_.load()) * 1e-9,
                   static_cast<unsigned long long>(stats().records), static_cast<unsigned long long>(position_.load()));
    }
  }
}

void VramMissService::UploadRow(int layer) {
  int32_t* host_row = host_table_ + int64_t(layer) * o_.n_expert;
  std::memcpy(host_row, published_.row(layer), int64_t(o_.n_expert) * 4);
  CUDA_CHECK(cudaMemcpyAsync(slot_table_ + int64_t(layer) * o_.n_expert, host_row, int64_t(o_.n_expert) * 4,
                             cudaMemcpyHostToDevice, reinterpret_cast<cudaStream_t>(stream_)));
}

void VramMissService::Serve(const RoutingRecord& r) {
  const int layer = static_cast<int>(r.header.layer);
  published_.Used(layer, r.used.data(), static_cast<int>(r.used.size()), r.header.step);
  residency_.Routed(layer, r.used);
  // The look-ahead's guesses for the next layer go to mer-residency after this layer's misses
  // are placed, not before: its copies into the arena run one after another, and a guess sent
  // first would start copies that this layer's demands, which the device waits for, queue behind.
  // Sent after, the guesses' copies run while the device computes this layer and the next one's
  // attention, where the link would otherwise wait for the next record.
  const bool predicts = !r.pred.empty() && layer + 1 < o_.n_layer;
  if (predicts && r.header.n_missing == 0) residency_.Predicted(layer + 1, r.pred);
  {
    std::lock_guard<std::mutex> l(stats_mu_);
    ++stats_.records;
    stats_.skipped = reader_.skipped();
    stats_.malformed = reader_.malformed();
  }
  if (r.header.n_missing == 0) return;  // the device opened the gate itself
  const auto t0 = std::chrono::steady_clock::now();
  missing_.clear();
  for (int32_t e : r.used)
    if (e >= 0 && e < o_.n_expert && published_.slot(layer, e) < 0) missing_.push_back(e);

  // Room: unpinned slots for the misses and the reserve. The device waits at this layer's gate,
  // so retiring anything outside this layer's used experts is safe now (published_experts.h).
  placed_rows_.clear();
  const int64_t over = published_.published() + int64_t(missing_.size()) + o_.reserve_slots - o_.n_slots;
  retirees_.clear();
  if (over > 0)
    published_.ChooseRetirees(static_cast<int>(over), layer, r.used.data(), static_cast<int>(r.used.size()),
                              &retirees_);
  for (int64_t key : retirees_) {
    const int l = static_cast<int>(key / o_.n_expert), e = static_cast<int>(key % o_.n_expert);
    published_.Unpublish(l, e);
    residency_.Unpin(l, e);
    if (std::find(placed_rows_.begin(), placed_rows_.end(), l) == placed_rows_.end()) placed_rows_.push_back(l);
  }

  absl::Status status;
  serving_layer_.store(layer);
  serving_step_.store(r.header.step);
  serving_missing_.store(static_cast<int>(missing_.size()));
  serving_since_ns_.store(NowNs());
  if (!missing_.empty()) {
    // Place writes the slots it got into a scratch row; they are published from there.
    std::fill(place_row_.begin(), place_row_.end(), -1);
    absl::StatusOr<int> demanded = residency_.Place(layer, missing_, place_row_.data(), stream_);
    if (predicts) residency_.Predicted(layer + 1, r.pred);
    if (residency_.attachment() != attachment_) {
      // A new mer-residency: what was pinned in the old one is void, and the new one may fill any
      // slot. Forget it all (every other expert misses again) and publish what is placed in the
      // new one: this layer's misses and also its hits, which the device decided on the old table
      // and reads after the gate from the row uploaded below.
      attachment_ = residency_.attachment();
      published_.Clear();
      placed_rows_.clear();
      for (int l = 0; l < o_.n_layer; ++l) placed_rows_.push_back(l);
      const size_t n_missing = missing_.size();
      for (int32_t e : r.used)
        if (e >= 0 && e < o_.n_expert &&
            std::find(missing_.begin(), missing_.begin() + n_missing, e) == missing_.begin() + n_missing)
          missing_.push_back(e);
      if (demanded.ok() && missing_.size() > n_missing) {
        const absl::StatusOr<int> hits =
            residency_.Place(layer, absl::MakeConstSpan(missing_).subspan(n_missing), place_row_.data(), stream_);
        demanded = hits.ok() ? absl::StatusOr<int>(*demanded + *hits) : hits.status();
      }
    }
    if (demanded.ok()) {
      for (int32_t e : missing_) published_.Publish(layer, e, place_row_[e]);
      std::lock_guard<std::mutex> l(stats_mu_);
      stats_.placed += missing_.size();
      stats_.demanded += static_cast<uint64_t>(*demanded);
    } else {
      status = demanded.status();
      // The gate opens anyway: the missing experts read the poison slot (zeros), the step ends,
      // and the engine returns the error for it.
      for (int32_t e : missing_) {
        published_.Publish(layer, e, o_.poison_slot);
        poisoned_.push_back(int64_t(layer) * o_.n_expert + e);
      }
    }
  } else if (predicts) {
    residency_.Predicted(layer + 1, r.pred);  // the device's misses were placed meanwhile
  }
  if (std::find(placed_rows_.begin(), placed_rows_.end(), layer) == placed_rows_.end()) placed_rows_.push_back(layer);
  for (int l : placed_rows_) UploadRow(l);
  // Opens the gate after the conversions and the rows: the step's wait sees every one of them.
  CHECK_MSG(StreamWrite(stream_, gates_ + layer, 1), "opening a layer gate (cuStreamWriteValue32) failed");
  serving_since_ns_.store(0);
  const auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (o_.debug || us > 1e6)
    std::fprintf(stderr,
                 "cuda: miss service: step %u layer %d: %zu missing of %u used, %zu retired, %lld published, "
                 "%.0f us%s%s\n",
                 r.header.step, layer, missing_.size(), r.header.n_used, retirees_.size(),
                 static_cast<long long>(published_.published()), us, status.ok() ? "" : ": ",
                 status.ok() ? "" : status.ToString().c_str());
  std::lock_guard<std::mutex> l(stats_mu_);
  ++stats_.layers_served;
  stats_.retired += retirees_.size();
  stats_.serve_us += static_cast<uint64_t>(us);
  if (!status.ok()) {
    ++stats_.failures;
    if (!has_error_.load()) {
      error_ = absl::Status(status.code(), absl::StrCat("layer ", layer, ": ", status.message()));
      has_error_.store(true);
    }
  }
}

absl::Status VramMissService::TakeError() {
  if (!has_error_.load()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  // The step that read the poison slot has completed (the caller synchronised): the entries go
  // back to -1 before the next step can read them.
  std::vector<int> rows;
  for (int64_t key : poisoned_) {
    const int l = static_cast<int>(key / o_.n_expert);
    published_.Unpublish(l, static_cast<int>(key % o_.n_expert));
    if (std::find(rows.begin(), rows.end(), l) == rows.end()) rows.push_back(l);
  }
  poisoned_.clear();
  for (int l : rows) UploadRow(l);
  CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream_)));
  absl::Status s = std::move(error_);
  error_ = absl::OkStatus();
  has_error_.store(false);
  return s;
}

VramMissServiceStats VramMissService::stats() const {
  std::lock_guard<std::mutex> l(stats_mu_);
  return stats_;
}

}  // namespace mer::cuda
