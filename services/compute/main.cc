// mer-compute: loads a model (a GGUF file, or an expert store's dense weights with the experts
// served by mer-residency), runs continuous batching over a compute backend (cpu or cuda) and serves the
// internal gRPC API (proto/mer/internal/v1/compute.proto) on a unix socket until SIGTERM/SIGINT.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/daemon_main.h"
#include "common/base/flags.h"
#include "common/base/status.h"
#include "common/gguf/gguf_digest.h"
#include "common/gguf/gguf_file.h"
#include "common/metrics/metrics_endpoint.h"
#include "common/model/expert_source.h"
#include "common/model/model_tokenizer.h"
#include "common/model/model_weights.h"
#include "common/shm/store_identity.h"
#include "common/store/expert_store.h"
#include "common/systemd/sd_notify.h"
#include "grpcpp/grpcpp.h"
#include "services/compute/backend_factory.h"
#include "services/compute/daemon/batcher.h"
#include "services/compute/daemon/compute_metrics.h"
#include "services/compute/daemon/compute_service.h"
#include "services/compute/daemon/residency_monitor.h"
#include "services/compute/residency_expert_source.h"

#ifndef MER_VERSION
#define MER_VERSION "unknown"
#endif

namespace {

constexpr char kHelp[] =
    R"(usage: mer-compute (--model F.gguf | --store STORE_DIR --residency NAME[,NAME...]) --listen unix:PATH
                   [--backend cpu|cuda] [--vram-expert-budget BYTES|PERCENT%] [--pin-experts 0|1]
                   [--vram-prefetch 0|1] [--vram-arena residency|compute] [--miss-path device|host]
                   [--arena-policy lfu|lru] [--multi-token-kernels auto|dp4a|exact|fast]
                   [--max-sequences N] [--max-batch-tokens N] [--ctx N] [--kv-budget-tokens N]
                   [--threads N] [--admission-wait-ms N] [--metrics-listen HOST:PORT|off]
                   [--verify-model SHA256] [--expert-ranks N] [--gpus G,G,...] [--replicate-hot-experts K]

Serves the model to mer-gateway over the internal gRPC API on the unix socket PATH, generating
up to --max-sequences (default 8) sequences at once with continuous batching: each step carries
one decode token per running sequence and then prompt chunks, --max-batch-tokens (default 256)
tokens in all. --ctx (default 4096, at most the model's) is the KV positions per sequence;
--kv-budget-tokens (default max-sequences x ctx) caps what running sequences reserve together
(prompt + max_new_tokens - 1 each). A Generate call waits up to --admission-wait-ms (default
2000) for a slot, then fails RESOURCE_EXHAUSTED. With --store and --residency the dense weights
and the tokenizer come from STORE_DIR/dense.gguf, every byte of which is checked against the
store's manifest at load, and the experts from the mer-residency instance NAME (each checked as
it is read); while that instance is unreachable, Generate calls fail at once with UNAVAILABLE.
With --model, --verify-model checks the file's SHA-256 (64 hex digits, as a model hub publishes
it) before loading it. --backend cuda (builds with the cuda backend, one NVIDIA GPU) runs the
forward pass on the GPU with an expert arena in VRAM, capped by --vram-expert-budget (bytes, or a percentage of
all experts; default: the free VRAM less a margin); misses are uploaded from the host memory the
experts are read from, page-locked for DMA unless --pin-experts 0 (the mapped file, or with
--store the mapping of mer-residency's RAM tier in this process); on decode steps that miss, the
next layer's predicted experts are uploaded ahead of demand unless --vram-prefetch 0
(docs/cuda.md). With --store and --backend cuda the arena is by default exported to
mer-residency over CUDA IPC and filled by it (--vram-arena residency: mer-residency uploads
from its RAM tier, evicts and prefetches into VRAM); --vram-arena compute keeps the arena's
uploads in this process, from its own mapping of the RAM tier. An arena that holds every expert
is filled once at start and never exported. Over CUDA IPC the device decides each layer's hits
and misses and waits for its misses on the device, with no host round trip per layer
(--miss-path device, the default, where the arena has room for a layer's experts beside 2 x
top-k slots; it loads every CUDA kernel at start, CUDA_MODULE_LOADING=EAGER); --miss-path host
has the host read each layer's routing and serve its misses. On the device path --arena-policy
picks which published experts make room for a layer's misses: the least frequently used with
ageing (lfu, the default) or the least recently used (lru). --multi-token-kernels picks the
kernels of the Q8_0 products of prompt chunks and batches: auto (the default: the tensor cores
or integer dot products, whichever is faster for the shape), dp4a or exact (one of the two
everywhere) keep the CPU reference's results bit for bit; fast runs them on the tensor cores with
one sum per 32-block, ~1.4x the batch throughput, and gives up the bit-exactness (logits within
a few percent of the reference's, as any other summation order; docs/cuda.md). Prometheus metrics are served on http://HOST:PORT/metrics (default
127.0.0.1:0: a free port, printed on stderr as "metrics: http://127.0.0.1:PORT/metrics"); off
serves none. --expert-ranks N (default 1) runs N expert-parallel ranks in this process, each
computing the dense part and the experts e with e mod N its rank: the same results as one engine,
bit for bit (docs/design.md, "Several GPUs and several hosts"). With --backend cpu the ranks split
--threads between them; with --store each rank reads its experts from a mer-residency instance of
its own: --residency names N instances, rank r's the r-th, or one NAME for NAME, NAME.rank1, ...,
NAME.rank<N-1> (each best started with --expert-share r/N, which sizes and warms its RAM tier for
that rank's share; the mer-residency@.service units of deploy/ do). With --backend cuda rank r runs on
GPU r, or on the r-th GPU of --gpus (CUDA ordinals, one per rank; given alone it sets the ranks;
one GPU picks the device of a single engine), with its share of the experts preloaded into its
arena (from the file, or with --store through its mer-residency's RAM tier), which must hold all
of it (--vram-expert-budget caps the share; misses on cuda ranks are not built): ranks
on distinct GPUs sum their experts' outputs through NCCL inside the step, ranks that share a GPU
through the host, a synchronisation per layer (docs/cuda.md, "Expert-parallel ranks").
--replicate-hot-experts K (--backend cpu with 2 or more ranks; default 0) also places each layer's
K most used experts on every rank, chosen again every 64 steps from the routing served: their
pairs go to the least loaded ranks, which evens out the ranks' expert work
(mer_expert_busiest_rank_pairs_total); the results stay bit for bit.
)";

struct Args {
  std::string model, store, residency, listen, backend = "cpu", vram_expert_budget;
  std::string metrics_listen = "127.0.0.1:0";
  int64_t max_sequences = 8, max_batch_tokens = 256, ctx = 4096, kv_budget_tokens = 0, threads = 0;
  int64_t admission_wait_ms = 2000;
  bool pin_experts = true;
  bool vram_prefetch = true;
  std::string vram_arena;           // "residency" or "compute"
  std::string verify_model;         // expected SHA-256 of --model, hex
  std::string miss_path;            // "device" or "host"
  std::string arena_policy;         // "lfu" or "lru"
  std::string multi_token_kernels;  // "auto", "dp4a", "exact", "fast"; empty: the environment's
  int64_t expert_ranks = 1;
  std::vector<int> gpus;  // --gpus: rank r's GPU is the r-th; empty: GPU r
  int64_t replicate_hot_experts = 0;
  std::vector<std::string> residencies;  // --residency's names: rank r's is the r-th
};

absl::Status ParseArgs(int argc, char** argv, Args* a) {
  ASSIGN_OR_RETURN(const mer::Flags f, mer::Flags::ParseMain(argc, argv,
                                                             {"model",
                                                              "store",
                                                              "residency",
                                                              "listen",
                                                              "backend",
                                                              "vram-expert-budget",
                                                              "metrics-listen",
                                                              "max-sequences",
                                                              "max-batch-tokens",
                                                              "ctx",
                                                              "kv-budget-tokens",
                                                              "threads",
                                                              "admission-wait-ms",
                                                              "pin-experts",
                                                              "vram-prefetch",
                                                              "vram-arena",
                                                              "miss-path",
                                                              "arena-policy",
                                                              "verify-model",
                                                              "multi-token-kernels",
                                                              "expert-ranks",
                                                              "gpus",
                                                              "replicate-hot-experts"},
                                                             {}));
  a->model = f.String("model");
  a->store = f.String("store");
  a->residency = f.String("residency");
  a->listen = f.String("listen");
  ASSIGN_OR_RETURN(a->backend, f.OneOf("backend", "cpu", {"cpu", "cuda"}));
  a->vram_expert_budget = f.String("vram-expert-budget");
  a->verify_model = f.String("verify-model");
  a->metrics_listen = f.String("metrics-listen", a->metrics_listen);
  ASSIGN_OR_RETURN(a->max_sequences, f.IntInRange("max-sequences", a->max_sequences, 1, 4096));
  ASSIGN_OR_RETURN(a->max_batch_tokens, f.IntInRange("max-batch-tokens", a->max_batch_tokens, 1, 65536));
  ASSIGN_OR_RETURN(a->ctx, f.IntInRange("ctx", a->ctx, 1, 1 << 24));
  ASSIGN_OR_RETURN(a->kv_budget_tokens, f.IntInRange("kv-budget-tokens", a->kv_budget_tokens, 0, int64_t(1) << 40));
  ASSIGN_OR_RETURN(a->threads, f.IntInRange("threads", a->threads, 0, 1024));
  ASSIGN_OR_RETURN(a->admission_wait_ms, f.IntInRange("admission-wait-ms", a->admission_wait_ms, 0, 3600 * 1000));
  int64_t pin = 1;
  ASSIGN_OR_RETURN(pin, f.IntInRange("pin-experts", pin, 0, 1));
  a->pin_experts = pin != 0;
  int64_t vram_prefetch = 1;
  ASSIGN_OR_RETURN(vram_prefetch, f.IntInRange("vram-prefetch", vram_prefetch, 0, 1));
  a->vram_prefetch = vram_prefetch != 0;
  ASSIGN_OR_RETURN(
      a->vram_arena,
      f.OneOf("vram-arena", !a->store.empty() && mer::SharesArenaWithResidency(a->backend) ? "residency" : "compute",
              {"residency", "compute"}));
  ASSIGN_OR_RETURN(a->miss_path, f.OneOf("miss-path", "device", {"device", "host"}));
  ASSIGN_OR_RETURN(a->arena_policy, f.OneOf("arena-policy", "lfu", {"lfu", "lru"}));
  if (f.Has("multi-token-kernels")) {
    ASSIGN_OR_RETURN(a->multi_token_kernels, f.OneOf("multi-token-kernels", "auto", {"auto", "dp4a", "exact", "fast"}));
  }
  if (f.Has("gpus")) {
    ASSIGN_OR_RETURN(a->gpus, mer::ParseGpuList(f.String("gpus")));
    a->expert_ranks = static_cast<int64_t>(a->gpus.size());  // --gpus alone sets the ranks
  }
  ASSIGN_OR_RETURN(a->expert_ranks, f.IntInRange("expert-ranks", a->expert_ranks, 1, mer::kMaxExpertRanks));
  RETURN_IF_ERROR(mer::CheckGpuList(a->gpus, static_cast<int>(a->expert_ranks), a->backend));
  ASSIGN_OR_RETURN(a->replicate_hot_experts, f.IntInRange("replicate-hot-experts", 0, 0, 1 << 20));
  a->residencies = absl::StrSplit(a->residency, ',', absl::SkipEmpty());
  // One name for several ranks: rank r > 0 reads from NAME.rank<r>, as mer up and the
  // mer-residency@r units name them.
  for (int r = 1; a->residencies.size() == 1 && r < a->expert_ranks; ++r)
    a->residencies.push_back(mer::RankResidencyInstance(a->residencies[0], r));
  if (!a->store.empty() && int64_t(a->residencies.size()) != a->expert_ranks)
    return absl::InvalidArgumentError(absl::StrCat(
        "--residency names ", a->residencies.size(), " mer-residency instance(s) for --expert-ranks ", a->expert_ranks,
        ": each rank reads its experts from an instance of its own (a segment serves one client); one NAME stands "
        "for NAME, NAME.rank1, NAME.rank2, ..."));
  mer::PrepareProcessFor(a->backend, a->miss_path == "device");  // before the backend's first runtime call
  if (a->vram_arena == "residency" && (a->store.empty() || !mer::SharesArenaWithResidency(a->backend)))
    return absl::InvalidArgumentError("--vram-arena residency needs --backend cuda and --store/--residency");
  if (a->model.empty() == a->store.empty())
    return absl::InvalidArgumentError("give exactly one of --model and --store");
  if (!a->store.empty() && a->residency.empty()) return absl::InvalidArgumentError("--store needs --residency NAME");
  if (!a->model.empty() && !a->residency.empty())
    return absl::InvalidArgumentError("--residency goes with --store, not --model");
  if (!a->verify_model.empty() && a->model.empty())
    return absl::InvalidArgumentError("--verify-model goes with --model (a store's files carry checksums)");
  if (!absl::StartsWith(a->listen, "unix:") || a->listen.size() <= 5)
    return absl::InvalidArgumentError("--listen unix:PATH is required");
  return absl::OkStatus();
}

std::string Quantization(const mer::ModelWeights& w, const mer::ExpertStore* store) {
  using mer::TypeName;
  std::string experts;
  if (store != nullptr) {
    const auto& l = store->manifest().layers.front();
    experts = absl::StrCat(TypeName(l.gate_type), "/", TypeName(l.up_type), "/", TypeName(l.down_type));
  } else {
    const auto& l = w.layers.front();
    experts = absl::StrCat(TypeName(l.gate_exps.type), "/", TypeName(l.up_exps.type), "/", TypeName(l.down_exps.type));
  }
  return absl::StrCat("experts (gate/up/down) ", experts, ", attention ", TypeName(w.layers.front().wq.type),
                      ", output ", TypeName(w.output.type));
}

absl::Status Main(const Args& a) {
  using namespace mer;
  namespace pb = mer::internal::v1;
  systemd::NotifyStatus("loading the model");
  systemd::NotifyExtendTimeout(absl::Seconds(120));

  std::unique_ptr<ExpertStore> store;
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<ExpertSource> experts;
  // With --store, rank r's source from instance a.residencies[r]; rank 0's is `experts`.
  std::vector<ResidencyExpertSource*> residencies;
  std::string path = a.model;
  if (!a.store.empty()) {
    ASSIGN_OR_RETURN(store, ExpertStore::Open(a.store));
    path = store->dense_path();
    // Every byte of dense.gguf against the manifest's checksum, in the mapping that is served.
    ASSIGN_OR_RETURN(weights, store->LoadDenseWeights());
    file = weights->shared_file();
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(path));
    file = std::move(f);
    if (!a.verify_model.empty()) RETURN_IF_ERROR(VerifySha256(*file, a.verify_model));
    auto loaded = ModelWeights::Load(file);
    if (!loaded.ok()) return absl::Status(loaded.status().code(), absl::StrCat(path, ": ", loaded.status().message()));
    weights = std::move(*loaded);
  }
  auto vocab = LoadTokenizerVocab(*file);
  if (!vocab.ok()) return absl::Status(vocab.status().code(), absl::StrCat(path, ": ", vocab.status().message()));
  if (auto t = Tokenizer::Create(*vocab); !t.ok())  // the gateway will build the same one
    return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  systemd::NotifyExtendTimeout(absl::Seconds(120));
  BackendOptions bo_engine;
  bo_engine.backend = a.backend;
  bo_engine.threads = static_cast<int>(a.threads);
  bo_engine.max_batch_tokens = static_cast<int>(a.max_batch_tokens);
  bo_engine.max_sequences = static_cast<int>(a.max_sequences);
  bo_engine.max_context_tokens = static_cast<int>(std::min<int64_t>(a.ctx, weights->config().n_ctx_train));
  bo_engine.vram_expert_budget = a.vram_expert_budget;
  bo_engine.pin_host_experts = a.pin_experts;
  bo_engine.vram_prefetch = a.vram_prefetch;
  bo_engine.device_misses = a.miss_path == "device";
  bo_engine.arena_policy = a.arena_policy;
  bo_engine.multi_token_kernels = a.multi_token_kernels;
  bo_engine.expert_ranks = static_cast<int>(a.expert_ranks);
  bo_engine.gpus = a.gpus;
  bo_engine.replicate_hot_experts = static_cast<int>(a.replicate_hot_experts);
  ResidencyExpertSourceOptions so;
  // cuda: register the RAM tier in this process too, for the uploads compute makes itself (all
  // of them with --vram-arena compute; the fill of an arena that holds every expert otherwise).
  so.pin_ram_tier = HostMemoryPinnerFor(bo_engine);
  const auto connect = [&](int rank) -> absl::StatusOr<std::unique_ptr<ResidencyExpertSource>> {
    const std::string& name = a.residencies[rank];
    systemd::NotifyStatus(absl::StrCat("waiting for mer-residency instance ", name));
    ASSIGN_OR_RETURN(std::unique_ptr<ResidencyExpertSource> source, ResidencyExpertSource::Connect(*store, name, so));
    residencies.push_back(source.get());
    if (so.pin_ram_tier)
      std::fprintf(stderr, "mer-compute: RAM tier of %s %s\n", name.c_str(), source->ram_tier_pinning().c_str());
    return source;
  };
  bo_engine.rank_experts = [&](int rank) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    if (store) return connect(rank);
    return std::make_unique<MappedExpertSource>(*weights);
  };
  if (store) {
    ASSIGN_OR_RETURN(std::unique_ptr<ResidencyExpertSource> source, connect(0));
    if (a.vram_arena == "residency") bo_engine.vram_residency = source.get();
    experts = std::move(source);
  } else {
    experts = std::make_unique<MappedExpertSource>(*weights);
  }
  // Creating the cuda backend with every expert in VRAM preloads them all (from mer-residency:
  // NVMe reads at first), which can take minutes on a large model.
  systemd::NotifyStatus(absl::StrCat("creating the ", a.backend, " backend"));
  systemd::NotifyExtendTimeout(absl::Seconds(600));
  ASSIGN_OR_RETURN(CreatedBackend created, CreateBackend(*weights, *experts, bo_engine));
  std::unique_ptr<ComputeBackend> engine = std::move(created.engine);
  const ModelConfig& c = weights->config();

  pb::Info info;
  info.set_instance_id(std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32) ^ uint64_t(getpid()));
  info.set_architecture(c.architecture);
  info.set_name(c.name);
  info.set_vocab_size(c.n_vocab);
  info.set_n_embd(c.n_embd);
  info.set_n_layer(c.n_layer);
  info.set_n_head(c.n_head);
  info.set_n_head_kv(c.n_head_kv);
  info.set_head_dim(c.head_dim);
  info.set_n_expert(c.n_expert);
  info.set_n_expert_used(c.n_expert_used);
  info.set_expert_ffn(c.n_ff_exp);
  info.set_quantization(Quantization(*weights, store.get()));
  info.set_context_length(c.n_ctx_train);
  info.set_backend(a.backend);
  info.set_max_context_tokens(engine->max_context_tokens());
  uint64_t all_experts = 0;
  if (store) {
    all_experts = uint64_t(store->n_layer()) * store->n_expert() * store->blob_bytes();
    uint64_t ram = 0;
    for (const ResidencyExpertSource* r : residencies) ram += r->ram_tier_bytes();
    info.set_ram_expert_bytes(ram);
  } else {
    for (int l = 0; l < c.n_layer; ++l) all_experts += uint64_t(ExpertBytes(*weights, l)) * c.n_expert;
  }
  info.set_store_expert_bytes(all_experts);
  pb::TokenizerVocab vp;
  for (const auto& t : vocab->tokens) vp.add_tokens(t);
  for (int32_t t : vocab->token_types) vp.add_token_types(t);
  for (const auto& m : vocab->merges) vp.add_merges(m);
  vp.set_pre(vocab->pre);
  vp.set_bos_id(vocab->bos_id);
  vp.set_eos_id(vocab->eos_id);
  vp.set_add_bos(vocab->add_bos);
  vp.set_add_eos(vocab->add_eos);
  vp.set_chat_template(vocab->chat_template);

  compute::ComputeMetrics metrics(MER_VERSION, a.backend, nullptr);
  compute::BatcherOptions bo;
  bo.kv_budget_tokens = a.kv_budget_tokens;
  bo.admission_wait = absl::Milliseconds(a.admission_wait_ms);
  {
    // The backend's counters (expert pairs, by rank with ranks; VRAM hit rate, uploads, host
    // syncs: a device backend's) as metrics: read on the step thread, at most every 100 ms while steps run and at every idle
    // tick, so a scrape after a burst sees its end.
    ComputeBackend* e = engine.get();
    bo.after_step = [e, &metrics, last = absl::InfinitePast()](bool idle) mutable {
      const absl::Time now = absl::Now();
      if (!idle && now - last < absl::Milliseconds(100)) return;
      last = now;
      metrics.OnBackendCounters(e->counters(), e->rank_counters());
    };
  }
  auto batcher = std::make_unique<compute::Batcher>(*engine, bo, &metrics);
  compute::Batcher* b = batcher.get();
  metrics.set_capacity([b] {
    return compute::Capacity{b->max_sequences(), b->free_sequences(), b->kv_budget_tokens(), b->kv_free_tokens()};
  });
  // With a store: whether every rank's mer-residency is reachable, for GetInfo, Generate and the
  // log (a step needs every rank).
  std::vector<std::unique_ptr<compute::ResidencyMonitor>> monitors;
  compute::ComputeServiceOptions service_options;
  if (store) {
    for (const std::string& name : a.residencies)
      monitors.push_back(
          std::make_unique<compute::ResidencyMonitor>(name, shm::ExpectedSegmentIdentity(store->manifest())));
    service_options.serving = [&monitors] {
      for (const auto& m : monitors)
        if (absl::Status s = m->status(); !s.ok()) return s;
      return absl::OkStatus();
    };
  }
  compute::ComputeService service(*batcher, info, std::move(vp), service_options);

  const std::string socket_path = a.listen.substr(5);
  std::error_code ec;
  std::filesystem::remove(socket_path, ec);  // a stale socket of a process that died
  grpc::ServerBuilder builder;
  builder.AddListeningPort(a.listen, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  builder.SetMaxSendMessageSize(256 << 20);  // the tokenizer of a real model is ~10 MB
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return absl::UnavailableError(absl::StrCat("cannot listen on ", a.listen));

  std::unique_ptr<MetricsEndpoint> endpoint;
  if (a.metrics_listen != "off") {
    ASSIGN_OR_RETURN(endpoint, MetricsEndpoint::Start(a.metrics_listen, metrics.collectables()));
    std::fprintf(stderr, "metrics: %s\n", endpoint->url().c_str());
  }
  std::fprintf(
      stderr,
      "mer-compute: %s (%s), backend %s, %d threads, %d sequences x %d positions, "
      "%d batch tokens, KV budget %lld positions, experts %s\n",
      path.c_str(), info.quantization().c_str(), a.backend.c_str(), created.threads, engine->max_sequences(),
      engine->max_context_tokens(), batcher->max_batch_tokens(), static_cast<long long>(batcher->kv_budget_tokens()),
      store ? absl::StrCat("from mer-residency ", absl::StrJoin(a.residencies, ", ")).c_str() : "from the file");
  std::fprintf(stderr, "mer-compute: listening on %s\n", a.listen.c_str());
  std::fprintf(stderr, "mer-compute: ready\n");
  systemd::NotifyReady(absl::StrCat("serving on ", a.listen));

  // The main loop: watchdog pings while the step thread goes round (it beats at least every
  // idle_tick; a step that hangs longer than the watchdog gets the process restarted).
  systemd::WatchdogPacer watchdog;
  while (!mer::StopRequested().load()) {
    absl::SleepFor(absl::Milliseconds(50));
    watchdog.MaybePing([&] { return absl::Now() - batcher->heartbeat() < 2 * watchdog.interval(); });
  }
  systemd::NotifyStopping();
  std::fprintf(stderr, "mer-compute: stopping\n");
  // No new calls; running ones get 2 s to finish, then are cancelled (the gateway answers its
  // clients UNAVAILABLE). The batcher outlives every handler that uses it.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server.reset();
  batcher.reset();
  endpoint.reset();
  std::filesystem::remove(socket_path, ec);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) { return mer::DaemonMain("mer-compute", kHelp, argc, argv, ParseArgs, Main); }
