// `mer trace`: record routing traces from the engine, replay them against cache policies, and run
// their routes through a backend.
//   record  generation with a TraceWriter as the engine's routing observer
//   replay  one policy / budget / prefetch setting
//   sweep   every policy x budgets 12.5/25/50% x prefetch off/on
//   ranks   the spread of the expert work over expert-parallel ranks
//   run     the trace's routes as preselected routes of a backend, a digest of the logits per record
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/status.h"
#include "common/model/model_weights.h"
#include "services/compute/generation.h"
#include "services/residency/policy/replacement_policy.h"
#include "tools/mer/cli_util.h"
#include "tools/trace/rank_load.h"
#include "tools/trace/replay.h"
#include "tools/trace/route_replay.h"
#include "tools/trace/routing_trace.h"
#include "tools/trace/trace_writer.h"

namespace mer::cli {
namespace {

using trace::RankLoad;
using trace::RankLoadOptions;
using trace::RankLoadStats;
using trace::ReadTraceFile;
using trace::RecordGeneration;
using trace::Replay;
using trace::ReplayOptions;
using trace::ReplayRoutes;
using trace::ReplayStats;
using trace::RouteReplayRecord;
using trace::RoutingTrace;
using trace::SlotsForFraction;
using trace::TraceGeometry;
using trace::TracePhase;
using trace::TraceWriter;

constexpr char kHelp[] =
    R"(usage: mer trace record --model F.gguf (--prompt TEXT | --prompt-tokens 1,2,3) --max-tokens N
                        --out T.trace [--threads N] [--ignore-eos]
                        [--temperature T --top-k K --top-p P --seed S --repetition-penalty R]
       mer trace replay --trace T.trace (--budget 25% | --slots N) [--policy lru|lfu|arc|opt]
                        [--prefetch [--confidence 0.3] [--prefetch-budget K]]
                        [--expert-bytes B] [--bandwidth 1.5] [--latency-us 100] [--decode-only]
       mer trace sweep  --trace T.trace [--budgets 12.5,25,50] [--confidence 0.3]
                        [--prefetch-budget K] [--expert-bytes B] [--bandwidth 1.5]
                        [--latency-us 100] [--decode-only]
       mer trace ranks  --trace T.trace [--ranks 2,4,8] [--replicate 0,4,16] [--prompt]
       mer trace run    --trace T.trace --model F.gguf (--prompt TEXT | --prompt-tokens 1,2,3)
                        [--backend cpu|cuda] [--threads N] [--batch N] [--ctx N]
                        [--vram-expert-budget B|P%] [--pin-experts 0|1] [--vram-prefetch 0|1]

record: generates as `mer generate` does (greedy unless --temperature > 0) and writes the experts
  every token chose at every layer, prompt chunks and decode steps in order, to a routing trace
  (docs/routing_trace.md).
replay: simulates an expert cache of --slots slots, or --budget (a percentage or fraction of all
  n_layer x n_expert experts), under a replacement policy, optionally with the transition
  predictor prefetching the next layer's experts of confidence >= --confidence, at most
  --prefetch-budget (default top_k) reads per layer step. Prints lookups, hits, misses, bytes read
  and the stall modelled as misses x (--latency-us + expert bytes / --bandwidth GB/s).
  --expert-bytes defaults to the size recorded in the trace. --decode-only leaves the prompt out
  of the counts (it still warms the cache). --policy opt is no policy but the bound on them all:
  Belady's MIN, which evicts the expert used farthest ahead, reading the future from the trace (no
  prefetch).
sweep: the replay table for every policy, the --budgets and prefetch off and on, then the opt bound.
ranks: how evenly expert parallelism spreads the trace's expert work: for each --ranks N and each
  --replicate R (the R most used experts of each layer held by every rank, their pairs given to
  the least loaded ranks), every layer's pairs assigned as the ranks would, and the expert work's
  speed-up over one rank (pairs over the busiest rank's, summed over layer steps) and each rank's
  share of time at work. Decode records only unless --prompt.
run: computes the trace on a backend with its routes given (preselected routes: every layer of
  every record routed as recorded, weighted by the router's probabilities of those experts): the
  prompt (the one the trace was recorded with) in the trace's prompt chunks, then each decode
  record fed the greedy id of the record before it. Prints per record its greedy id and an
  FNV-1a 64 digest of its logits, then one of all records, on stdout (the rest on stderr), so two
  runs (--backend cpu and cuda, a trace recorded on either) compare by diff: equal digests, equal
  logits bit for bit. --batch must hold the trace's largest prompt chunk (the default, 256, is
  `record`'s).
)";

std::string Bytes(double b) {
  if (b >= 1e9) return absl::StrFormat("%.2f GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.2f MB", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.2f kB", b / 1e3);
  return absl::StrFormat("%.0f B", b);
}

absl::Status Record(const Args& args) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args,
                                         {"model", "threads", "ctx", "batch", "prompt", "prompt-tokens", "max-tokens",
                                          "out", "temperature", "top-k", "top-p", "seed", "repetition-penalty"},
                                         {"ignore-eos"}));
  ASSIGN_OR_RETURN(const int64_t max_tokens, f.Int("max-tokens", 64));
  if (max_tokens < 1 || max_tokens > (1 << 24)) return absl::InvalidArgumentError("--max-tokens must be >= 1");
  ASSIGN_OR_RETURN(const std::string out_path, f.Required("out"));
  ASSIGN_OR_RETURN(LoadedModel m, LoadModel(f, static_cast<int>(max_tokens) + 1024, kCpuPromptChunkTokens));
  ASSIGN_OR_RETURN(const GenerationRequest req, GenerationRequestFromFlags(f, *m.tokenizer));

