#include "services/residency/daemon/residency_counters.h"

#include "absl/strings/str_cat.h"

namespace mer::residency {

void ForEachCounter(const ResidencyCounters& c, const std::function<void(const char*, uint64_t)>& fn) {
  fn("lookups", c.lookups);
  fn("hits", c.hits);
  fn("misses", c.misses);
  fn("coalesced", c.coalesced);
  fn("loads", c.loads);
  fn("load_failures", c.load_failures);
  fn("reads", c.reads);
  fn("bytes_read", c.bytes_read);
  fn("read_errors", c.read_errors);
  fn("checksum_failures", c.checksum_failures);
  fn("refetches", c.refetches);
  fn("evictions", c.evictions);
  fn("slot_waits", c.slot_waits);
  fn("hints", c.hints);
  fn("compute_hits", c.compute_hits);
  fn("prefetch_issued", c.prefetch_issued);
  fn("warm_loads", c.warm_loads);
  fn("prefetch_useful", c.prefetch_useful);
  fn("prefetch_wasted", c.prefetch_wasted);
  fn("read_latency_us_total", c.read_latency_us_total);
  fn("read_latency_us_max", c.read_latency_us_max);
  fn("completions_sent", c.completions_sent);
  fn("stall_ns_total", c.stall_ns_total);
  fn("stalled_completions", c.stalled_completions);
  fn("io_inflight", c.io_inflight);
  fn("slots_free", c.slots_free);
  fn("slots_resident", c.slots_resident);
  fn("slots_pinned", c.slots_pinned);
  fn("slots_loading", c.slots_loading);
  fn("vram_arena_imports", c.vram_arena_imports);
  fn("vram_arena_refusals", c.vram_arena_refusals);
  fn("vram_lookups", c.vram_lookups);
  fn("vram_hits", c.vram_hits);
  fn("vram_misses", c.vram_misses);
  fn("vram_refused", c.vram_refused);
  fn("vram_fills_from_ram", c.vram_fills_from_ram);
  fn("vram_fills_from_store", c.vram_fills_from_store);
  fn("vram_uploads", c.vram_uploads);
  fn("vram_upload_bytes", c.vram_upload_bytes);
  fn("vram_evictions", c.vram_evictions);
  fn("vram_demotions", c.vram_demotions);
  fn("vram_demotion_bytes", c.vram_demotion_bytes);
  fn("vram_slot_waits", c.vram_slot_waits);
  fn("vram_prefetch_issued", c.vram_prefetch_issued);
  fn("vram_prefetch_useful", c.vram_prefetch_useful);
  fn("vram_prefetch_wasted", c.vram_prefetch_wasted);
  fn("vram_slots", c.vram_slots);
  fn("vram_slots_free", c.vram_slots_free);
  fn("vram_slots_resident", c.vram_slots_resident);
  fn("vram_slots_pinned", c.vram_slots_pinned);
  fn("vram_slots_filling", c.vram_slots_filling);
}

std::string FormatCounters(const ResidencyCounters& c) {
  std::string s;
  ForEachCounter(c, [&](const char* name, uint64_t v) { absl::StrAppend(&s, s.empty() ? "" : " ", name, "=", v); });
  if (c.reads > 0) absl::StrAppend(&s, " read_latency_us_mean=", c.read_latency_us_total / c.reads);
  return s;
}

}  // namespace mer::residency
