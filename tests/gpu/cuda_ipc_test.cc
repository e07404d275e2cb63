// The cuda backend with its VRAM arena exported over CUDA IPC and filled by a real mer-residency
// process (`mer-compute --backend cuda --store DIR --residency NAME`, --vram-arena residency; CUDA
// IPC does not work within one process, so the daemon is the mer-residency binary, started here).
// A synthetic model is packed into an expert store; mer-residency serves it with a RAM tier of
// 10% of the experts (exclusive tiers: experts evicted from VRAM come back into RAM in the device
// layout and are uploaded from there again); CudaEngine runs over the store's dense weights with
// CudaEngineOptions::vram_residency set, with an arena of every expert (filled at Create, not
// exported), of 50% (exported, misses decided on the device) and of 10% (exported, misses served
// by the host; mer-residency evicts there, never a pinned slot). On a corpus
// of prompts the greedy ids must equal the CPU reference engine's on the GGUF, and the
// teacher-forced logits be within 1e-3 relative L2 at every step, as cuda_store_test.
//
// The binary: $MER_RESIDENCY_BIN, else mer-residency next to this test (build/bin, or a
// bundle's bin/). Time-bounded: acquires give up after 20 s, the daemon is SIGKILLed if it
// does not exit 5 s after SIGTERM, CTest stops the binary after 300 s.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "common/model/synth_model.h"
#include "common/store/expert_store.h"
#include "common/store/packer.h"
#include "services/compute/cpu/cpu_engine.h"
#include "services/compute/cuda/cuda_engine.h"
#include "services/compute/generation.h"
#include "services/compute/residency_expert_source.h"
#include "tests/gpu/corpus.h"
#include "tests/gpu/test_models.h"

