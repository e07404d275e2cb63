// `mer up`: the three daemons of one host, started in order by one command for a developer or a
// demo (production uses deploy/systemd/). It packs the model's expert store on first use, starts
// mer-residency, mer-compute and mer-gateway as child processes (the executables beside `mer`),
// waits for each one's "ready" line, prints the addresses, restarts a daemon that dies (as
// systemd's Restart=on-failure would) and stops them all, in reverse order, on SIGINT/SIGTERM.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/status.h"
#include "common/store/expert_store.h"
#include "common/store/packer.h"
#include "tools/mer/cli_util.h"

namespace mer::cli {
namespace {

constexpr char kHelp[] = R"(usage: mer up (--model F.gguf [--store-dir DIR] | --store DIR) [--listen HOST:PORT]
              [--http-listen HOST:PORT|off] [--served-model-name NAME]
              [--metrics-listen HOST:PORT] [--ram-budget BYTES|PERCENT%] [--policy lru|lfu|arc]
              [--prefetch] [--backend cpu|cuda] [--vram-expert-budget BYTES|PERCENT%]
              [--max-sequences N] [--max-batch-tokens N] [--ctx N] [--threads N] [--max-queue N]

Starts mer-residency, mer-compute and mer-gateway (found beside this `mer`), each once the one
before is ready, and prints where they serve: the public gRPC API on --listen (default
127.0.0.1:50051), the OpenAI-compatible HTTP API on --http-listen (default 127.0.0.1:8080) and
the host's /metrics on the gateway's --metrics-listen (default 127.0.0.1:9480; the page carries
all three daemons' metrics). These ports are checked before anything is packed or loaded, and a
pack first checks that the disk has room for the store. With --model the expert store is
--store-dir (default F.gguf.store beside the model), packed on first use and packed again when it
no longer matches the model (with progress: bytes, rate and time left, on a terminal). The RAM
tier holds --ram-budget of the experts (default 25%) under --policy (default lfu);
--backend, --vram-expert-budget, --max-sequences (default 8), --max-batch-tokens, --ctx (default
4096 positions per sequence, at most the model's context) and --threads are mer-compute's (see
mer-compute --help); these defaults are deploy/mer.conf's. A
daemon that exits is restarted (at most 5 times a minute); SIGINT or SIGTERM stops all three.
Daemon output goes to stderr, each line prefixed with the daemon's name.
)";

std::atomic<bool> g_stop{false};
void OnStopSignal(int) { g_stop.store(true); }

// One child daemon: its command line, process and stderr pipe, and what its output announced.
struct Daemon {
  Daemon(std::string n, std::vector<std::string> a) : name(std::move(n)), argv(std::move(a)) {}
  std::string name;  // "residency", "compute", "gateway"
  std::vector<std::string> argv;
  pid_t pid = -1;
  int out_fd = -1;      // read end of its stdout+stderr
  std::string partial;  // an unfinished output line
  bool ready = false;
  std::string metrics_url;  // from its "metrics: URL" line
  std::string listening;    // from its "listening on ADDRESS" line
  std::string http_url;     // from its "http: URL" line
  std::vector<absl::Time> restarts;
};

absl::Status Spawn(Daemon& d) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    setpgid(0, 0);  // a terminal's Ctrl-C reaches `mer up`, which stops the daemons in order
    std::vector<char*> argv;
    for (std::string& a : d.argv) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  d.pid = pid;
  d.out_fd = fds[0];
  d.partial.clear();
  d.ready = false;
  return absl::OkStatus();
}

// Reads what the daemon wrote, forwards whole lines to stderr with its name, and notes "ready"
// and "metrics: URL". Returns false at end of file.
bool Drain(Daemon& d) {
  char buf[4096];
  const ssize_t n = read(d.out_fd, buf, sizeof buf);
  if (n <= 0) return n < 0 && errno == EINTR;
  d.partial.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = d.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string line = d.partial.substr(start, nl - start);
    std::fprintf(stderr, "[%s] %s\n", d.name.c_str(), line.c_str());
    if (absl::StrContains(line, ": ready")) d.ready = true;
    if (absl::StartsWith(line, "metrics: ")) d.metrics_url = line.substr(9);
    if (absl::StartsWith(line, "http: ")) d.http_url = line.substr(6);
    if (const size_t at = line.find("listening on "); at != std::string::npos)
      d.listening = line.substr(at + 13);
  }
  d.partial.erase(0, start);
  return true;
}

// Polls the daemons' output for up to `timeout`; returns the daemons whose output ended.
std::vector<Daemon*> Pump(std::vector<Daemon*> daemons, absl::Duration timeout) {
  std::vector<pollfd> fds;
  for (Daemon* d : daemons) fds.push_back({d->out_fd, POLLIN, 0});
  std::vector<Daemon*> ended;
  if (poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0)
    return ended;
  for (size_t i = 0; i < fds.size(); ++i) {
    if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && !Drain(*daemons[i])) ended.push_back(daemons[i]);
  }
  return ended;
}

