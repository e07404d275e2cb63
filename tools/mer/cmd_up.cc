// `mer up`: the three daemons of one host, started in order by one command for a developer or a
// demo (production uses deploy/systemd/). It packs the model's expert store on first use, starts
// mer-residency, mer-compute and mer-gateway as child processes (the executables beside `mer`),
// and plays systemd's part for them: each gets $NOTIFY_SOCKET (a datagram socket of mer up's),
// so each says READY=1 once it serves and STATUS= as it changes, and $WATCHDOG_USEC, so each pings
// WATCHDOG=1 while its work loop turns; a daemon that stops pinging is killed (SIGABRT, then
// SIGKILL), like a dead one, and restarted (as Restart=on-failure would). The addresses are
// printed once mer-gateway says it serves (it has seen mer-compute, whose residency answers).
// SIGINT/SIGTERM stops them all, in reverse order.
//
// If mer up itself dies (SIGKILL), nothing is left behind: each daemon has PR_SET_PDEATHSIG
// (SIGTERM: it stops cleanly, residency removing its segment, compute its socket), and a small
// janitor process, which holds the read end of a pipe only mer up writes, sees the end of file,
// stops whatever of the daemons' process group is still there and removes the run directory and
// the instance's segment.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/status.h"
#include "common/shm/segment.h"
#include "common/store/expert_store.h"
#include "common/store/packer.h"
#include "services/compute/backend_factory.h"
#include "tools/mer/cli_util.h"

