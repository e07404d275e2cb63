// mer-residency: opens an expert store, creates the shared-memory segment of an instance and
// serves the experts through its RAM tier until SIGTERM/SIGINT (then prints its counters, removes
// the segment and exits 0).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/daemon_main.h"
#include "common/base/flags.h"
#include "common/base/status.h"
#include "common/io/fault_injecting_io_engine.h"
#include "common/systemd/sd_notify.h"
#include "services/residency/daemon/host_pinning.h"
#include "services/residency/daemon/residency_daemon.h"
#include "services/residency/metrics/residency_metrics.h"

namespace {

constexpr char kHelp[] =
    R"(usage: mer-residency --store STORE_DIR --instance NAME --ram-budget BYTES|PERCENT%
                     [--io auto|uring|pread] [--policy lru|lfu|arc] [--prefetch] [--warm]
                     [--tiers auto|exclusive|inclusive] [--expert-share RANK/RANKS]
                     [--check-invariants]
                     [--io-inflight N] [--prefetch-inflight N] [--vram-prefetch-inflight N]
                     [--stats-interval SECONDS]
                     [--take-over] [--metrics-listen HOST:PORT|off] [--pin auto|off]
                     [--io-faults SPEC]

Serves the experts of STORE_DIR (written by `mer pack`) to `mer generate --residency NAME`
through the shared-memory segment /dev/shm/NAME, made by this user, mode 0660 (if another user
holds that name, /dev/shm/NAME.<16 hex digits> instead, which mer-compute finds by its owner).
--ram-budget is bytes (suffixes K, M, G, T: powers of 1024) or a percentage of all experts'
bytes ("10%"); the RAM tier holds budget / blob size slots (at least one; compute acquires a
layer's experts in groups of half the slots). --warm fills the RAM tier from the store at start,
while no demand waits (free slots only, layer by layer, io-inflight - 2 reads at a time; the log
says when it is done and at what rate the store read). --expert-share RANK/RANKS makes the
instance one expert-parallel rank's (mer-compute --expert-ranks RANKS gives each rank an instance
of its own): its share is expert e of every layer with e mod RANKS = RANK, the experts that rank
computes; a --ram-budget percentage is of the share's bytes, and --warm reads only the share (a
demand for any other expert is served all the same). --check-invariants CHECKs the tiers'
bookkeeping at every census (for tests: a violation aborts the daemon). With --pin auto (the
default) the RAM tier is page-locked with cudaHostRegister when a GPU and
the CUDA runtime are present (uploads to VRAM then run at the pinned rate); the log says whether
it was. When mer-compute exports its VRAM expert arena over CUDA IPC (--vram-arena residency,
its default with --backend cuda), this daemon fills it: uploads from the RAM tier on demand and
for confident predictions, evicting only unpinned slots (a build without CUDA refuses the arena,
saying so). --tiers: with exclusive tiers the RAM tier holds what the arena does not (an expert's
RAM copy goes once it is in VRAM; an expert evicted from VRAM is copied back into RAM), so the
two budgets add up; inclusive keeps every arena resident's RAM copy too; auto (the default) is
exclusive while the RAM tier cannot hold every expert. --vram-prefetch-inflight (default 3, at most
3 of the 4 copies in flight) bounds the copies into the arena made for predictions. Under systemd (Type=notify) it reports READY once serving and pings WatchdogSec= while
its loop turns. Counters go to stderr at exit and,
with --stats-interval, periodically. Prometheus metrics (docs/metrics.md) are served on
http://HOST:PORT/metrics (default 127.0.0.1:0: a free port, printed on stderr as
"metrics: http://127.0.0.1:PORT/metrics"); --metrics-listen off serves none. --io-faults (for
soak tests) injects faults into the store's reads, e.g. "seed=7,eio=0.01,short=0.05,flip=0.002":
per chunk read, the probability of an EIO, a short read, a flipped bit (and delay, delay_ms);
what fired is printed at exit.
)";