// Reaps the daemon's process (after its output ended); returns its wait status.
int Reap(Daemon& d) {
  int status = 0;
  if (d.pid > 0) waitpid(d.pid, &status, 0);
  if (d.out_fd >= 0) close(d.out_fd);
  d.pid = -1;
  d.out_fd = -1;
  return status;
}

absl::Status StartAndWait(Daemon& d, absl::Duration timeout) {
  RETURN_IF_ERROR(Spawn(d));
  const absl::Time deadline = absl::Now() + timeout;
  while (!d.ready) {
    if (g_stop.load()) return absl::CancelledError("stopped");
    if (absl::Now() > deadline)
      return absl::DeadlineExceededError(absl::StrCat("mer-", d.name, " was not ready in time"));
    if (!Pump({&d}, absl::Milliseconds(100)).empty()) {
      const int status = Reap(d);
      return absl::FailedPreconditionError(absl::StrCat(
          "mer-", d.name, " exited before it was ready (status ",
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), "); its output is above"));
    }
  }
  return absl::OkStatus();
}

void Stop(Daemon& d) {
  if (d.pid <= 0) return;
  kill(d.pid, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (!Pump({&d}, absl::Milliseconds(100)).empty()) break;
  }
  if (d.pid > 0 && waitpid(d.pid, nullptr, WNOHANG) == 0) kill(d.pid, SIGKILL);
  Reap(d);
}

std::string SelfDir() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