  const ModelConfig& c = m.weights->config();
  const TraceGeometry g{c.n_layer, c.n_expert, c.n_expert_used, ExpertBytes(*m.weights, 0)};
  ASSIGN_OR_RETURN(std::unique_ptr<TraceWriter> writer, TraceWriter::Create(out_path, g));
  GenerationStats stats;
  auto out = RecordGeneration(*m.engine, 0, req, *writer, &stats);
  const absl::Status finished = writer->Finish();
  if (!out.ok()) return out.status();
  RETURN_IF_ERROR(finished);
  std::fprintf(stderr,
               "recorded %lld records to %s: %lld prompt tokens, %lld decode tokens (%d generated); "
               "%d layers x %d experts, top-%d, expert %s\n",
               static_cast<long long>(writer->records()), out_path.c_str(),
               static_cast<long long>(writer->tokens() - writer->decode_tokens()),
               static_cast<long long>(writer->decode_tokens()), stats.generated_tokens, g.n_layer, g.n_expert, g.top_k,
               Bytes(static_cast<double>(g.expert_bytes)).c_str());
  return absl::OkStatus();
}

// "25%" -> 0.25, "0.25" -> 0.25.
absl::StatusOr<double> ParseFraction(absl::string_view text, absl::string_view what) {
  double v = 0;
  const bool percent = absl::ConsumeSuffix(&text, "%");
  if (!absl::SimpleAtod(text, &v) || !(v > 0))
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", text, "' is not a positive number or percentage"));
  if (percent) v /= 100;
  if (v > 1) return absl::InvalidArgumentError(absl::StrCat(what, ": more than all experts"));
  return v;
}