struct Args {
  std::string store, instance, budget, io = "auto", policy = "lru", tiers = "auto";
  std::string metrics_listen = "127.0.0.1:0";
  std::string pin = "auto";
  std::string io_faults;
  int expert_share_rank = 0, expert_share_ranks = 1;
  bool prefetch = false, take_over = false, warm = false, check_invariants = false;
  int64_t io_inflight = 16, prefetch_inflight = 2, vram_prefetch_inflight = 3;
  double stats_interval = 0;
};

absl::Status ParseArgs(int argc, char** argv, Args* a) {
  ASSIGN_OR_RETURN(const mer::Flags f,
                   mer::Flags::ParseMain(argc, argv,
                                         {"store", "instance", "ram-budget", "io", "policy", "tiers", "metrics-listen",
                                          "pin", "io-inflight", "prefetch-inflight", "vram-prefetch-inflight",
                                          "stats-interval", "io-faults", "expert-share"},
                                         {"prefetch", "take-over", "warm", "check-invariants"}));
  a->store = f.String("store");
  a->instance = f.String("instance");
  a->budget = f.String("ram-budget");
  a->io = f.String("io", a->io);
  a->policy = f.String("policy", a->policy);
  ASSIGN_OR_RETURN(a->tiers, f.OneOf("tiers", a->tiers, {"auto", "exclusive", "inclusive"}));
  a->metrics_listen = f.String("metrics-listen", a->metrics_listen);
  ASSIGN_OR_RETURN(a->pin, f.OneOf("pin", a->pin, {"auto", "off"}));
  a->prefetch = f.Has("prefetch");
  a->take_over = f.Has("take-over");
  a->warm = f.Has("warm");
  a->check_invariants = f.Has("check-invariants");
  a->io_faults = f.String("io-faults");
  ASSIGN_OR_RETURN(a->io_inflight, f.IntInRange("io-inflight", a->io_inflight, 1, 4096));
  ASSIGN_OR_RETURN(a->prefetch_inflight, f.IntInRange("prefetch-inflight", a->prefetch_inflight, 0, 4096));
  ASSIGN_OR_RETURN(a->vram_prefetch_inflight, f.IntInRange("vram-prefetch-inflight", a->vram_prefetch_inflight, 0, 3));
  ASSIGN_OR_RETURN(a->stats_interval, f.Double("stats-interval", a->stats_interval));
  if (a->stats_interval < 0) return absl::InvalidArgumentError("--stats-interval must be >= 0");
  if (f.Has("expert-share")) {
    const std::string share = f.String("expert-share");
    const std::vector<std::string> parts = absl::StrSplit(share, '/');
    mer::residency::ResidencyOptions o;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &o.expert_share_rank) ||
        !absl::SimpleAtoi(parts[1], &o.expert_share_ranks) || o.expert_share_ranks > 64 ||
        !mer::residency::CheckExpertShare(o).ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--expert-share '", share, "': RANK/RANKS with 1 <= RANKS <= 64 and 0 <= RANK < RANKS"));
    a->expert_share_rank = o.expert_share_rank;
    a->expert_share_ranks = o.expert_share_ranks;
  }
  if (a->store.empty() || a->instance.empty() || a->budget.empty())
    return absl::InvalidArgumentError("--store, --instance and --ram-budget are required");
  return absl::OkStatus();
}