namespace mer {
namespace {

using gpu_test::GreedyAndScore;
using gpu_test::Outputs;
using gpu_test::StoreFiles;

// The device miss path needs every kernel loaded with the context (stream_memops.h,
// KernelsLoadLazily), as mer-compute --miss-path device arranges: set before any CUDA call.
const bool kEagerKernelLoading = setenv("CUDA_MODULE_LOADING", "EAGER", 1) == 0;

constexpr int kPrompts = 4;
constexpr int kPromptTokens = 12;
constexpr int kGenTokens = 32;
constexpr double kLogitsBound = 1e-3;

std::string ResidencyBinary() {
  if (const char* env = std::getenv("MER_RESIDENCY_BIN"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (self.parent_path() / "mer-residency").string();
}

// mer-residency as a child process; its stderr goes to `log`. SIGTERM (then SIGKILL) at the end.
class ResidencyProcess {
 public:
  ResidencyProcess(const std::string& store, const std::string& instance, const std::string& log) : log_(log) {
    const std::string bin = ResidencyBinary();
    if (access(bin.c_str(), X_OK) != 0) {
      error_ = "no mer-residency binary at " + bin + " (set MER_RESIDENCY_BIN)";
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = std::freopen(log.c_str(), "w", stderr);
      (void)f;
      execl(bin.c_str(), bin.c_str(), "--store", store.c_str(), "--instance", instance.c_str(), "--ram-budget", "10%",
            "--metrics-listen", "off", "--stats-interval", "0", static_cast<char*>(nullptr));
      std::perror("execl mer-residency");
      _exit(127);
    }
    if (pid_ < 0) error_ = "fork failed";
  }
  ~ResidencyProcess() { Stop(); }
  const std::string& error() const { return error_; }
  bool Alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  // Returns its exit status (-1 if it had to be killed).
  int Stop() {
    if (pid_ <= 0) return status_;
    kill(pid_, SIGTERM);
    int st = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (waitpid(pid_, &st, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &st, 0);
        pid_ = -1;
        return status_ = -1;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    pid_ = -1;
    return status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int status_ = -1;
  std::string error_;
};

// A counter from mer-residency's exit line "mer-residency: counters a=1 b=2 ...".
int64_t Counter(const std::string& log, const std::string& name) {
  const size_t at = log.rfind(" " + name + "=");
  if (at == std::string::npos) return -1;
  return std::strtoll(log.c_str() + at + name.size() + 2, nullptr, 10);
}

using Case = gpu_test::ModelCase;

class CudaIpcArena : public ::testing::TestWithParam<Case> {};

TEST_P(CudaIpcArena, GreedyIdsEqualTheCpuReference) {
  const Case& tc = GetParam();
  gpu_test::StoreReference sr;
  gpu_test::MakeStoreReference("cuda_ipc_test", tc, kPrompts, kPromptTokens, kGenTokens, &sr);
  ASSERT_FALSE(HasFatalFailure());
  const StoreFiles* files = sr.files.get();
  const auto& prompts = sr.prompts;
  const Outputs& ref = sr.ref;

  auto store = ExpertStore::Open(files->store);
  ASSERT_TRUE(store.ok()) << store.status();
  auto dense = (*store)->LoadDenseWeights();
  ASSERT_TRUE(dense.ok()) << dense.status();
  const int V = (*dense)->config().n_vocab;
  const std::string instance = "mer-cuda-ipc-test-" + std::to_string(getpid()) + "-" + tc.name;
  ResidencyProcess daemon(files->store, instance, (files->dir / "residency.log").string());
  ASSERT_TRUE(daemon.error().empty()) << daemon.error();

  // 100%: compute fills the arena at start-up (nothing to place; not exported); 50%: exported,
  // misses decided on the device and served by the miss service; 10% (fewer slots than a layer's
  // experts and the reserve on the small presets): exported, each layer's misses served by the host.
  int64_t total_misses = 0;
  for (double arena : {1.0, 0.5, 0.1}) {
    // A source (a compute incarnation) per engine, as a restarted mer-compute would be.
    ResidencyExpertSourceOptions so;
    so.acquire_timeout = absl::Seconds(20);
    so.reconnect_timeout = absl::Seconds(20);
    auto source = ResidencyExpertSource::Connect(**store, instance, so);
    ASSERT_TRUE(source.ok()) << source.status() << "\nmer-residency log:\n" << daemon.Log();
    CudaEngineOptions o;
    o.max_batch_tokens = 64;
    o.max_context_tokens = 128;
    o.vram_expert_budget_fraction = arena;
    o.vram_residency = source->get();
    o.device_misses = true;  // taken where the arena has room (the 50% one)
    auto gpu = CudaEngine::Create(**dense, **source, o);
    ASSERT_TRUE(gpu.ok()) << gpu.status() << "\nmer-residency log:\n" << daemon.Log();
    const Outputs got = GreedyAndScore(**gpu, prompts, kGenTokens, &ref);
    gpu_test::ReferenceComparison cmp;
    gpu_test::CompareWithReference(got, ref, V, kLogitsBound, tc.name + " arena " + std::to_string(arena), &cmp);
    ASSERT_FALSE(HasFatalFailure());
    const int mismatches = cmp.id_mismatches;
    const double worst = cmp.worst_rel_l2;
    const BackendCounters s = (*gpu)->counters();
    const bool device_path = s.device_routing_records > 0;
    // The host path demands every miss of the arena; the device path's misses (experts its table
    // did not publish) may still be in VRAM, unpinned, and cost mer-residency no upload.
    if (!device_path) total_misses += s.expert_misses;
    std::printf(
        "[%s IPC arena %.0f%% = %lld slots of %lld experts, %s] compared %d prompts x %d greedy ids and "
        "teacher-forced logits with the CPU reference: id mismatches %d of %d, worst logits rel L2 %.3g "
        "(bound %.0e); misses %lld, routing records %lld, layers served %lld, host syncs %lld per %lld "
        "forward calls, graph steps %lld; source %s\n",
        tc.name.c_str(), arena * 100, (long long)s.arena_slots, (long long)s.total_experts,
        arena == 1.0  ? "preloaded"
        : device_path ? "device decides"
                      : "host serves",
        kPrompts, kGenTokens, mismatches, kPrompts * kGenTokens, worst, kLogitsBound, (long long)s.expert_misses,
        (long long)s.device_routing_records, (long long)s.device_served_layers, (long long)s.host_syncs,
        (long long)s.forward_calls, (long long)s.graph_launches, (*source)->FormatStats().c_str());
    if (arena == 1.0) {
      EXPECT_FALSE(s.arena_placed_by_residency);
      EXPECT_EQ(s.expert_misses, 0);
      EXPECT_GT(s.graph_launches, 0);
    } else {
      EXPECT_TRUE(s.arena_placed_by_residency);
      EXPECT_GT(s.expert_misses, 0);        // mer-residency uploaded them: compute preloads nothing here
      EXPECT_EQ(s.expert_upload_bytes, 0);  // and compute itself uploaded nothing
    }
    if (arena == 0.5) {
      EXPECT_TRUE(device_path);
      EXPECT_GT(s.device_served_layers, 0);
      EXPECT_LE(s.host_syncs, s.forward_calls + 2 * kPrompts);  // one per step (and per decode), none per layer
    }
    EXPECT_TRUE(daemon.Alive()) << daemon.Log();
  }
  const int rc = daemon.Stop();
  const std::string log = daemon.Log();
  const int64_t uploads = Counter(log, "vram_uploads"), evictions = Counter(log, "vram_evictions"),
                imports = Counter(log, "vram_arena_imports"), refused = Counter(log, "vram_refused");
  std::printf(
      "[%s] mer-residency exit %d: vram_arena_imports %lld, vram_uploads %lld, vram_evictions %lld, "
      "vram_refused %lld, checksum_failures %lld, vram_demotions %lld, reads %lld\n",
      tc.name.c_str(), rc, (long long)imports, (long long)uploads, (long long)evictions, (long long)refused,
      (long long)Counter(log, "checksum_failures"), (long long)Counter(log, "vram_demotions"),
      (long long)Counter(log, "reads"));
  EXPECT_EQ(rc, 0) << log;
  EXPECT_EQ(imports, 2) << log;             // one arena per engine that exports one (not the full one)
  EXPECT_GE(uploads, total_misses) << log;  // the host-served arena's misses at least
  EXPECT_GT(evictions, 0) << log;           // the 10% arena really was smaller than the model
  // A RAM tier of 10% makes the tiers exclusive: experts evicted from VRAM went back into RAM in
  // the device layout, and the ids above were computed from them too.
  EXPECT_GT(Counter(log, "vram_demotions"), 0) << log;
  EXPECT_EQ(refused, 0) << log;
  EXPECT_EQ(Counter(log, "checksum_failures"), 0) << log;
}

INSTANTIATE_TEST_SUITE_P(Ipc, CudaIpcArena,
                         ::testing::Values(Case{"tiny", SynthQuant::kQ8_0, "tiny_q8_0"},
                                           Case{"tiny", SynthQuant::kF16, "tiny_f16"},
                                           Case{"small", SynthQuant::kQ8_0, "small_q8_0"}),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace mer
