// ResidencyCounters: what mer-residency counts, kept by the loop thread as plain integers and
// published as a snapshot (ResidencyDaemon::Snapshot) for the Prometheus exporter
// (services/residency/metrics/) and the counters printed at exit.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>

namespace mer::residency {

// Upper bounds (seconds) of the read latency histogram's buckets; one more bucket (+Inf) follows.
inline constexpr std::array<double, 14> kReadLatencyBucketsSeconds = {
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0};

// Everything the daemon counts since it started (times in microseconds unless the name says
// otherwise), and a few gauges of its state at the last publication.
struct ResidencyCounters {
  uint64_t lookups = 0;                // DemandRequests handled
  uint64_t hits = 0;                   // of those, resident in RAM already
  uint64_t misses = 0;                 // of those, not resident (a load started or joined)
  uint64_t compute_hits = 0;           // acquisitions compute found resident and pinned without a
                                       // demand (read from the table's hit counts, every census)
  uint64_t coalesced = 0;              // misses that joined a load already in flight
  uint64_t loads = 0;                  // blobs published resident
  uint64_t load_failures = 0;          // loads failed for good (DataLoss or an I/O error)
  uint64_t reads = 0;                  // blob reads completed (refetches included)
  uint64_t bytes_read = 0;             // bytes of those reads
  uint64_t read_errors = 0;            // reads the engine failed
  uint64_t checksum_failures = 0;      // blobs whose CRC did not match
  uint64_t refetches = 0;              // reads issued again after a failure
  uint64_t evictions = 0;              // residents removed to free a slot
  uint64_t slot_waits = 0;             // times a load waited for an unpinned slot
  uint64_t hints = 0;                  // hints consumed
  uint64_t prefetch_issued = 0;        // prefetch reads started
  uint64_t warm_loads = 0;             // reads started to warm the RAM tier (ResidencyOptions::warm)
  uint64_t prefetch_useful = 0;        // prefetched experts used (demanded, or hit by compute) before eviction
  uint64_t prefetch_wasted = 0;        // prefetched experts evicted (or failed) unused
  uint64_t read_latency_us_total = 0;  // sum over reads, submit to completion
  uint64_t read_latency_us_max = 0;
  uint64_t completions_sent = 0;
  // Sum over completions of demands that missed: demand popped -> its Completion pushed (ns).
  uint64_t stall_ns_total = 0;
  uint64_t stalled_completions = 0;  // completions counted in stall_ns_total
  // Read latency histogram: reads per bucket (not cumulative), bounds kReadLatencyBucketsSeconds,
  // the last one above all bounds.
  std::array<uint64_t, kReadLatencyBucketsSeconds.size() + 1> read_latency_buckets{};
  double read_latency_seconds_total = 0;  // the histogram's sum, at full resolution
  // Gauges: reads in flight, and the RAM slots by state (from the last census; they sum to the
  // slot count): pinned = a compute step holds it; loading = a read into it is in flight;
  // resident = holds a published expert, unpinned; free = no owner, unpinned.
  uint64_t io_inflight = 0;
  uint64_t slots_free = 0;
  uint64_t slots_resident = 0;
  uint64_t slots_pinned = 0;
  uint64_t slots_loading = 0;
  // VRAM tier (zero until compute exports an arena).
  uint64_t vram_arena_imports = 0;   // arenas imported
  uint64_t vram_arena_refusals = 0;  // exports refused (no CUDA, a bad export, an import error)
  uint64_t vram_lookups = 0;         // VRAM DemandRequests handled
  uint64_t vram_hits = 0;            // of those, in VRAM already
  uint64_t vram_misses = 0;          // of those, an upload started or joined
  uint64_t vram_refused = 0;         // of those, answered with an error (no arena)
  // Demanded VRAM fills by where the bytes were: in the RAM tier already, or read from the store
  // first (the RAM tier's misses on the served GPU path; mer_expert_misses_total{tier="ram"}).
  uint64_t vram_fills_from_ram = 0;
  uint64_t vram_fills_from_store = 0;
  uint64_t vram_uploads = 0;       // RAM -> VRAM copies completed and published
  uint64_t vram_upload_bytes = 0;  // bytes of those copies
  uint64_t vram_evictions = 0;     // VRAM residents unpublished to free a slot
  // Exclusive tiers: evicted VRAM residents copied back into a RAM slot (device layout), and
  // the bytes of those copies.
  uint64_t vram_demotions = 0;
  uint64_t vram_demotion_bytes = 0;
  uint64_t vram_slot_waits = 0;       // times an upload waited for an unpinned VRAM slot
  uint64_t vram_prefetch_issued = 0;  // uploads started for a prediction
  uint64_t vram_prefetch_useful = 0;  // of those, demanded or pinned by compute before eviction
  uint64_t vram_prefetch_wasted = 0;  // of those, evicted (or dropped) unused
  // Gauges: the arena's slots by state (they sum to vram_slots): pinned by a compute step,
  // filling (a copy in flight), resident (published, unpinned), free.
  uint64_t vram_slots = 0;
  uint64_t vram_slots_free = 0;
  uint64_t vram_slots_resident = 0;
  uint64_t vram_slots_pinned = 0;
  uint64_t vram_slots_filling = 0;
};

// Calls fn(name, value) for every counter (names in snake_case; for exporters and printing).
void ForEachCounter(const ResidencyCounters& c, const std::function<void(const char* name, uint64_t value)>& fn);
// "lookups=… hits=… …" on one line.
std::string FormatCounters(const ResidencyCounters& c);

}  // namespace mer::residency
