// What is particular to UringIoEngine: creation fails with a clear Unavailable when io_uring is
// blocked (as under a container's seccomp profile; simulated here with a seccomp filter in a
// child process), and CreateIoEngine(kAuto) then falls back to pread and says why; registered
// buffers make reads READ_FIXED. The shared contract is in io_engine_test.
#include "common/io/uring_io_engine.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/io/io_engine.h"
#include "common/io/io_file.h"
#include "gtest/gtest.h"
#include "tests/unit/common/io/io_test_util.h"

namespace mer {
namespace {

using ::mer::testing_io::AnyTempDir;
using ::mer::testing_io::CheckRandomReads;
using ::mer::testing_io::DirectIoDir;
using ::mer::testing_io::RandomBytes;
using ::mer::testing_io::RandomReadSpec;
using ::mer::testing_io::TempFile;

// Makes io_uring_setup fail with `err` in this process from now on. False if seccomp is not
// available.
bool BlockIoUringSetup(int err) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(err) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// In a child where io_uring_setup fails with `err`: the uring engine reports Unavailable and
// auto falls back to pread, which reads the file. Returns the child's exit code: 0 good, 77
// seccomp unavailable, else the failed step (printed to stderr).
int RunBlockedChild(int err, const std::string& path, const std::string& contents) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // never hang
    if (!BlockIoUringSetup(err)) _exit(77);
    auto uring = UringIoEngine::Create(IoEngineOptions());
    if (uring.ok() || !absl::IsUnavailable(uring.status()) || !absl::StrContains(uring.status().message(), "pread")) {
      std::fprintf(stderr, "uring: %s\n", uring.ok() ? "ok" : uring.status().ToString().c_str());
      _exit(1);
    }
    std::fprintf(stderr, "blocked as expected: %s\n", uring.status().ToString().c_str());
    auto created = CreateIoEngine(IoEngineKind::kAuto, IoEngineOptions());
    if (!created.ok() || created->kind != IoEngineKind::kPread ||
        !absl::StrContains(created->fallback_reason, strerrorname_np(err))) {
      std::fprintf(stderr, "auto: %s\n",
                   created.ok() ? created->fallback_reason.c_str() : created.status().ToString().c_str());
      _exit(2);
    }
    auto file = ReadOnlyFile::Open(path, DirectIo::kPrefer);
    if (!file.ok()) _exit(3);
    AlignedBuffer dest(contents.size());
    ReadRequest q{file->fd(), 0, contents.size(), dest.data(), 1};
    std::vector<ReadCompletion> done;
    if (!created->engine->Submit({&q, 1}).ok()) _exit(4);
    auto n = created->engine->Wait(1, absl::Seconds(10), &done);
    if (!n.ok() || done.size() != 1 || !done[0].status.ok() ||
        std::memcmp(dest.data(), contents.data(), contents.size()) != 0) {
      _exit(5);
    }
    if (absl::IsUnavailable(CreateIoEngine(IoEngineKind::kUring, IoEngineOptions()).status())) {
      _exit(0);
    }
    _exit(6);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 100;
  if (WIFSIGNALED(status)) return 200 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

TEST(UringIoEngine, BlockedIoUringFallsBackToPread) {
  const std::string contents = RandomBytes(256 << 10, 8);
  TempFile file(AnyTempDir(), contents);
  ASSERT_TRUE(file.ok());
  for (int err : {ENOSYS, EPERM}) {
    const int rc = RunBlockedChild(err, file.path(), contents);
    if (rc == 77) GTEST_SKIP() << "cannot install a seccomp filter here";
    EXPECT_EQ(rc, 0) << "with io_uring_setup failing with " << strerrorname_np(err);
  }
}

class UringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = UringIoEngine::Create(options_);
    if (!e.ok()) GTEST_SKIP() << "io_uring unavailable here: " << e.status();
    engine_ = std::move(e).value();
  }
  IoEngineOptions options_;
  std::unique_ptr<UringIoEngine> engine_;
};

TEST_F(UringTest, RegisteredBuffersAndFilesUseFixedReads) {
  const std::string dir = DirectIoDir();
  if (dir.empty()) GTEST_SKIP() << "no directory here supports O_DIRECT; skipping the O_DIRECT run";
  const std::string contents = RandomBytes(16 << 20, 21);
  TempFile file(dir, contents);
  ASSERT_TRUE(file.ok());
  auto open = ReadOnlyFile::Open(file.path(), DirectIo::kRequire);
  ASSERT_TRUE(open.ok()) << open.status();
  const int fd = open->fd();
  ASSERT_TRUE(engine_->RegisterFiles({&fd, 1}).ok());
  // Blob-sized reads with the default 1 MiB chunks, 8 blobs in flight (40 chunks), all into
  // a registered arena.
  AlignedBuffer arena(8 * (5 << 20));
  IoBuffer b{arena.data(), arena.size()};
  absl::Status reg = engine_->RegisterBuffers({&b, 1});
  if (absl::IsResourceExhausted(reg)) GTEST_SKIP() << reg;  // RLIMIT_MEMLOCK too small
  ASSERT_TRUE(reg.ok()) << reg;
  std::vector<ReadRequest> batch;
  for (int i = 0; i < 8; ++i) {
    batch.push_back({fd, static_cast<uint64_t>(i) * (3 << 20) / 2 / 4096 * 4096, 5 << 20, arena.data() + i * (5 << 20),
                     static_cast<uint64_t>(i)});
  }
  ASSERT_TRUE(engine_->Submit(batch).ok());
  EXPECT_EQ(engine_->inflight(), 40);
  std::vector<ReadCompletion> done;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (done.size() < 8 && absl::Now() < deadline) {
    ASSERT_TRUE(engine_->Wait(8, absl::Seconds(5), &done).ok());
  }
  ASSERT_EQ(done.size(), 8u);
  for (const ReadCompletion& c : done) {
    ASSERT_TRUE(c.status.ok()) << c.status;
    const ReadRequest& q = batch[c.tag];
    EXPECT_EQ(0, std::memcmp(q.dest, contents.data() + q.offset, q.length)) << c.tag;
  }
  const IoEngineStats st = engine_->stats();
  EXPECT_EQ(st.fixed_buffer_chunks, 40u);
  EXPECT_EQ(st.fixed_file_chunks, 40u);
  EXPECT_EQ(st.max_inflight, 40);

  // Re-registering and unregistering between batches.
  ASSERT_TRUE(engine_->RegisterBuffers({}).ok());
  ASSERT_TRUE(engine_->RegisterFiles({}).ok());
  RandomReadSpec spec;
  spec.reads = 100;
  spec.align = 4096;
  spec.max_length = 5 << 20;
  CheckRandomReads(*engine_, fd, contents, spec);
}

TEST_F(UringTest, BufferedFileOnAnyDirectory) {
  const std::string contents = RandomBytes((2 << 20) + 77, 4);
  TempFile file(AnyTempDir(), contents);
  ASSERT_TRUE(file.ok());
  auto open = ReadOnlyFile::Open(file.path(), DirectIo::kOff);
  ASSERT_TRUE(open.ok());
  RandomReadSpec spec;
  spec.reads = 100;
  spec.max_length = 1 << 20;
  spec.register_buffers = false;
  CheckRandomReads(*engine_, open->fd(), contents, spec);
}

}  // namespace
}  // namespace mer