// BYTES (optional K/M/G/T suffix) or PERCENT% of `total`.
absl::StatusOr<uint64_t> ParseBudget(const std::string& s, uint64_t total) {
  if (s.empty()) return absl::InvalidArgumentError("--ram-budget is empty");
  if (s.back() == '%') {
    double pct;
    if (!absl::SimpleAtod(s.substr(0, s.size() - 1), &pct) || pct <= 0 || pct > 100)
      return absl::InvalidArgumentError(absl::StrCat("--ram-budget: bad percentage '", s, "'"));
    return static_cast<uint64_t>(static_cast<double>(total) * pct / 100.0);
  }
  uint64_t mult = 1;
  std::string num = s;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(s.back())));
  if (last == 'K' || last == 'M' || last == 'G' || last == 'T') {
    mult = last == 'K' ? 1ull << 10 : last == 'M' ? 1ull << 20 : last == 'G' ? 1ull << 30 : 1ull << 40;
    num = s.substr(0, s.size() - 1);
  }
  uint64_t n;
  if (!absl::SimpleAtoi(num, &n) || n == 0)
    return absl::InvalidArgumentError(absl::StrCat("--ram-budget: bad value '", s, "'"));
  return n * mult;
}

absl::Status Main(const Args& a) {
  using namespace mer;
  using namespace mer::residency;
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertStore> store, ExpertStore::Open(a.store));
  ResidencyOptions o;
  o.expert_share_rank = a.expert_share_rank;
  o.expert_share_ranks = a.expert_share_ranks;
  // A percentage budget is of the experts this instance is there for: its share.
  const uint64_t share_bytes =
      uint64_t(store->n_layer()) * ShareExpertsPerLayer(o, store->n_expert()) * store->blob_bytes();
  ASSIGN_OR_RETURN(o.ram_budget_bytes, ParseBudget(a.budget, share_bytes));
  o.policy = a.policy;
  o.tiers = a.tiers;
  o.vram_prefetch_inflight_max = static_cast<int>(a.vram_prefetch_inflight);
  o.prefetch = a.prefetch;
  o.warm = a.warm;
  o.check_invariants = a.check_invariants;
  o.io_inflight_max = static_cast<int>(a.io_inflight);
  o.prefetch_inflight_max = static_cast<int>(a.prefetch_inflight);
  o.stats_interval = absl::Seconds(a.stats_interval);

  ASSIGN_OR_RETURN(const IoEngineKind kind, ParseIoEngineKind(a.io));
  IoEngineOptions io;
  io.io_inflight_max = o.io_inflight_max;
  ASSIGN_OR_RETURN(CreatedIoEngine engine, CreateIoEngine(kind, io));
  FaultInjectingIoEngine* faults = nullptr;
  if (!a.io_faults.empty()) {
    ASSIGN_OR_RETURN(const FaultInjectionOptions fo, ParseFaultInjectionSpec(a.io_faults));
    ASSIGN_OR_RETURN(std::unique_ptr<FaultInjectingIoEngine> injector,
                     FaultInjectingIoEngine::Create(std::move(engine.engine), fo));
    faults = injector.get();
    engine.engine = std::move(injector);
  }

  shm::CreateOptions co;
  co.geometry = DaemonGeometry(*store, o);
  co.take_over_live = a.take_over;
  ASSIGN_OR_RETURN(std::unique_ptr<shm::ShmSegment> segment, shm::ShmSegment::Create(a.instance, co));
  if (segment->name() != a.instance)
    std::fprintf(stderr,
                 "mer-residency: /dev/shm/%s belongs to another user and is left alone; serving as "
                 "/dev/shm/%s (mer-compute finds it by its owner)\n",
                 a.instance.c_str(), segment->name().c_str());
  ASSIGN_OR_RETURN(std::unique_ptr<ResidencyDaemon> daemon,
                   ResidencyDaemon::Create(*store, segment.get(), std::move(engine.engine), store->experts_fd(), o));
  std::fprintf(stderr,
               "mer-residency: instance %s, store %s: %d layers x %d experts of %llu bytes; "
               "RAM tier %u slots (%.1f MiB), io %s%s%s, %s, policy %s%s, %s tiers%s\n",
               a.instance.c_str(), a.store.c_str(), store->n_layer(), store->n_expert(),
               static_cast<unsigned long long>(store->blob_bytes()), daemon->ram_slots(),
               daemon->ram_slots() * double(store->blob_bytes()) / (1 << 20), daemon->io().name().c_str(),
               engine.fallback_reason.empty() ? "" : " (io_uring unavailable: ",
               engine.fallback_reason.empty() ? "" : (engine.fallback_reason + ")").c_str(),
               store->direct_io() ? "O_DIRECT" : "buffered", o.policy.c_str(), o.prefetch ? ", prefetch" : "",
               daemon->exclusive_tiers() ? "exclusive" : "inclusive",
               o.expert_share_ranks > 1
                   ? absl::StrCat(", expert share ", o.expert_share_rank, "/", o.expert_share_ranks, " (",
                                  ShareExpertsPerLayer(o, store->n_expert()), " experts a layer)")
                         .c_str()
                   : "");
  std::optional<HostPinning> pinning;
  if (a.pin == "auto" && daemon->ram_slots() > 0) {
    pinning.emplace(HostPinning::Register(segment->ram_slot(0).data(),
                                          size_t{daemon->ram_slots()} * segment->header().ram_slot_bytes));
    std::fprintf(stderr, "mer-residency: RAM tier %s: %s\n", pinning->pinned() ? "pinned" : "pageable",
                 pinning->reason().c_str());
  }
  std::unique_ptr<MetricsServer> metrics;
  if (a.metrics_listen != "off") {
    ResidencyDaemon* d = daemon.get();
    ASSIGN_OR_RETURN(metrics, MetricsServer::Start(a.metrics_listen, [d] { return d->Snapshot(); }));
    std::fprintf(stderr, "metrics: %s\n", metrics->url().c_str());
  }
  std::fprintf(stderr, "mer-residency: ready\n");
  systemd::NotifyReady(
      absl::StrCat("serving ", a.store, " as ", a.instance, ", RAM tier ", daemon->ram_slots(), " slots"));
  // The watchdog pings only while the service loop turns: a wedged loop stops them and systemd
  // restarts the daemon. The loop blocks in Run, so the pacing runs on a thread of its own.
  std::atomic<bool> watchdog_stop{false};
  std::thread watchdog;
  if (systemd::WatchdogPingInterval() > absl::ZeroDuration()) {
    watchdog = std::thread([&] {
      systemd::WatchdogPacer pacer;
      uint64_t last = daemon->loop_turns();
      while (!watchdog_stop.load()) {
        absl::SleepFor(std::min(pacer.interval(), absl::Milliseconds(200)));
        pacer.MaybePing([&] {
          const uint64_t now = daemon->loop_turns();
          const bool turned = now != last;
          last = now;
          return turned;
        });
      }
    });
  }
  const absl::Status s = daemon->Run(mer::StopRequested());
  systemd::NotifyStopping();
  watchdog_stop = true;
  if (watchdog.joinable()) watchdog.join();
  std::fprintf(stderr, "mer-residency: counters %s\n", FormatCounters(daemon->Snapshot()).c_str());
  if (faults != nullptr) {
    const FaultStats& f = faults->fault_stats();
    std::fprintf(stderr,
                 "mer-residency: injected faults: reads=%llu errors=%llu short_reads=%llu bit_flips=%llu "
                 "delays=%llu\n",
                 static_cast<unsigned long long>(f.reads), static_cast<unsigned long long>(f.errors),
                 static_cast<unsigned long long>(f.short_reads), static_cast<unsigned long long>(f.bit_flips),
                 static_cast<unsigned long long>(f.delays));
  }
  metrics.reset();  // before the daemon its snapshots come from
  daemon.reset();
  pinning.reset();  // unregisters the pool before the segment is unmapped
  segment.reset();  // detaches and removes the name
  return s;
}

}  // namespace

int main(int argc, char** argv) { return mer::DaemonMain("mer-residency", kHelp, argc, argv, ParseArgs, Main); }