// The flags replay and sweep share.
absl::Status CommonOptions(const Flags& f, const RoutingTrace& trace, ReplayOptions* o) {
  ASSIGN_OR_RETURN(o->confidence, f.Double("confidence", 0.3));
  ASSIGN_OR_RETURN(const int64_t budget, f.Int("prefetch-budget", trace.geometry().top_k));
  if (budget < 0 || budget > (1 << 20)) return absl::InvalidArgumentError("--prefetch-budget out of range");
  o->prefetch_budget = static_cast<int32_t>(budget);
  ASSIGN_OR_RETURN(o->expert_bytes, f.Int("expert-bytes", 0));
  if (o->expert_bytes < 0) return absl::InvalidArgumentError("--expert-bytes must be > 0");
  ASSIGN_OR_RETURN(o->bandwidth_gbps, f.Double("bandwidth", 1.5));
  ASSIGN_OR_RETURN(o->latency_us, f.Double("latency-us", 100));
  o->count_prompt = !f.Has("decode-only");
  return absl::OkStatus();
}

std::string Describe(const RoutingTrace& t, const std::string& path, int64_t expert_bytes) {
  const auto& g = t.geometry();
  int64_t prompt_records = 0;
  for (const auto& r : t.records()) prompt_records += r.phase == TracePhase::kPrompt;
  return absl::StrFormat(
      "trace %s: %d layers x %d experts, top-%d; %d tokens (%d prompt in %d records, %d decode); "
      "expert %s",
      path, g.n_layer, g.n_expert, g.top_k, t.tokens(), t.prompt_tokens(), prompt_records, t.decode_tokens(),
      Bytes(static_cast<double>(expert_bytes)));
}

absl::StatusOr<RoutingTrace> LoadTrace(const Flags& f) {
  ASSIGN_OR_RETURN(const std::string path, f.Required("trace"));
  return ReadTraceFile(path);
}

absl::Status ReplayCommand(const Args& args) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args,
                                         {"trace", "budget", "slots", "policy", "confidence", "prefetch-budget",
                                          "expert-bytes", "bandwidth", "latency-us"},
                                         {"prefetch", "decode-only"}));
  ASSIGN_OR_RETURN(const RoutingTrace trace, LoadTrace(f));
  ReplayOptions o;
  RETURN_IF_ERROR(CommonOptions(f, trace, &o));
  if (f.Has("budget") && f.Has("slots")) return absl::InvalidArgumentError("give one of --budget and --slots");
  const int64_t all = int64_t{trace.geometry().n_layer} * trace.geometry().n_expert;
  if (f.Has("slots")) {
    ASSIGN_OR_RETURN(o.slots, f.Int("slots", 0));
    if (o.slots < 1) return absl::InvalidArgumentError("--slots must be >= 1");
  } else {
    ASSIGN_OR_RETURN(const double fraction, ParseFraction(f.String("budget", "25%"), "--budget"));
    o.slots = SlotsForFraction(trace.geometry(), fraction);
  }
  o.policy = f.String("policy", "lru");
  o.prefetch = f.Has("prefetch");
  ASSIGN_OR_RETURN(const ReplayStats s, Replay(trace, o));

  std::printf("%s\n", Describe(trace, f.String("trace"), s.expert_bytes).c_str());
  std::printf(
      "policy %s, %lld slots (%.1f%% of %lld experts), prefetch %s\n", o.policy.c_str(),
      static_cast<long long>(o.slots), 100.0 * o.slots / all, static_cast<long long>(all),
      o.prefetch ? absl::StrFormat("on (confidence >= %g, <= %d reads per layer step)", o.confidence, o.prefetch_budget)
                       .c_str()
                 : "off");
  std::printf("lookups     %lld%s\n", static_cast<long long>(s.lookups), o.count_prompt ? "" : " (decode only)");
  std::printf("hits        %lld (hit rate %.1f%%)\n", static_cast<long long>(s.hits), 100 * s.hit_rate());
  std::printf("misses      %lld (%lld read without caching: every slot pinned)\n", static_cast<long long>(s.misses),
              static_cast<long long>(s.bypassed));
  std::printf("bytes read  %s (demand %s, prefetch %s)\n", Bytes(static_cast<double>(s.bytes_read())).c_str(),
              Bytes(static_cast<double>(s.demand_bytes)).c_str(), Bytes(static_cast<double>(s.prefetch_bytes)).c_str());
  std::printf("stall       %.3f s modelled (%.2f ms per token; %g us + %s / %g GB/s per miss)\n", s.stall_seconds,
              s.tokens > 0 ? 1e3 * s.stall_seconds / s.tokens : 0.0, o.latency_us,
              Bytes(static_cast<double>(s.expert_bytes)).c_str(), o.bandwidth_gbps);
  std::printf("prefetch    issued %lld, useful %lld, wasted %lld\n", static_cast<long long>(s.prefetch_issued),
              static_cast<long long>(s.prefetch_useful), static_cast<long long>(s.prefetch_wasted));
  return absl::OkStatus();
}