namespace mer::cli {
namespace {

constexpr char kHelp[] = R"(usage: mer up (--model F.gguf [--store-dir DIR] | --store DIR) [--listen HOST:PORT]
              [--http-listen HOST:PORT|off] [--served-model-name NAME]
              [--metrics-listen HOST:PORT] [--ram-budget BYTES|PERCENT%] [--policy lru|lfu|arc]
              [--prefetch] [--backend cpu|cuda] [--vram-expert-budget BYTES|PERCENT%]
              [--multi-token-kernels auto|dp4a|exact|fast] [--max-sequences N] [--max-batch-tokens N] [--ctx N] [--threads N] [--max-queue N]
              [--watchdog-seconds N] [--expert-ranks N] [--gpus G,G,...] [--replicate-hot-experts K]

Starts mer-residency, mer-compute and mer-gateway (found beside this `mer`), each once the one
before is ready, and prints where they serve: the public gRPC API on --listen (default
127.0.0.1:50051), the OpenAI-compatible HTTP API on --http-listen (default 127.0.0.1:8080) and
the host's /metrics on the gateway's --metrics-listen (default 127.0.0.1:9480; the page carries
all three daemons' metrics). These ports are checked before anything is packed or loaded, and a
pack first checks that the disk has room for the store. With --model the expert store is
--store-dir (default F.gguf.store beside the model), packed on first use and packed again when it
no longer matches the model (with progress: bytes, rate and time left, on a terminal). The RAM
tier holds --ram-budget of the experts (default 25%) under --policy (default lfu), filled from
the store at start (mer-residency --warm) while the first requests are served;
--backend, --vram-expert-budget, --multi-token-kernels, --max-sequences (default 8), --max-batch-tokens, --ctx (default
4096 positions per sequence, at most the model's context) and --threads are mer-compute's (see
mer-compute --help); these defaults are deploy/mer.conf's. --expert-ranks N (default 1) runs
mer-compute as N expert-parallel ranks, each reading its share of the experts (e mod N)
from a mer-residency of its own (--expert-share r/N: each instance's --ram-budget, a percentage
of its share's experts), whose metrics are labelled rank="r" on the gateway's page; with
--backend cuda rank r runs on GPU r, or on the r-th GPU of --gpus (given alone it sets the
ranks), its arena holding its whole share; --gpus and --replicate-hot-experts are mer-compute's. A
daemon that exits, or that sends no watchdog ping for --watchdog-seconds (default 30, as the
systemd units' WatchdogSec=; 0: no watchdog) and is killed for it, is restarted (at most 5
times a minute); SIGINT or SIGTERM stops all three; if mer up is killed, they stop too.
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
  std::string metrics_url;                      // from its "metrics: URL" line
  std::string listening;                        // from its "listening on ADDRESS" line
  std::string http_url;                         // from its "http: URL" line
  std::string status;                           // its last STATUS= (sd_notify)
  absl::Time last_ping;                         // its last WATCHDOG=1, or READY=1
  absl::Time kill_at = absl::InfiniteFuture();  // SIGKILL then, after a missed watchdog's SIGABRT
  std::vector<absl::Time> restarts;
};

// What every spawned daemon shares: the notify socket, the watchdog, the process group of the
// janitor, and mer up's pid (for PR_SET_PDEATHSIG's race).
struct Supervision {
  std::string notify_path;
  int notify_fd = -1;
  absl::Duration watchdog;  // zero: none
  pid_t group = 0;          // the janitor's process group, which the daemons join
  pid_t parent = 0;
};
Supervision g_supervision;
std::vector<Daemon*> g_daemons;  // all of them, to attribute notify messages

absl::Status Spawn(Daemon& d) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  const Supervision& sv = g_supervision;
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    // Dies with mer up (SIGTERM: a clean stop), even if mer up died before this line.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != sv.parent) _exit(1);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    // Not mer up's group (a terminal's Ctrl-C reaches mer up, which stops the daemons in order),
    // but the janitor's, which stops what is left if mer up is gone.
    setpgid(0, sv.group);
    setenv("NOTIFY_SOCKET", sv.notify_path.c_str(), 1);
    if (sv.watchdog > absl::ZeroDuration()) {
      setenv("WATCHDOG_USEC", absl::StrCat(absl::ToInt64Microseconds(sv.watchdog)).c_str(), 1);
      setenv("WATCHDOG_PID", absl::StrCat(getpid()).c_str(), 1);
    }
    std::vector<char*> argv;
    for (std::string& a : d.argv) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, sv.group);  // as the child does: whichever runs first
  close(fds[1]);
  d.pid = pid;
  d.out_fd = fds[0];
  d.partial.clear();
  d.ready = false;
  d.status.clear();
  d.kill_at = absl::InfiniteFuture();
  return absl::OkStatus();
}

// One datagram from the notify socket: READY=1, STATUS=, WATCHDOG=1 of the daemon whose pid the
// kernel vouches for (SCM_CREDENTIALS).
void ReadNotify() {
  for (;;) {
    char buf[4096];
    char control[CMSG_SPACE(sizeof(ucred))];
    iovec iov{buf, sizeof buf - 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(g_supervision.notify_fd, &msg, MSG_DONTWAIT);
    if (n <= 0) return;  // nothing more queued
    pid_t sender = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
        sender = cred.pid;
      }
    }
    Daemon* d = nullptr;
    for (Daemon* x : g_daemons)
      if (x->pid > 0 && x->pid == sender) d = x;
    if (d == nullptr) continue;
    for (absl::string_view line : absl::StrSplit(absl::string_view(buf, static_cast<size_t>(n)), '\n')) {
      if (line == "READY=1") {
        d->ready = true;
        d->last_ping = absl::Now();
      } else if (line == "WATCHDOG=1") {
        d->last_ping = absl::Now();
      } else if (absl::StartsWith(line, "STATUS=")) {
        d->status = std::string(line.substr(7));
      }
    }
  }
}

// Reads what the daemon wrote, forwards whole lines to stderr with its name, and notes
// "metrics: URL", "http: URL" and "listening on ADDRESS". Returns false at end of file.
bool Drain(Daemon& d) {
  char buf[4096];
  const ssize_t n = read(d.out_fd, buf, sizeof buf);
  if (n <= 0) return n < 0 && errno == EINTR;
  d.partial.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = d.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string line = d.partial.substr(start, nl - start);
    std::fprintf(stderr, "[%s] %s\n", d.name.c_str(), line.c_str());
    if (absl::StartsWith(line, "metrics: ")) d.metrics_url = line.substr(9);
    if (absl::StartsWith(line, "http: ")) d.http_url = line.substr(6);
    if (const size_t at = line.find("listening on "); at != std::string::npos) d.listening = line.substr(at + 13);
  }
  d.partial.erase(0, start);
  return true;
}

