#include "tools/mer/cli_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"
#include "common/model/model_tokenizer.h"

namespace mer::cli {

int Fail(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "mer %s: %s\n", command, std::string(status.message()).c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

bool MaybeHelp(const Args& args, const char* help) {
  if (std::find(args.begin(), args.end(), "--help") == args.end()) return false;
  std::fputs(help, stdout);
  return true;
}

absl::StatusOr<LoadedModel> LoadModel(const Flags& flags, int min_context_tokens, int default_batch) {
  LoadedModel m;
  const std::string backend = flags.String("backend", "cpu");
  if (default_batch <= 0) default_batch = DefaultPromptChunkTokens(backend);
  ASSIGN_OR_RETURN(const int64_t threads, flags.Int("threads", 0));
  ASSIGN_OR_RETURN(const int64_t batch, flags.Int("batch", default_batch));
  ASSIGN_OR_RETURN(const int64_t ctx, flags.Int("ctx", std::max(4096, min_context_tokens)));
  ASSIGN_OR_RETURN(const int64_t pin, flags.Int("pin-experts", 1));
  ASSIGN_OR_RETURN(const int64_t vram_prefetch, flags.Int("vram-prefetch", 1));
  ASSIGN_OR_RETURN(const int64_t profile_kernels, flags.Int("profile-kernels", 0));
  ASSIGN_OR_RETURN(const int64_t split_cells, flags.Int("attention-split-cells", -1));
  ASSIGN_OR_RETURN(const int64_t flash_tokens, flags.Int("attention-flash-min-tokens", -1));
  if (threads < 0 || threads > 1024) return absl::InvalidArgumentError("--threads must be in [0, 1024]");
  BackendOptions o;
  o.backend = m.backend = backend;
  o.threads = static_cast<int>(threads);
  o.max_batch_tokens = static_cast<int>(std::clamp<int64_t>(batch, 1, 65536));
  o.max_context_tokens = static_cast<int>(std::clamp<int64_t>(ctx, 1, 1 << 24));
  o.vram_expert_budget = flags.String("vram-expert-budget");
  o.pin_host_experts = pin != 0;
  o.vram_prefetch = vram_prefetch != 0;
  o.profile_kernels = profile_kernels != 0;
  o.multi_token_kernels = flags.String("multi-token-kernels");
  if (split_cells >= 0) o.attention_split_min_cells = static_cast<int>(std::min<int64_t>(split_cells, 1 << 24));
  if (flash_tokens >= 0) o.attention_flash_min_tokens = static_cast<int>(std::min<int64_t>(flash_tokens, 1 << 24));

  std::string path;
  if (flags.Has("store") || flags.Has("residency")) {
    if (flags.Has("model")) return absl::InvalidArgumentError("give either --model or --store with --residency");
    ASSIGN_OR_RETURN(const std::string dir, flags.Required("store"));
    ASSIGN_OR_RETURN(const std::string instance, flags.Required("residency"));
    ASSIGN_OR_RETURN(m.store, ExpertStore::Open(dir));
    path = m.store->dense_path();
    ASSIGN_OR_RETURN(m.weights, m.store->LoadDenseWeights());  // checks every byte of dense.gguf
    m.file = m.weights->shared_file();
    ResidencyExpertSourceOptions so;
    so.pin_ram_tier = HostMemoryPinnerFor(o);  // cuda: register the RAM tier in this process
    ASSIGN_OR_RETURN(std::unique_ptr<ResidencyExpertSource> source,
                     ResidencyExpertSource::Connect(*m.store, instance, so));
    m.residency = source.get();
    m.experts = std::move(source);
  } else {
    ASSIGN_OR_RETURN(path, flags.Required("model"));
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
    m.file = std::move(file);
    auto weights = ModelWeights::Load(m.file);
    if (!weights.ok())
      return absl::Status(weights.status().code(), absl::StrCat(path, ": ", weights.status().message()));
    m.weights = std::move(*weights);
  }
  auto tokenizer = LoadTokenizer(*m.file);
  if (!tokenizer.ok())
    return absl::Status(tokenizer.status().code(), absl::StrCat(path, ": ", tokenizer.status().message()));
  m.tokenizer = std::make_unique<Tokenizer>(std::move(*tokenizer));
  if (m.experts == nullptr) m.experts = std::make_unique<MappedExpertSource>(*m.weights);

  ASSIGN_OR_RETURN(CreatedBackend created, CreateBackend(*m.weights, *m.experts, o));
  m.engine = std::move(created.engine);
  m.threads = created.threads;
  return m;
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const Flags& f, const Tokenizer& tokenizer) {
  if (f.Has("prompt") == f.Has("prompt-tokens"))
    return absl::InvalidArgumentError("give exactly one of --prompt and --prompt-tokens");
  std::vector<int32_t> ids;
  if (f.Has("prompt-tokens")) {
    ASSIGN_OR_RETURN(ids, ParseIdList(f.String("prompt-tokens"), "--prompt-tokens"));
  } else {
    if (tokenizer.add_bos() && tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
    const std::vector<int32_t> text = tokenizer.Encode(f.String("prompt"), /*parse_special=*/true);
    ids.insert(ids.end(), text.begin(), text.end());
  }
  if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size())
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", id, " is outside the vocabulary"));
  }
  return ids;
}

absl::StatusOr<GenerationRequest> GenerationRequestFromFlags(const Flags& f, const Tokenizer& tokenizer) {
  GenerationRequest req;
  ASSIGN_OR_RETURN(req.prompt, PromptTokens(f, tokenizer));
  ASSIGN_OR_RETURN(const int64_t max_tokens, f.Int("max-tokens", 64));
  if (max_tokens < 1 || max_tokens > (1 << 24)) return absl::InvalidArgumentError("--max-tokens must be in [1, 2^24]");
  req.max_new_tokens = static_cast<int32_t>(max_tokens);
  ASSIGN_OR_RETURN(const double temperature, f.Double("temperature", 0.0));
  ASSIGN_OR_RETURN(const int64_t top_k, f.Int("top-k", 0));
  ASSIGN_OR_RETURN(const double top_p, f.Double("top-p", 1.0));
  ASSIGN_OR_RETURN(const int64_t seed, f.Int("seed", 0));
  ASSIGN_OR_RETURN(const double penalty, f.Double("repetition-penalty", 1.0));
  req.sampling.temperature = static_cast<float>(temperature);
  req.sampling.top_k = static_cast<int32_t>(top_k);
  req.sampling.top_p = static_cast<float>(top_p);
  req.sampling.seed = static_cast<uint64_t>(seed);
  req.sampling.repetition_penalty = static_cast<float>(penalty);
  // Every end-of-generation token of the vocabulary stops: EOS, <|im_end|>, <|endoftext|>, ...
  if (!f.Has("ignore-eos")) req.stop_ids = tokenizer.EndOfGenerationIds();
  return req;
}

namespace {

std::string Gigabytes(uint64_t bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

}  // namespace

ProgressLine::ProgressLine(std::string label, uint64_t total_bytes)
    : label_(std::move(label)),
      total_(total_bytes),
      tty_(isatty(STDERR_FILENO) == 1),
      start_(absl::Now()),
      last_(absl::InfinitePast()) {}

void ProgressLine::Update(uint64_t done) {
  if (!tty_) return;
  const absl::Time now = absl::Now();
  if (now - last_ < absl::Milliseconds(100) && done < total_) return;
  last_ = now;
  const double seconds = absl::ToDoubleSeconds(now - start_);
  const double rate = seconds > 0 ? done / seconds : 0;
  std::string eta = "?";
  if (rate > 0 && total_ >= done) eta = absl::StrFormat("%.0f s", (total_ - done) / rate);
  std::fprintf(stderr, "\r%s %s of %s  %.0f MB/s  ETA %s   ", label_.c_str(), Gigabytes(done).c_str(),
               Gigabytes(total_).c_str(), rate / 1e6, eta.c_str());
  drawn_ = true;
}

void ProgressLine::Finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

std::string Bytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / double(1 << 30));
  if (b >= (uint64_t{1} << 20)) return absl::StrFormat("%.2f MiB", b / double(1 << 20));
  return absl::StrFormat("%.1f KiB", b / 1024.0);
}

absl::StatusOr<uint64_t> FreeDiskBytes(const std::string& path) {
  std::filesystem::path p = std::filesystem::absolute(path);
  std::error_code ec;
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  struct statvfs st;
  if (statvfs(p.c_str(), &st) != 0)
    return absl::UnavailableError(absl::StrCat("statvfs ", p.string(), ": ", strerror(errno)));
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

absl::Status CheckPortFree(const std::string& host_port, const std::string& flag) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port < 0 || port > 65535)
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", host_port, "' is not HOST:PORT"));
  if (port == 0) return absl::OkStatus();
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_storage addr{};
  socklen_t len;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof *v4;
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof *v6;
  } else {
    return absl::OkStatus();  // a host name: the daemon resolves it and reports its own error
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as the daemons bind
  const int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  const int err = errno;
  close(fd);
  if (rc != 0 && err == EADDRINUSE)
    return absl::FailedPreconditionError(
        absl::StrCat(host_port, " is already in use: stop what listens there or give another ", flag));
  if (rc != 0)
    return absl::FailedPreconditionError(absl::StrCat("cannot bind ", host_port, " (", flag, "): ", strerror(err)));
  return absl::OkStatus();
}

}  // namespace mer::cli
