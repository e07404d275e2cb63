// Test scaffolding for mer-residency in-process: synthesized, packed stores (cached per geometry
// for the test binary's lifetime) and a ResidencyDaemon over a real segment, on its own thread or
// driven turn by turn, optionally reading through a FaultInjectingIoEngine.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/base/check.h"
#include "common/base/clock.h"
#include "common/io/fault_injecting_io_engine.h"
#include "common/model/synth_model.h"
#include "common/shm/client.h"
#include "common/shm/segment.h"
#include "common/shm/store_identity.h"
#include "common/store/expert_store.h"
#include "common/store/packer.h"
#include "services/residency/daemon/residency_daemon.h"
#include "tests/unit/process_temp_dir.h"

namespace mer::residency {

struct SynthStore {
  std::string gguf;   // the synthesized model
  std::string store;  // its packed expert store
};

// Synthesizes `geometry` in `quant` (seed 3) and packs it, once per (name, quant) per process,
// under this process's temporary directory; `name` names the geometry (one name, one geometry).
inline const SynthStore& SynthStoreForGeometry(const std::string& name, const SynthGeometry& geometry,
                                               SynthQuant quant) {
  static auto* cache = new std::map<std::pair<std::string, int>, SynthStore>();
  const auto key = std::make_pair(name, static_cast<int>(quant));
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  namespace fs = std::filesystem;
  const fs::path root =
      testing_support::ProcessTempDir("mer_daemon_test_") / (name + "_" + std::to_string(static_cast<int>(quant)));
  fs::create_directories(root);
  SynthOptions o;
  o.geometry = geometry;
  o.quant = quant;
  o.seed = 3;
  o.threads = 2;
  SynthStore s{(root / "m.gguf").string(), (root / "store").string()};
  CHECK(WriteSynthModel(o, s.gguf).ok());
  PackOptions po;
  po.threads = 2;
  CHECK(PackExpertStore(s.gguf, s.store, po).ok());
  return cache->emplace(key, s).first->second;
}
// Preset `preset` (common/model/synth_model.h) in `quant`, synthesized and packed once per process.
inline const SynthStore& SynthStoreFor(const std::string& preset, SynthQuant quant) {
  return SynthStoreForGeometry(preset, *SynthPreset(preset), quant);
}
inline const std::string& SynthStoreDir(const std::string& preset, SynthQuant quant) {
  return SynthStoreFor(preset, quant).store;
}

inline std::string UniqueName(const char* tag) {
  static int n = 0;
  return "mer-daemon-test-" + std::to_string(getpid()) + "-" + tag + "-" + std::to_string(n++);
}

class DaemonFixture {
 public:
  // Serves `store_dir` (default: the micro Q8_0 store); with `faults` non-empty (rules or
  // probabilities), reads go through a FaultInjectingIoEngine over pread. The daemon CHECKs its
  // invariants at every census, and reads the time from `clock`.
  explicit DaemonFixture(ResidencyOptions o = {}, std::vector<FaultRule> rules = {}, bool thread = true,
                         FaultInjectionOptions faults = {},
                         const std::string& store_dir = SynthStoreDir("micro", SynthQuant::kQ8_0),
                         VramUploaderFactory vram = {}, const Clock* clock = RealClock())
      : name_(UniqueName("d")) {
    o.check_invariants = true;
    auto store = ExpertStore::Open(store_dir);
    CHECK(store.ok());
    store_ = std::move(*store);
    shm::CreateOptions co;
    co.geometry = DaemonGeometry(*store_, o);
    auto seg = shm::ShmSegment::Create(name_, co);
    CHECK(seg.ok());
    seg_ = std::move(*seg);
    IoEngineOptions io;
    io.io_inflight_max = 8;
    auto engine = CreateIoEngine(IoEngineKind::kPread, io);
    CHECK(engine.ok());
    std::unique_ptr<IoEngine> e = std::move(engine->engine);
    faults.rules.insert(faults.rules.end(), rules.begin(), rules.end());
    if (!faults.rules.empty() || faults.error_probability > 0 || faults.short_read_probability > 0 ||
        faults.delay_probability > 0 || faults.bit_flip_probability > 0) {
      auto f = FaultInjectingIoEngine::Create(std::move(e), faults);
      CHECK(f.ok());
      faults_ = f->get();
      e = std::move(*f);
    }
    auto d = ResidencyDaemon::Create(*store_, seg_.get(), std::move(e), store_->experts_fd(), o, clock);
    CHECK(d.ok());
    daemon_ = std::move(*d);
    if (vram) daemon_->set_vram_uploader_factory(std::move(vram));
    if (thread) thread_ = std::thread([this] { CHECK(daemon_->Run(stop_).ok()); });
  }
  ~DaemonFixture() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  const ExpertStore& store() const { return *store_; }
  ResidencyDaemon& daemon() { return *daemon_; }
  shm::ShmSegment& segment() { return *seg_; }
  const std::string& name() const { return name_; }
  // The injector, when faults were given (owned by the daemon; its stats are read after Stop).
  const FaultInjectingIoEngine* faults() const { return faults_; }
  // Stops the daemon's thread (Run must have returned OK: the daemon survived everything) and
  // returns its counters.
  ResidencyCounters Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return daemon_->Snapshot();
  }

 private:
  std::string name_;
  std::unique_ptr<ExpertStore> store_;
  std::unique_ptr<shm::ShmSegment> seg_;
  std::unique_ptr<ResidencyDaemon> daemon_;
  FaultInjectingIoEngine* faults_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

inline std::unique_ptr<shm::ShmSegment> AttachCompute(const DaemonFixture& f) {
  auto s = shm::ShmSegment::Attach(f.name(), shm::ExpectedSegmentIdentity(f.store().manifest()));
  CHECK(s.ok());
  return std::move(*s);
}

// Acquires `expert` of `layer` in a step of its own (10 s deadline), shows its pinned bytes to
// `check` (may be empty), then releases it and ends the step. Returns Acquire's status.
inline absl::Status AcquireOne(shm::ResidencyClient& client, int layer, int32_t expert,
                               const std::function<void(absl::Span<const uint8_t>)>& check = {}) {
  absl::StatusOr<shm::Step> step = client.BeginStep();
  if (!step.ok()) return step.status();
  std::vector<shm::PinnedExpert> pinned;
  const int32_t experts[] = {expert};
  const absl::Status s =
      client.Acquire(*step, static_cast<uint32_t>(layer), experts, absl::Now() + absl::Seconds(10), &pinned);
  if (s.ok()) {
    if (check) check(pinned[0].bytes);
    client.Release(pinned);
  }
  client.EndStep(*step);
  return s;
}

}  // namespace mer::residency