// Polls the daemons' output and the notify socket for up to `timeout`; returns the daemons whose
// output ended.
std::vector<Daemon*> Pump(std::vector<Daemon*> daemons, absl::Duration timeout) {
  std::vector<pollfd> fds;
  for (Daemon* d : daemons) fds.push_back({d->out_fd, POLLIN, 0});
  fds.push_back({g_supervision.notify_fd, POLLIN, 0});
  std::vector<Daemon*> ended;
  if (poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0) return ended;
  for (size_t i = 0; i < daemons.size(); ++i) {
    if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && !Drain(*daemons[i])) ended.push_back(daemons[i]);
  }
  if (fds.back().revents & POLLIN) ReadNotify();
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
      return absl::FailedPreconditionError(
          absl::StrCat("mer-", d.name, " exited before it was ready (status ",
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

bool PidAlive(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

// The pid in "mer-up-PID" or "mer-up-PID-..." (0 if none).
pid_t InstancePid(const std::string& name) {
  if (name.rfind("mer-up-", 0) != 0) return 0;
  return static_cast<pid_t>(std::strtol(name.c_str() + 7, nullptr, 10));
}

// Removes instance `instance`'s segments (its name and the fallbacks of it) that are this user's.
void RemoveSegments(const std::string& instance) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string n = e.path().filename().string();
    struct stat st;
    if ((n == instance || n.rfind(instance + ".", 0) == 0) && lstat(e.path().c_str(), &st) == 0 &&
        st.st_uid == geteuid())
      (void)shm::ShmSegment::Remove(n);
  }
}

// What an earlier mer up of this user left when it and its janitor were both killed: run
// directories and segments of pids that are gone.
void SweepStale(const std::string& tmp) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    const std::string n = e.path().filename().string();
    struct stat st;
    const pid_t pid = InstancePid(n);
    if (pid > 0 && !PidAlive(pid) && lstat(e.path().c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid())
      std::filesystem::remove_all(e.path(), ec);
  }
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string n = e.path().filename().string();
    const pid_t pid = InstancePid(n);
    if (pid > 0 && !PidAlive(pid)) RemoveSegments(n.substr(0, n.find('.')));
  }
}

// Whether a process other than `self` is in process group `group`.
bool GroupHasOthers(pid_t group, pid_t self) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const pid_t pid = static_cast<pid_t>(std::strtol(e.path().filename().c_str(), nullptr, 10));
    if (pid > 0 && pid != self && getpgid(pid) == group) return true;
  }
  return false;
}

// Forks the janitor: it leads the process group the daemons join, and waits for the end of file
// on a pipe whose write end only mer up holds (returned, close-on-exec). When mer up is gone
// without cleaning up (the run directory still exists), it stops the group (SIGTERM, SIGKILL
// after 10 s), then removes the instance's segments and the run directory.
absl::StatusOr<int> StartJanitor(const std::string& run_dir, const std::string& instance) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    close(fds[1]);
    setpgid(0, 0);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    char c;
    while (read(fds[0], &c, 1) < 0 && errno == EINTR) {
    }
    std::error_code ec;
    if (!std::filesystem::exists(run_dir, ec)) _exit(0);  // mer up cleaned up itself
    const pid_t self = getpid();
    kill(-self, SIGTERM);
    for (int i = 0; i < 100 && GroupHasOthers(self, self); ++i) usleep(100 * 1000);
    if (GroupHasOthers(self, self)) {
      kill(-self, SIGKILL);
      for (int i = 0; i < 20 && GroupHasOthers(self, self); ++i) usleep(100 * 1000);
    }
    RemoveSegments(instance);
    std::filesystem::remove_all(run_dir, ec);
    _exit(0);
  }
  close(fds[0]);
  setpgid(pid, pid);
  g_supervision.group = pid;
  return fds[1];
}

absl::StatusOr<int> BindNotifySocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return absl::InvalidArgumentError(absl::StrCat(path, ": too long"));
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const int on = 1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0)
    return absl::InternalError(absl::StrCat("notify socket ", path, ": ", strerror(errno)));
  return fd;
}