// The store of --store, or --model's store packed (again) when missing or stale.
absl::StatusOr<std::string> EnsureStore(const Flags& f) {
  if (f.Has("store")) return f.String("store");
  ASSIGN_OR_RETURN(const std::string model, f.Required("model"));
  const std::string dir = f.String("store-dir", model + ".store");
  if (std::filesystem::exists(std::filesystem::path(dir) / "manifest")) {
    auto store = ExpertStore::Open(dir);
    if (store.ok() && (*store)->CheckSource(model).ok()) return dir;
    std::fprintf(stderr, "mer up: %s does not match %s: packing it again\n", dir.c_str(), model.c_str());
  }
  // The store is about as large as the model file: check for room before writing any of it.
  std::error_code ec;
  const uint64_t model_bytes = std::filesystem::file_size(model, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", model, ": ", ec.message()));
  ASSIGN_OR_RETURN(const uint64_t free_bytes, FreeDiskBytes(dir));
  if (free_bytes < model_bytes + model_bytes / 50)
    return absl::ResourceExhaustedError(absl::StrFormat(
        "packing %s needs about %.2f GB in %s; the disk has %.2f GB free (give --store-dir on another disk)",
        model, model_bytes / 1e9, dir, free_bytes / 1e9));
  std::fprintf(stderr, "mer up: packing %s into %s (%.2f GB)\n", model.c_str(), dir.c_str(), model_bytes / 1e9);
  PackOptions o;
  o.overwrite = true;
  ProgressLine progress("mer up: packing", model_bytes);
  o.progress = [&](int done, int n_layer) { progress.Update(model_bytes * done / std::max(1, n_layer)); };
  const absl::Status s = PackExpertStore(model, dir, o).status();
  progress.Finish();
  RETURN_IF_ERROR(s);
  return dir;
}

absl::Status Up(const Args& args) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args,
                                         {"model", "store", "store-dir", "listen", "http-listen",
                                          "served-model-name", "metrics-listen",
                                          "ram-budget", "policy", "backend", "vram-expert-budget",
                                          "max-sequences", "max-batch-tokens", "ctx", "threads",
                                          "max-queue"},
                                         {"prefetch"}));
  if (f.Has("model") == f.Has("store")) return absl::InvalidArgumentError("give exactly one of --model and --store");
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // The ports first: a taken one would otherwise fail only after a long pack and load.
  const std::string listen = f.String("listen", "127.0.0.1:50051");
  const std::string http_listen = f.String("http-listen", "127.0.0.1:8080");
  const std::string metrics_listen = f.String("metrics-listen", "127.0.0.1:9480");
  RETURN_IF_ERROR(CheckPortFree(listen, "--listen"));
  if (http_listen != "off") RETURN_IF_ERROR(CheckPortFree(http_listen, "--http-listen"));
  RETURN_IF_ERROR(CheckPortFree(metrics_listen, "--metrics-listen"));

  ASSIGN_OR_RETURN(const std::string store, EnsureStore(f));
  const std::string bin = SelfDir();
  const std::string instance = absl::StrCat("mer-up-", getpid());
  const std::string run_dir = absl::StrCat(std::filesystem::temp_directory_path().string(), "/", instance);
  std::filesystem::create_directories(run_dir);
  chmod(run_dir.c_str(), 0700);
  const std::string socket = absl::StrCat("unix:", run_dir, "/compute.sock");

  Daemon residency{"residency",
                   {bin + "/mer-residency", "--store", store, "--instance", instance, "--ram-budget",
                    f.String("ram-budget", "25%"), "--policy", f.String("policy", "lfu"),
                    "--metrics-listen", "127.0.0.1:0"}};
  if (f.Has("prefetch")) residency.argv.push_back("--prefetch");
  Daemon compute{"compute",
                 {bin + "/mer-compute", "--store", store, "--residency", instance, "--listen", socket,
                  "--backend", f.String("backend", "cpu"), "--max-sequences",
                  f.String("max-sequences", "8"), "--max-batch-tokens", f.String("max-batch-tokens", "256"),
                  "--ctx", f.String("ctx", "4096"), "--threads", f.String("threads", "0"),
                  "--metrics-listen", "127.0.0.1:0"}};
  if (f.Has("vram-expert-budget"))
    compute.argv.insert(compute.argv.end(), {"--vram-expert-budget", f.String("vram-expert-budget")});
  Daemon gateway{"gateway",
                 {bin + "/mer-gateway", "--compute", socket, "--listen", listen, "--http-listen", http_listen,
                  "--metrics-listen", metrics_listen, "--max-queue", f.String("max-queue", "256")}};
  if (f.Has("served-model-name"))
    gateway.argv.insert(gateway.argv.end(), {"--served-model-name", f.String("served-model-name")});
  std::vector<Daemon*> all = {&residency, &compute, &gateway};

  absl::Status status = StartAndWait(residency, absl::Seconds(120));
  if (status.ok()) status = StartAndWait(compute, absl::Seconds(600));
  if (status.ok()) {
    gateway.argv.insert(gateway.argv.end(), {"--compute-metrics", compute.metrics_url,
                                             "--residency-metrics", residency.metrics_url});
    status = StartAndWait(gateway, absl::Seconds(60));
  }
  if (status.ok()) {
    std::printf("mer up: serving %s\n", store.c_str());
    std::printf("  gRPC API   %s   (mer client --addr %s --prompt ...)\n", gateway.listening.c_str(),
                gateway.listening.c_str());
    if (!gateway.http_url.empty())
      std::printf("  HTTP API   %s   (OpenAI-compatible: %s/v1/chat/completions)\n", gateway.http_url.c_str(),
                  gateway.http_url.c_str());
    std::printf("  metrics    %s   (all three daemons)\n", gateway.metrics_url.c_str());
    std::printf("             compute %s, residency %s\n", compute.metrics_url.c_str(),
                residency.metrics_url.c_str());
    std::printf("  Ctrl-C stops them.\n");
    std::fflush(stdout);
  }
  // Supervise: a daemon whose output ends has exited; restart it (bounded), as systemd would.
  while (status.ok() && !g_stop.load()) {
    std::vector<Daemon*> live;
    for (Daemon* d : all)
      if (d->pid > 0) live.push_back(d);
    for (Daemon* d : Pump(live, absl::Milliseconds(200))) {
      const int ws = Reap(*d);
      if (g_stop.load()) break;
      const absl::Time now = absl::Now();
      std::erase_if(d->restarts, [&](absl::Time t) { return now - t > absl::Minutes(1); });
      if (d->restarts.size() >= 5) {
        status = absl::AbortedError(absl::StrCat("mer-", d->name, " keeps exiting; giving up"));
        break;
      }
      d->restarts.push_back(now);
      std::fprintf(stderr, "mer up: mer-%s exited (status %d); restarting it\n", d->name.c_str(),
                   WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws));
      const absl::Status s = StartAndWait(*d, absl::Seconds(600));
      if (!s.ok() && !g_stop.load()) status = s;
    }
  }
  for (auto it = all.rbegin(); it != all.rend(); ++it) Stop(**it);
  std::error_code ec;
  std::filesystem::remove_all(run_dir, ec);
  if (g_stop.load() && (status.ok() || absl::IsCancelled(status))) {
    std::fprintf(stderr, "mer up: stopped\n");
    return absl::OkStatus();
  }
  return status;
}

}  // namespace

int RunUp(const Args& args) {
  if (MaybeHelp(args, kHelp)) return 0;
  const absl::Status s = Up(args);
  return s.ok() ? 0 : Fail("up", s);
}

}  // namespace mer::cli