absl::Status SweepCommand(const Args& args) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args,
                                         {"trace", "budgets", "confidence", "prefetch-budget", "expert-bytes",
                                          "bandwidth", "latency-us"},
                                         {"decode-only"}));
  ASSIGN_OR_RETURN(const RoutingTrace trace, LoadTrace(f));
  ReplayOptions base;
  RETURN_IF_ERROR(CommonOptions(f, trace, &base));
  std::vector<double> budgets;
  for (absl::string_view b : absl::StrSplit(f.String("budgets", "12.5,25,50"), ',')) {
    std::string pct(b);
    if (!absl::EndsWith(pct, "%")) pct += "%";
    ASSIGN_OR_RETURN(const double fraction, ParseFraction(pct, "--budgets"));
    budgets.push_back(fraction);
  }
  std::printf("%s\n", Describe(trace, f.String("trace"),
                               base.expert_bytes > 0 ? base.expert_bytes : trace.geometry().expert_bytes)
                          .c_str());
  std::printf("prefetch: confidence >= %g, <= %d reads per layer step; stall: %g us + bytes / %g GB/s per miss%s\n\n",
              base.confidence, base.prefetch_budget, base.latency_us, base.bandwidth_gbps,
              base.count_prompt ? "" : "; decode tokens only");
  std::printf(
      "| policy | budget | slots | prefetch | hit rate | misses | read MB | stall ms/token | pf issued | pf useful | "
      "pf wasted |\n");
  std::printf(
      "|--------|-------:|------:|----------|---------:|-------:|--------:|---------------:|----------:|----------:|---"
      "-------:|\n");
  std::vector<std::string> policies = residency::PolicyNames();
  policies.push_back("opt");  // the bound: Belady's MIN, demand only
  for (const std::string& policy : policies) {
    for (double fraction : budgets) {
      for (bool prefetch : {false, true}) {
        if (prefetch && policy == "opt") continue;
        ReplayOptions o = base;
        o.policy = policy;
        o.slots = SlotsForFraction(trace.geometry(), fraction);
        o.prefetch = prefetch;
        ASSIGN_OR_RETURN(const ReplayStats s, Replay(trace, o));
        std::printf("| %s | %g%% | %lld | %s | %.1f%% | %lld | %.1f | %.2f | %lld | %lld | %lld |\n", policy.c_str(),
                    100 * fraction, static_cast<long long>(o.slots), prefetch ? "on" : "off", 100 * s.hit_rate(),
                    static_cast<long long>(s.misses), s.bytes_read() / 1e6,
                    s.tokens > 0 ? 1e3 * s.stall_seconds / s.tokens : 0.0, static_cast<long long>(s.prefetch_issued),
                    static_cast<long long>(s.prefetch_useful), static_cast<long long>(s.prefetch_wasted));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RanksCommand(const Args& args) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args, {"trace", "ranks", "replicate"}, {"prompt"}));
  ASSIGN_OR_RETURN(const RoutingTrace trace, LoadTrace(f));
  std::vector<int> ranks, replicate;
  for (auto [flag, fallback, out] : {std::tuple{"ranks", "2,4,8", &ranks}, std::tuple{"replicate", "0", &replicate}}) {
    for (absl::string_view v : absl::StrSplit(f.String(flag, fallback), ',')) {
      int n;
      if (!absl::SimpleAtoi(v, &n) || n < 0 || n > (1 << 16))
        return absl::InvalidArgumentError(absl::StrCat("--", flag, ": a list of counts, got '", v, "'"));
      out->push_back(n);
    }
  }
  std::printf("%s\n\n", Describe(trace, f.String("trace"), trace.geometry().expert_bytes).c_str());
  std::printf("| ranks | replicated per layer | expert work speed-up | ranks at work |\n");
  std::printf("|------:|---------------------:|---------------------:|--------------:|\n");
  for (int n : ranks) {
    for (int r : replicate) {
      RankLoadOptions o;
      o.n_ranks = n;
      o.replicate_per_layer = r;
      o.count_prompt = f.Has("prompt");
      ASSIGN_OR_RETURN(const RankLoadStats s, RankLoad(trace, o));
      std::printf("| %d | %d | %.2fx | %.1f%% |\n", n, r, s.speedup(), 100 * s.efficiency());
    }
  }
  return absl::OkStatus();
}