// A daemon that has been ready but sent no WATCHDOG=1 for the watchdog interval is wedged:
// SIGABRT (as systemd's WatchdogSignal=), and SIGKILL a few seconds later if it is still there
// (a stopped process does not act on SIGABRT). Its output then ends and it is restarted.
void EnforceWatchdog(Daemon& d) {
  const absl::Duration w = g_supervision.watchdog;
  if (w <= absl::ZeroDuration() || d.pid <= 0 || !d.ready) return;
  const absl::Time now = absl::Now();
  if (d.kill_at == absl::InfiniteFuture() && now - d.last_ping > w) {
    std::fprintf(stderr, "mer up: mer-%s sent no watchdog ping for %s: killing it\n", d.name.c_str(),
                 absl::FormatDuration(absl::Trunc(now - d.last_ping, absl::Milliseconds(100))).c_str());
    kill(d.pid, SIGABRT);
    d.kill_at = now + absl::Seconds(3);
  } else if (now >= d.kill_at) {
    kill(d.pid, SIGKILL);
    d.kill_at = now + absl::Hours(1);
  }
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
        "packing %s needs about %.2f GB in %s; the disk has %.2f GB free (give --store-dir on another disk)", model,
        model_bytes / 1e9, dir, free_bytes / 1e9));
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
                                         {"model",
                                          "store",
                                          "store-dir",
                                          "listen",
                                          "http-listen",
                                          "served-model-name",
                                          "metrics-listen",
                                          "ram-budget",
                                          "policy",
                                          "backend",
                                          "vram-expert-budget",
                                          "multi-token-kernels",
                                          "max-sequences",
                                          "max-batch-tokens",
                                          "ctx",
                                          "threads",
                                          "max-queue",
                                          "watchdog-seconds",
                                          "expert-ranks",
                                          "gpus",
                                          "replicate-hot-experts"},
                                         {"prefetch"}));
  if (f.Has("model") == f.Has("store")) return absl::InvalidArgumentError("give exactly one of --model and --store");
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ASSIGN_OR_RETURN(const int64_t watchdog_seconds, f.IntInRange("watchdog-seconds", 30, 0, 3600));
  std::vector<int> gpus;
  if (f.Has("gpus")) {
    ASSIGN_OR_RETURN(gpus, ParseGpuList(f.String("gpus")));
  }
  // --gpus alone sets the ranks, as mer-compute's does.
  ASSIGN_OR_RETURN(const int64_t ranks,
                   f.IntInRange("expert-ranks", gpus.empty() ? 1 : int64_t(gpus.size()), 1, kMaxExpertRanks));
  RETURN_IF_ERROR(CheckGpuList(gpus, static_cast<int>(ranks), f.String("backend", "cpu")));
  // The ports first: a taken one would otherwise fail only after a long pack and load.
  const std::string listen = f.String("listen", "127.0.0.1:50051");
  const std::string http_listen = f.String("http-listen", "127.0.0.1:8080");
  const std::string metrics_listen = f.String("metrics-listen", "127.0.0.1:9480");
  RETURN_IF_ERROR(CheckPortFree(listen, "--listen"));
  if (http_listen != "off") RETURN_IF_ERROR(CheckPortFree(http_listen, "--http-listen"));
  RETURN_IF_ERROR(CheckPortFree(metrics_listen, "--metrics-listen"));

  ASSIGN_OR_RETURN(const std::string store, EnsureStore(f));
  const std::string bin = SelfDir();
  const std::string tmp = std::filesystem::temp_directory_path().string();
  SweepStale(tmp);
  const std::string instance = absl::StrCat("mer-up-", getpid());
  // A fresh directory only this user can enter (mkdtemp: 0700, a name nobody could have made
  // before), for compute's socket and the notify socket.
  std::string run_dir = absl::StrCat(tmp, "/", instance, "-XXXXXX");
  if (mkdtemp(run_dir.data()) == nullptr)
    return absl::InternalError(absl::StrCat("cannot create ", run_dir, ": ", strerror(errno)));
  g_supervision.parent = getpid();
  g_supervision.watchdog = absl::Seconds(watchdog_seconds);
  g_supervision.notify_path = run_dir + "/notify";
  ASSIGN_OR_RETURN(g_supervision.notify_fd, BindNotifySocket(g_supervision.notify_path));
  ASSIGN_OR_RETURN(const int janitor_pipe, StartJanitor(run_dir, instance));
  (void)janitor_pipe;  // held open until mer up exits, by whatever means
  const std::string socket = absl::StrCat("unix:", run_dir, "/compute.sock");

  // One mer-residency per expert rank: rank r's instance is `instance`.rank<r> (the janitor's
  // RemoveSegments takes every `instance`.* segment), its output prefixed residency[r].
  std::deque<Daemon> residencies;
  for (int r = 0; r < ranks; ++r) {
    const std::string name = RankResidencyInstance(instance, r);
    Daemon& d = residencies.emplace_back(
        ranks == 1 ? "residency" : absl::StrCat("residency[", r, "]"),
        std::vector<std::string>{bin + "/mer-residency", "--store", store, "--instance", name, "--ram-budget",
                                 f.String("ram-budget", "25%"), "--policy", f.String("policy", "lfu"),
                                 "--metrics-listen", "127.0.0.1:0", "--warm"});
    if (ranks > 1) d.argv.insert(d.argv.end(), {"--expert-share", absl::StrCat(r, "/", ranks)});
    if (f.Has("prefetch")) d.argv.push_back("--prefetch");
  }
  Daemon compute{"compute",
                 {bin + "/mer-compute",
                  "--store",
                  store,
                  "--residency",
                  instance,  // rank r's is RankResidencyInstance(instance, r)
                  "--listen",
                  socket,
                  "--expert-ranks",
                  absl::StrCat(ranks),
                  "--backend",
                  f.String("backend", "cpu"),
                  "--max-sequences",
                  f.String("max-sequences", "8"),
                  "--max-batch-tokens",
                  f.String("max-batch-tokens", "256"),
                  "--ctx",
                  f.String("ctx", "4096"),
                  "--threads",
                  f.String("threads", "0"),
                  "--metrics-listen",
                  "127.0.0.1:0"}};
  if (f.Has("vram-expert-budget"))
    compute.argv.insert(compute.argv.end(), {"--vram-expert-budget", f.String("vram-expert-budget")});
  if (f.Has("multi-token-kernels"))
    compute.argv.insert(compute.argv.end(), {"--multi-token-kernels", f.String("multi-token-kernels")});
  if (f.Has("replicate-hot-experts"))
    compute.argv.insert(compute.argv.end(), {"--replicate-hot-experts", f.String("replicate-hot-experts")});
  if (f.Has("gpus")) compute.argv.insert(compute.argv.end(), {"--gpus", f.String("gpus")});
  Daemon gateway{"gateway",
                 {bin + "/mer-gateway", "--compute", socket, "--listen", listen, "--http-listen", http_listen,
                  "--metrics-listen", metrics_listen, "--max-queue", f.String("max-queue", "256")}};
  if (f.Has("served-model-name"))
    gateway.argv.insert(gateway.argv.end(), {"--served-model-name", f.String("served-model-name")});
  std::vector<Daemon*> all;
  for (Daemon& d : residencies) all.push_back(&d);
  all.insert(all.end(), {&compute, &gateway});
  g_daemons = all;

  absl::Status status;
  for (Daemon& d : residencies)
    if (status.ok()) status = StartAndWait(d, absl::Seconds(120));
  if (status.ok()) status = StartAndWait(compute, absl::Seconds(600));
  std::vector<std::string> residency_metrics;
  for (const Daemon& d : residencies) residency_metrics.push_back(d.metrics_url);
  if (status.ok()) {
    gateway.argv.insert(gateway.argv.end(), {"--compute-metrics", compute.metrics_url, "--residency-metrics",
                                             absl::StrJoin(residency_metrics, ",")});
    status = StartAndWait(gateway, absl::Seconds(60));
  }
  // Ready means a first request is served: the gateway says "serving" once it has seen
  // mer-compute answer and able to generate.
  const absl::Time serving_deadline = absl::Now() + absl::Seconds(60);
  while (status.ok() && gateway.status != "serving") {
    if (g_stop.load())
      status = absl::CancelledError("stopped");
    else if (absl::Now() > serving_deadline)
      status = absl::DeadlineExceededError(
          absl::StrCat("mer-gateway did not start serving in 60 s (its status: ", gateway.status, ")"));
    else if (!Pump(all, absl::Milliseconds(100)).empty())
      status = absl::FailedPreconditionError("a daemon exited before mer-gateway served; its output is above");
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
                absl::StrJoin(residency_metrics, ", ").c_str());
    std::printf("  Ctrl-C stops them.\n");
    std::fflush(stdout);
  }
  // Supervise: a daemon whose output ends has exited; restart it (bounded), as systemd would.
  while (status.ok() && !g_stop.load()) {
    std::vector<Daemon*> live;
    for (Daemon* d : all)
      if (d->pid > 0) live.push_back(d);
    for (Daemon* d : live) EnforceWatchdog(*d);
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
