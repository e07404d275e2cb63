// Two-process tests: the binary re-executes itself (/proc/self/exe --shm_peer=MODE ...) as the
// peer, so the child starts from a clean exec and never runs non-async-signal-safe code after a
// fork of a threaded process.
//
//   RingsCarryMillionsOfMessagesBothWays  5M messages each way through the demand and completion
//                                         rings, nothing lost, duplicated or reordered
//   ComputeKilledMidStream                SIGKILL the compute peer mid-stream; residency notices by
//                                         heartbeat, a restarted compute re-attaches (incarnation
//                                         2) and traffic resumes
//   ResidencyKilledMidStream              SIGKILL the residency peer while compute acquires
//                                         experts; compute gets Unavailable without hanging, a
//                                         restarted residency re-creates the segment, compute
//                                         reconnects and carries on
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/shm/client.h"
#include "common/shm/segment.h"
#include "gtest/gtest.h"
#include "tests/unit/common/shm/fake_residency.h"

extern char** environ;

namespace mer::shm {
namespace {

using testing::CheckPattern;
using testing::FakeResidency;
using testing::Mix;

constexpr uint64_t kModel = 0x5eed;
constexpr uint32_t kLayers = 4, kExperts = 32;
const ExpectedIdentity kId{kModel, kLayers, kExperts};

CreateOptions RingOptions() {
  CreateOptions o;
  o.geometry.model_identity = kModel;
  o.geometry.n_layer = kLayers;
  o.geometry.n_expert = kExperts;
  o.geometry.demand_capacity = 4096;
  o.geometry.hint_capacity = 16;
  o.geometry.completion_capacity = 4096;
  o.geometry.ram_slot_count = 16;
  o.geometry.ram_slot_bytes = 4096;
  return o;
}

// ---- message encodings: every field is a function of (incarnation, seq) -----------------------

DemandRequest MakeDemand(uint64_t inc, uint64_t seq) {
  DemandRequest d{};
  d.request_id = inc << 40 | seq;
  d.layer = static_cast<uint32_t>(seq % 97);
  d.expert = static_cast<uint32_t>(Mix(seq) % 4096);
  d.epoch = Mix(d.request_id);
  d.pool = static_cast<uint8_t>(seq & 1);
  return d;
}
bool CheckDemand(const DemandRequest& d) {
  const uint64_t seq = d.request_id & ((1ull << 40) - 1);
  const DemandRequest w = MakeDemand(d.request_id >> 40, seq);
  return std::memcmp(&d, &w, sizeof(d)) == 0;
}
Completion MakeCompletion(uint64_t request_id) {
  Completion c{};
  c.request_id = request_id;
  c.layer = static_cast<uint32_t>(request_id % 89);
  c.expert = static_cast<uint32_t>(request_id * 7);
  c.generation = Mix(request_id ^ 0xc0ffee);
  c.slot = static_cast<uint32_t>(Mix(request_id) >> 7);
  c.status = static_cast<uint16_t>(request_id & 0x7);
  c.pool = static_cast<uint8_t>(request_id & 1);
  return c;
}
bool CheckCompletion(const Completion& c) {
  const Completion w = MakeCompletion(c.request_id);
  return std::memcmp(&c, &w, sizeof(c)) == 0;
}

// ---- spawning the peer ------------------------------------------------------------------------

pid_t SpawnPeer(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"/proc/self/exe"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
  return err == 0 ? pid : -1;
}

// Waits up to `timeout` for the child; returns its exit code, or -1 (still running: killed) or
// 128+signal.
int WaitChild(pid_t pid, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return -2;
    if (absl::Now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

// Whether the child has exited, without reaping it.
bool Exited(pid_t pid) {
  siginfo_t info{};
  return waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

bool ChildExited(pid_t pid, int* code) {
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) != pid) return false;
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

// Kills and reaps the child if a test ends early (a failed ASSERT), so no peer outlives it.
class ChildGuard {
 public:
  explicit ChildGuard(pid_t* pid) : pid_(pid) {}
  ~ChildGuard() {
    if (*pid_ <= 0) return;
    siginfo_t info{};
    if (waitid(P_PID, *pid_, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return;  // reaped already
    if (info.si_pid == 0) kill(*pid_, SIGKILL);                                 // still running
    waitpid(*pid_, nullptr, 0);
  }

 private:
  pid_t* pid_;
};

std::string UniqueName(const char* what) {
  static std::atomic<int> counter{0};
  return absl::StrCat("mer-test-ipc-", what, "-", getpid(), "-", counter++);
}

// ---- the streaming loop both sides of the throughput test run ---------------------------------

struct StreamResult {
  uint64_t sent = 0, received = 0, bad = 0;
  bool timed_out = false;
  absl::Time first, last;  // first and last item received
};

// Pushes `count` items made by make(seq) while popping `count` items checked by check(item, seq),
// in one thread (so the two processes use two cores, not four spinning threads).
template <typename Out, typename In, typename Make, typename Check>
StreamResult Stream(RingProducer<Out>& out, RingConsumer<In>& in, uint64_t count, Make make, Check check,
                    absl::Duration limit, pid_t peer = 0) {
  StreamResult r;
  std::vector<Out> batch(256);
  std::vector<In> got(256);
  const absl::Time end = absl::Now() + limit;
  int idle = 0;
  while (r.sent < count || r.received < count) {
    bool progress = false;
    if (r.sent < count) {
      const size_t n = std::min<uint64_t>(batch.size(), count - r.sent);
      for (size_t i = 0; i < n; ++i) batch[i] = make(r.sent + i);
      const size_t k = out.TryPushBatch(absl::MakeConstSpan(batch.data(), n));
      r.sent += k;
      progress |= k > 0;
    }
    const size_t k = in.PopBatch(absl::MakeSpan(got));
    for (size_t i = 0; i < k; ++i) {
      if (!check(got[i], r.received)) ++r.bad;
      ++r.received;
    }
    if (k > 0 && r.received == k) r.first = absl::Now();
    if (k > 0 && r.received == count) r.last = absl::Now();
    progress |= k > 0;
    if (progress) {
      idle = 0;
      continue;
    }
    if (++idle > 64) {
      if (r.sent == count) {
        in.WaitForData(absl::Milliseconds(1));
      } else {
        sched_yield();
      }
      if ((idle & 1023) == 0 && (absl::Now() > end || (peer > 0 && Exited(peer)))) {
        r.timed_out = true;
        break;
      }
    }
  }
  return r;
}

// ---- child modes ------------------------------------------------------------------------------

// echo: compute side of RingsCarryMillionsOfMessagesBothWays.
int ChildEcho(const std::string& name, uint64_t count) {
  auto seg = ShmSegment::Attach(name, kId);
  if (!seg.ok()) {
    std::fprintf(stderr, "child: %s\n", seg.status().ToString().c_str());
    return 10;
  }
  (*seg)->StartHeartbeat(absl::Milliseconds(10));
  RingProducer<DemandRequest> out((*seg)->demand_ring());
  RingConsumer<Completion> in((*seg)->completion_ring());
  const StreamResult r = Stream(
      out, in, count, [](uint64_t seq) { return MakeDemand(0, seq); },
      [](const Completion& c, uint64_t seq) { return c.request_id == seq && CheckCompletion(c); }, absl::Seconds(60));
  if (r.timed_out) return 11;
  if (r.bad != 0) {
    std::fprintf(stderr, "child: %llu bad completions\n", static_cast<unsigned long long>(r.bad));
    return 12;
  }
  return 0;
}

// stream: compute side of ComputeKilledMidStream. Streams demands tagged with its incarnation
// until killed, or, with count > 0, until `count` completions of its own incarnation came back in
// order (then exits 0).
int ChildStream(const std::string& name, uint64_t count) {
  auto seg = ShmSegment::Attach(name, kId);
  if (!seg.ok()) {
    std::fprintf(stderr, "child: %s\n", seg.status().ToString().c_str());
    return 20;
  }
  (*seg)->StartHeartbeat(absl::Milliseconds(10));
  const uint64_t inc = (*seg)->incarnation();
  RingProducer<DemandRequest> out((*seg)->demand_ring());
  RingConsumer<Completion> in((*seg)->completion_ring());
  std::vector<DemandRequest> batch(128);
  std::vector<Completion> got(256);
  uint64_t sent = 0, mine = 0;
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while (count == 0 || mine < count) {
    for (size_t i = 0; i < batch.size(); ++i) batch[i] = MakeDemand(inc, sent + i);
    sent += out.TryPushBatch(batch);
    const size_t k = in.PopBatch(absl::MakeSpan(got));
    for (size_t i = 0; i < k; ++i) {
      if (!CheckCompletion(got[i])) return 21;
      if ((got[i].request_id >> 40) != inc) continue;  // an echo for a dead predecessor
      if ((got[i].request_id & ((1ull << 40) - 1)) != mine) {
        std::fprintf(stderr, "child: completion %llu, expected %llu\n",
                     static_cast<unsigned long long>(got[i].request_id & ((1ull << 40) - 1)),
                     static_cast<unsigned long long>(mine));
        return 22;
      }
      ++mine;
    }
    if (k == 0) {
      in.WaitForData(absl::Microseconds(500));
      if (absl::Now() > end) return 23;
    }
  }
  return 0;
}

// residency: creates the segment and serves demands with FakeResidency until the compute that
// attached detaches (exit 0), or 60 s pass.
int ChildResidency(const std::string& name) {
  CreateOptions o = RingOptions();
  o.geometry.demand_capacity = 64;
  o.geometry.completion_capacity = 64;
  auto seg = ShmSegment::Create(name, o);
  if (!seg.ok()) {
    std::fprintf(stderr, "child: %s\n", seg.status().ToString().c_str());
    return 30;
  }
  (*seg)->StartHeartbeat(absl::Milliseconds(10));
  FakeResidency fake(seg->get());
  const absl::Time end = absl::Now() + absl::Seconds(60);
  bool seen_compute = false;
  while (absl::Now() < end) {
    if (fake.Poll() == 0) fake.endpoint().demand().WaitForData(absl::Milliseconds(1));
    const PeerInfo p = (*seg)->Peer();
    if (p.state == ProcessState::kAttached) seen_compute = true;
    if (seen_compute && p.state == ProcessState::kDetached) return 0;
  }
  return 31;
}

// ---- tests ------------------------------------------------------------------------------------

TEST(ShmIpcTest, RingsCarryMillionsOfMessagesBothWays) {
  constexpr uint64_t kCount = 5000000;
  const std::string name = UniqueName("rings");
  auto seg = ShmSegment::Create(name, RingOptions());
  ASSERT_TRUE(seg.ok()) << seg.status();
  (*seg)->StartHeartbeat(absl::Milliseconds(10));
  RingProducer<Completion> out((*seg)->completion_ring());
  RingConsumer<DemandRequest> in((*seg)->demand_ring());

  const absl::Time start = absl::Now();
  pid_t child = SpawnPeer({"--shm_peer=echo", "--shm_name=" + name, absl::StrCat("--count=", kCount)});
  ASSERT_GT(child, 0);
  ChildGuard guard(&child);
  const StreamResult r = Stream(
      out, in, kCount, [](uint64_t seq) { return MakeCompletion(seq); },
      [](const DemandRequest& d, uint64_t seq) { return d.request_id == seq && CheckDemand(d); }, absl::Seconds(60),
      child);
  const int code = WaitChild(child, absl::Seconds(30));
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.bad, 0u);
  EXPECT_EQ(r.sent, kCount);
  EXPECT_EQ(r.received, kCount);
  EXPECT_EQ(code, 0);
  EXPECT_FALSE(in.corrupted() || out.corrupted());
  const double rate = 2.0 * kCount / secs;
  const double steady = 2.0 * kCount / absl::ToDoubleSeconds(r.last - r.first);
  std::printf(
      "[ rings    ] %llu messages each way in %.3f s: %.1f M messages/s with the peer's "
      "start, %.1f M/s from first to last message\n",
      static_cast<unsigned long long>(kCount), secs, rate / 1e6, steady / 1e6);
  RecordProperty("messages_per_second", static_cast<int>(rate));
}

TEST(ShmIpcTest, ComputeKilledMidStream) {
  const std::string name = UniqueName("killcompute");
  auto seg = ShmSegment::Create(name, RingOptions());
  ASSERT_TRUE(seg.ok()) << seg.status();
  (*seg)->StartHeartbeat(absl::Milliseconds(10));
  ShmSegment& s = **seg;
  RingProducer<Completion> out(s.completion_ring());
  RingConsumer<DemandRequest> in(s.demand_ring());
  const std::atomic<uint64_t>& compute_inc = s.control().process[static_cast<int>(Role::kCompute)].incarnation;

  // Echoes every demand of the current compute incarnation; checks per-incarnation order.
  std::vector<uint64_t> next_seq(8, 0);
  uint64_t bad = 0, echoed = 0;
  std::vector<DemandRequest> got(256);
  std::vector<Completion> pending;
  auto pump = [&]() -> size_t {
    if (!pending.empty()) {
      const size_t k = out.TryPushBatch(pending);
      pending.erase(pending.begin(), pending.begin() + k);
      echoed += k;
    }
    if (pending.size() > 1024) return 0;
    const size_t k = in.PopBatch(absl::MakeSpan(got));
    const uint64_t current = compute_inc.load(std::memory_order_acquire);
    for (size_t i = 0; i < k; ++i) {
      const DemandRequest& d = got[i];
      const uint64_t inc = d.request_id >> 40, seq = d.request_id & ((1ull << 40) - 1);
      if (!CheckDemand(d) || inc == 0 || inc >= next_seq.size() || seq != next_seq[inc]) {
        ++bad;
        continue;
      }
      ++next_seq[inc];
      if (inc == current) pending.push_back(MakeCompletion(d.request_id));
    }
    return k;
  };

  pid_t child = SpawnPeer({"--shm_peer=stream", "--shm_name=" + name});
  ASSERT_GT(child, 0);
  ChildGuard guard(&child);
  absl::Time end = absl::Now() + absl::Seconds(20);
  while (next_seq[1] < 300000 && absl::Now() < end) {
    if (pump() == 0) in.WaitForData(absl::Milliseconds(1));
  }
  ASSERT_GE(next_seq[1], 300000u) << "the first compute did not stream";
  ASSERT_TRUE(s.CheckPeer(1, absl::Milliseconds(400)).ok());

  // Kill it mid-stream. The survivor learns it from the heartbeat alone (the child is not reaped
  // yet, so its pid still exists) and must not block meanwhile.
  ASSERT_EQ(kill(child, SIGKILL), 0);
  const absl::Time killed = absl::Now();
  absl::Status peer;
  while ((peer = s.CheckPeer(1, absl::Milliseconds(400))).ok() && absl::Now() - killed < absl::Seconds(10)) {
    pump();
    in.WaitForData(absl::Milliseconds(1));
  }
  const absl::Duration detect = absl::Now() - killed;
  EXPECT_TRUE(absl::IsUnavailable(peer)) << peer;
  EXPECT_NE(peer.message().find("heartbeat"), absl::string_view::npos) << peer;
  EXPECT_LT(detect, absl::Seconds(2));
  EXPECT_EQ(WaitChild(child, absl::Seconds(5)), 128 + SIGKILL);
  const uint64_t first_total = next_seq[1];

  // A restarted compute re-attaches as incarnation 2 and traffic resumes.
  constexpr uint64_t kSecond = 200000;
  child = SpawnPeer({"--shm_peer=stream", "--shm_name=" + name, absl::StrCat("--count=", kSecond)});
  ASSERT_GT(child, 0);
  end = absl::Now() + absl::Seconds(20);
  int code = -1;
  while (!ChildExited(child, &code) && absl::Now() < end) {
    if (pump() == 0) in.WaitForData(absl::Milliseconds(1));
  }
  if (absl::Now() >= end) code = WaitChild(child, absl::ZeroDuration());
  EXPECT_EQ(code, 0) << "the restarted compute saw its completions lost, duplicated or reordered";
  EXPECT_EQ(compute_inc.load(), 2u);
  EXPECT_TRUE(absl::IsUnavailable(s.CheckPeer(1, absl::Seconds(1))));
  EXPECT_EQ(bad, 0u);
  EXPECT_GE(next_seq[2], kSecond);
  EXPECT_GE(next_seq[1], first_total);  // what it had pushed before dying, in order (bad == 0)
  std::printf(
      "[ kill     ] compute killed after %llu messages (%llu in all), noticed in %s; "
      "restarted compute streamed %llu more\n",
      static_cast<unsigned long long>(first_total), static_cast<unsigned long long>(next_seq[1]),
      absl::FormatDuration(detect).c_str(), static_cast<unsigned long long>(next_seq[2]));
}

TEST(ShmIpcTest, ResidencyKilledMidStream) {
  const std::string name = UniqueName("killres");
  pid_t child = SpawnPeer({"--shm_peer=residency", "--shm_name=" + name});
  ASSERT_GT(child, 0);
  ChildGuard guard(&child);
  ClientOptions co;
  co.peer_timeout = absl::Milliseconds(400);
  co.poll_interval = absl::Milliseconds(2);
  std::mt19937 rng(7);

  // Runs `steps` steps of 4 experts of a random layer; returns the first error.
  auto run_steps = [&](ResidencyClient& client, int steps, int* done) -> absl::Status {
    for (int i = 0; i < steps; ++i) {
      absl::StatusOr<Step> step = client.BeginStep();
      if (!step.ok()) return step.status();
      const uint32_t layer = rng() % kLayers;
      int32_t experts[4];
      for (int32_t& e : experts) e = static_cast<int32_t>(rng() % kExperts);
      std::vector<PinnedExpert> pinned;
      absl::Status st = client.Acquire(*step, layer, experts, absl::Now() + absl::Seconds(10), &pinned);
      if (st.ok()) {
        for (int j = 0; j < 4; ++j) {
          if (!CheckPattern(pinned[j].bytes, layer, experts[j])) st = absl::DataLossError("pattern");
        }
        client.Release(pinned);
      }
      client.EndStep(*step);
      if (!st.ok()) return st;
      ++*done;
    }
    return absl::OkStatus();
  };

  auto seg = ResidencyClient::Reconnect(name, kId, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(seg.ok()) << seg.status();
  (*seg)->StartHeartbeat(absl::Milliseconds(10));
  int done = 0;
  {
    ResidencyClient client(seg->get(), co);
    ASSERT_TRUE(run_steps(client, 2000, &done).ok());
    EXPECT_GT(client.stats().demands, 100u);  // 128 experts over 16 slots: mostly misses

    // Kill mer-residency mid-stream: the client must come back with Unavailable, not hang.
    ASSERT_EQ(kill(child, SIGKILL), 0);
    const absl::Time killed = absl::Now();
    absl::Status st;
    int more = 0;
    do {
      st = run_steps(client, 1, &more);
    } while (st.ok() && absl::Now() - killed < absl::Seconds(10));
    const absl::Duration detect = absl::Now() - killed;
    EXPECT_TRUE(absl::IsUnavailable(st)) << st;
    EXPECT_LT(detect, absl::Seconds(2));
    std::printf("[ kill     ] residency killed after %d steps; compute got \"%s\" after %s\n", done,
                std::string(st.message()).c_str(), absl::FormatDuration(detect).c_str());
  }
  EXPECT_EQ(WaitChild(child, absl::Seconds(5)), 128 + SIGKILL);

  // A restarted residency re-creates the segment (the old one is superseded); compute reconnects.
  child = SpawnPeer({"--shm_peer=residency", "--shm_name=" + name});
  ASSERT_GT(child, 0);
  const absl::Time end = absl::Now() + absl::Seconds(10);
  std::unique_ptr<ShmSegment> fresh;
  while (absl::Now() < end) {
    auto again = ResidencyClient::Reconnect(name, kId, end);
    ASSERT_TRUE(again.ok()) << again.status();
    if (!(*again)->CheckPeer((*again)->Peer().incarnation, co.peer_timeout).ok()) {
      absl::SleepFor(absl::Milliseconds(5));  // still the dead one's segment
      continue;
    }
    fresh = std::move(*again);
    break;
  }
  ASSERT_NE(fresh, nullptr);
  EXPECT_TRUE(seg->get()->superseded());
  fresh->StartHeartbeat(absl::Milliseconds(10));
  {
    ResidencyClient client(fresh.get(), co);
    int after = 0;
    absl::Status st = run_steps(client, 2000, &after);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(after, 2000);
  }
  fresh.reset();  // compute detaches: the child exits 0
  seg->reset();
  EXPECT_EQ(WaitChild(child, absl::Seconds(10)), 0);
}

}  // namespace
}  // namespace mer::shm

// The child modes run instead of the tests when the first argument is --shm_peer=MODE.
int main(int argc, char** argv) {
  if (argc > 1 && absl::string_view(argv[1]).substr(0, 11) == "--shm_peer=") {
    std::string mode(absl::string_view(argv[1]).substr(11)), name;
    uint64_t count = 0;
    for (int i = 2; i < argc; ++i) {
      absl::string_view a(argv[i]);
      if (a.substr(0, 11) == "--shm_name=") name = std::string(a.substr(11));
      if (a.substr(0, 8) == "--count=" && !absl::SimpleAtoi(a.substr(8), &count)) return 2;
    }
    if (mode == "echo") return mer::shm::ChildEcho(name, count);
    if (mode == "stream") return mer::shm::ChildStream(name, count);
    if (mode == "residency") return mer::shm::ChildResidency(name);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