absl::Status RunCommand(const Args& args) {
  std::vector<std::string> flags = kEngineFlags;
  for (const char* f : {"trace", "prompt", "prompt-tokens"}) flags.push_back(f);
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args, flags, {}));
  ASSIGN_OR_RETURN(const RoutingTrace trace, LoadTrace(f));
  if (trace.tokens() > (1 << 24)) return absl::InvalidArgumentError("the trace is longer than 2^24 tokens");
  ASSIGN_OR_RETURN(LoadedModel m, LoadModel(f, static_cast<int>(trace.tokens()), kCpuPromptChunkTokens));
  ASSIGN_OR_RETURN(const std::vector<int32_t> prompt, PromptTokens(f, *m.tokenizer));
  std::fprintf(stderr, "%s\nbackend %s: every layer of every record routed as the trace says\n",
               Describe(trace, f.String("trace"), trace.geometry().expert_bytes).c_str(), m.backend.c_str());
  ASSIGN_OR_RETURN(const std::vector<RouteReplayRecord> records, ReplayRoutes(*m.engine, trace, prompt));
  uint64_t all = trace::kFnv1aBasis;
  for (size_t r = 0; r < records.size(); ++r) {
    const RouteReplayRecord& o = records[r];
    std::printf("record %zu %s %d token%s: greedy %d logits fnv1a64 %016llx\n", r,
                o.phase == TracePhase::kPrompt ? "prompt" : "decode", o.n_tokens, o.n_tokens == 1 ? "" : "s", o.greedy,
                static_cast<unsigned long long>(o.digest));
    all = trace::Fnv1a64(&o.digest, sizeof o.digest, all);
  }
  std::printf("all %zu records: logits fnv1a64 %016llx\n", records.size(), static_cast<unsigned long long>(all));
  return absl::OkStatus();
}

}  // namespace

int RunTrace(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "help") {
    std::fputs(kHelp, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (MaybeHelp(args, kHelp)) return 0;
  const std::string sub = args[0];
  const Args rest(args.begin() + 1, args.end());
  absl::Status s;
  if (sub == "record")
    s = Record(rest);
  else if (sub == "replay")
    s = ReplayCommand(rest);
  else if (sub == "sweep")
    s = SweepCommand(rest);
  else if (sub == "ranks")
    s = RanksCommand(rest);
  else if (sub == "run")
    s = RunCommand(rest);
  else
    s = absl::InvalidArgumentError(
        absl::StrCat("unknown subcommand '", sub, "' (record, replay, sweep, ranks or run)"));
  return s.ok() ? 0 : Fail("trace", s);
}

}  // namespace mer::cli
