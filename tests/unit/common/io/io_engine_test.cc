// The IoEngine contract, checked on every engine (mem, pread, uring) with O_DIRECT and buffered
// files: many random reads with up to 64 in flight, split into chunks and reassembled, read
// exactly what the file holds; end of file before the requested length is OutOfRange; an OS
// error is an error naming the offset; the queue depth is respected; nothing hangs.
#include "common/io/io_engine.h"

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/io/io_file.h"
#include "common/io/mem_io_engine.h"
#include "common/io/pread_io_engine.h"
#include "common/io/uring_io_engine.h"
#include "gmock/gmock.h"
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
using ::testing::HasSubstr;

enum class Engine { kMem, kPread, kUring };
enum class Mode { kDirect, kBuffered };

struct Param {
  Engine engine;
  Mode mode;
};

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const char* e = info.param.engine == Engine::kMem ? "Mem" : info.param.engine == Engine::kPread ? "Pread" : "Uring";
  return absl::StrCat(e, info.param.mode == Mode::kDirect ? "Direct" : "Buffered");
}

// 8 MiB and a bit: the last 1234 bytes are a partial block, so reads there meet end of file.
constexpr uint64_t kFileBytes = (8 << 20) + 1234;
constexpr uint64_t kAlignedBytes = kFileBytes / kDirectIoAlignment * kDirectIoAlignment;

class IoEngineTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    contents_ = RandomBytes(kFileBytes, 42);
    direct_ = GetParam().mode == Mode::kDirect;
    align_ = direct_ ? kDirectIoAlignment : 1;
    if (GetParam().engine != Engine::kMem) {
      const std::string dir = direct_ ? DirectIoDir() : AnyTempDir();
      if (dir.empty()) {
        GTEST_SKIP() << "no directory here supports O_DIRECT ($TEST_TMPDIR, /tmp, /var/tmp, .); "
                        "the O_DIRECT variants are skipped, the buffered ones still run";
      }
      file_ = std::make_unique<TempFile>(dir, contents_);
      ASSERT_TRUE(file_->ok()) << "cannot write a test file in " << dir;
      absl::StatusOr<ReadOnlyFile> f = ReadOnlyFile::Open(file_->path(), direct_ ? DirectIo::kRequire : DirectIo::kOff);
      ASSERT_TRUE(f.ok()) << f.status();
      ASSERT_EQ(f->direct(), direct_);
      ASSERT_EQ(f->size(), kFileBytes);
      open_ = std::move(f).value();
    }
  }

  // An engine of the parameter's kind; nullptr (and the test skipped) if io_uring is unavailable.
  std::unique_ptr<IoEngine> MakeEngine(const IoEngineOptions& options) {
    switch (GetParam().engine) {
      case Engine::kMem: {
        MemIoOptions mem;
        if (direct_) mem.alignment = kDirectIoAlignment;
        auto e = MemIoEngine::Create(options, mem);
        EXPECT_TRUE(e.ok()) << e.status();
        if (!e.ok()) return nullptr;
        fd_ = (*e)->AddFile(contents_);
        return std::move(e).value();
      }
      case Engine::kPread: {
        auto e = PreadIoEngine::Create(options);
        EXPECT_TRUE(e.ok()) << e.status();
        fd_ = open_.fd();
        return e.ok() ? std::move(e).value() : nullptr;
      }
      case Engine::kUring: {
        auto e = UringIoEngine::Create(options);
        if (!e.ok()) {
          EXPECT_TRUE(absl::IsUnavailable(e.status())) << e.status();
          std::printf("io_uring unavailable, skipping: %s\n", e.status().ToString().c_str());
          return nullptr;
        }
        fd_ = open_.fd();
        return std::move(e).value();
      }
    }
    return nullptr;
  }

  // Submits one read and waits (bounded) for its completion.
  ReadCompletion ReadOne(IoEngine& engine, int fd, uint64_t offset, uint64_t length, void* dest) {
    ReadRequest q{fd, offset, length, dest, 99};
    absl::Status s = engine.Submit({&q, 1});
    EXPECT_TRUE(s.ok()) << s;
    std::vector<ReadCompletion> done;
    absl::StatusOr<int> n = engine.Wait(1, absl::Seconds(20), &done);
    EXPECT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(done.size(), 1u) << "no completion within 20 s";
    if (done.size() != 1) return {0, absl::DeadlineExceededError("no completion"), 0};
    EXPECT_EQ(done[0].tag, 99u);
    return done[0];
  }

  std::string contents_;
  bool direct_ = false;
  uint64_t align_ = 1;
  std::unique_ptr<TempFile> file_;
  ReadOnlyFile open_;
  int fd_ = -1;
};

#define MAKE_ENGINE_OR_SKIP(engine, options)                        \
  std::unique_ptr<IoEngine> engine = MakeEngine(options);           \
  if (engine == nullptr) {                                          \
    if (!HasFailure()) GTEST_SKIP() << "io_uring unavailable here"; \
    return;                                                         \
  }

TEST_P(IoEngineTest, RandomReadsWithManyInFlightMatchTheFile) {
  IoEngineOptions options;
  options.io_inflight_max = 64;
  options.chunk_bytes = 64 << 10;  // so most reads split into several chunks
  MAKE_ENGINE_OR_SKIP(engine, options);
  if (GetParam().engine != Engine::kMem) {
    ASSERT_TRUE(engine->RegisterFiles({&fd_, 1}).ok());
  }
  RandomReadSpec spec;
  spec.reads = 400;
  spec.max_outstanding = 64;
  spec.align = align_;
  spec.readable = direct_ ? kAlignedBytes : kFileBytes;
  CheckRandomReads(*engine, fd_, contents_, spec);
  const IoEngineStats st = engine->stats();
  EXPECT_EQ(st.requests_completed, 400u);
  EXPECT_EQ(st.requests_failed, 0u);
  EXPECT_GT(st.chunks_issued, st.requests_completed);  // reads were split
  EXPECT_LE(st.max_inflight, 64);
  EXPECT_GT(st.max_inflight, 8) << "reads should overlap";
  EXPECT_GT(st.fixed_buffer_chunks, 0u);  // half the destinations are in the registered arena
  EXPECT_LT(st.fixed_buffer_chunks, st.chunks_issued);
  if (GetParam().engine != Engine::kMem) {
    EXPECT_EQ(st.fixed_file_chunks, st.chunks_issued);
  }
  std::printf("%s: %llu chunks for 400 reads, %llu into registered buffers, at most %d in flight\n",
              engine->name().c_str(), static_cast<unsigned long long>(st.chunks_issued),
              static_cast<unsigned long long>(st.fixed_buffer_chunks), st.max_inflight);
}

TEST_P(IoEngineTest, FiveMiBBlobWithDefaultChunksIsOneCompletion) {
  MAKE_ENGINE_OR_SKIP(engine, IoEngineOptions());
  const uint64_t length = 5 << 20, offset = 3 * kDirectIoAlignment;
  AlignedBuffer dest(length);
  ReadCompletion c = ReadOne(*engine, fd_, offset, length, dest.data());
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.bytes, length);
  EXPECT_EQ(0, std::memcmp(dest.data(), contents_.data() + offset, length));
  EXPECT_EQ(engine->stats().chunks_issued, 5u);
  EXPECT_EQ(engine->stats().requests_completed, 1u);
}

TEST_P(IoEngineTest, EndOfFileBeforeTheLengthIsOutOfRange) {
  IoEngineOptions options;
  options.chunk_bytes = 64 << 10;
  MAKE_ENGINE_OR_SKIP(engine, options);
  AlignedBuffer dest(1 << 20);
  // Across the end: the partial last block and beyond.
  const uint64_t offset = kAlignedBytes - 2 * kDirectIoAlignment;
  ReadCompletion c = ReadOne(*engine, fd_, offset, 4 * kDirectIoAlignment, dest.data());
  EXPECT_TRUE(absl::IsOutOfRange(c.status)) << c.status;
  EXPECT_THAT(c.status.message(), HasSubstr(absl::StrCat("offset ", offset)));
  EXPECT_THAT(c.status.message(), HasSubstr(absl::StrCat("end of file at offset ", kFileBytes)));
  EXPECT_EQ(c.bytes, 0u);
  // Wholly past the end.
  c = ReadOne(*engine, fd_, kAlignedBytes + 16 * kDirectIoAlignment, kDirectIoAlignment, dest.data());
  EXPECT_TRUE(absl::IsOutOfRange(c.status)) << c.status;
  // A multi-chunk read whose last chunk meets the end.
  c = ReadOne(*engine, fd_, kAlignedBytes - (256 << 10), 512 << 10, dest.data());
  EXPECT_TRUE(absl::IsOutOfRange(c.status)) << c.status;
  // The partial last block itself: fine buffered (exact length), short under O_DIRECT.
  if (!direct_) {
    c = ReadOne(*engine, fd_, kAlignedBytes, kFileBytes - kAlignedBytes, dest.data());
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(0, std::memcmp(dest.data(), contents_.data() + kAlignedBytes, kFileBytes - kAlignedBytes));
  } else {
    c = ReadOne(*engine, fd_, kAlignedBytes, kDirectIoAlignment, dest.data());
    EXPECT_TRUE(absl::IsOutOfRange(c.status)) << c.status;
  }
  // And the engine still works.
  c = ReadOne(*engine, fd_, 0, 128 << 10, dest.data());
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(0, std::memcmp(dest.data(), contents_.data(), 128 << 10));
}

TEST_P(IoEngineTest, OsErrorsNameTheOffset) {
  MAKE_ENGINE_OR_SKIP(engine, IoEngineOptions());
  AlignedBuffer dest(64 << 10);
  if (GetParam().engine == Engine::kMem) {
    ReadCompletion c = ReadOne(*engine, 12345, 8192, 4096, dest.data());  // no such file
    EXPECT_FALSE(c.status.ok());
    EXPECT_THAT(c.status.message(), HasSubstr("file offset 8192"));
    EXPECT_THAT(c.status.message(), HasSubstr("EBADF"));
  } else {
    const int dir = open(AnyTempDir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(dir, 0);
    ReadCompletion c = ReadOne(*engine, dir, 8192, 4096, dest.data());
    close(dir);
    EXPECT_FALSE(c.status.ok());
    EXPECT_THAT(c.status.message(), HasSubstr("file offset 8192"));
    EXPECT_THAT(c.status.message(), HasSubstr("EISDIR"));
  }
  if (direct_) {  // misaligned O_DIRECT offset: EINVAL from the kernel
    ReadCompletion c = ReadOne(*engine, fd_, 4097, 4096, dest.data());
    EXPECT_TRUE(absl::IsInvalidArgument(c.status)) << c.status;
    EXPECT_THAT(c.status.message(), HasSubstr("file offset 4097"));
  }
  ReadCompletion c = ReadOne(*engine, fd_, 4096, 4096, dest.data());
  EXPECT_TRUE(c.status.ok()) << c.status;
}

TEST_P(IoEngineTest, FarMoreRequestsThanTheQueueDepth) {
  IoEngineOptions options;
  options.io_inflight_max = 4;
  options.chunk_bytes = 16 << 10;
  MAKE_ENGINE_OR_SKIP(engine, options);
  constexpr int kReads = 120;
  constexpr uint64_t kLen = 40 << 10;  // 3 chunks each
  AlignedBuffer dest(kReads * kLen);
  std::vector<ReadRequest> batch;
  for (int i = 0; i < kReads; ++i) {
    batch.push_back({fd_, static_cast<uint64_t>(i) * kLen, kLen, dest.data() + i * kLen, static_cast<uint64_t>(i)});
  }
  ASSERT_TRUE(engine->Submit(batch).ok());  // never blocks, whatever the depth
  EXPECT_EQ(engine->outstanding(), kReads);
  EXPECT_LE(engine->inflight(), 4);
  std::vector<ReadCompletion> done;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (done.size() < kReads && absl::Now() < deadline) {
    ASSERT_TRUE(engine->Wait(kReads, absl::Seconds(5), &done).ok());
    EXPECT_LE(engine->inflight(), 4);
  }
  ASSERT_EQ(done.size(), static_cast<size_t>(kReads));
  std::vector<bool> seen(kReads);
  for (const ReadCompletion& c : done) {
    ASSERT_TRUE(c.status.ok()) << c.status;
    seen[c.tag] = true;
  }
  for (int i = 0; i < kReads; ++i) EXPECT_TRUE(seen[i]) << i;
  EXPECT_EQ(0, std::memcmp(dest.data(), contents_.data(), kReads * kLen));
  EXPECT_LE(engine->stats().max_inflight, 4);
  EXPECT_EQ(engine->stats().chunks_issued, kReads * 3u);
}

TEST_P(IoEngineTest, WaitNeverHangs) {
  MAKE_ENGINE_OR_SKIP(engine, IoEngineOptions());
  std::vector<ReadCompletion> done;
  // Nothing outstanding: returns at once even when asked for more.
  absl::Time start = absl::Now();
  absl::StatusOr<int> n = engine->Wait(5, absl::InfiniteDuration(), &done);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  // Polling with min 0 and asking for more than outstanding.
  AlignedBuffer dest(8192);
  ReadRequest q{fd_, 0, 8192, dest.data(), 5};
  ASSERT_TRUE(engine->Submit({&q, 1}).ok());
  ASSERT_TRUE(engine->Wait(0, absl::ZeroDuration(), &done).ok());
  n = engine->Wait(10, absl::Seconds(20), &done);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(engine->outstanding(), 0);
}

TEST_P(IoEngineTest, BadRequestsAndRegistrationsAreRejected) {
  MAKE_ENGINE_OR_SKIP(engine, IoEngineOptions());
  AlignedBuffer dest(8192);
  std::vector<ReadRequest> batch = {{fd_, 0, 4096, dest.data(), 1}, {fd_, 0, 4096, nullptr, 2}};
  EXPECT_TRUE(absl::IsInvalidArgument(engine->Submit(batch)));
  EXPECT_EQ(engine->outstanding(), 0);  // nothing of the batch was queued
  batch = {{fd_, 0, 0, dest.data(), 3}};
  EXPECT_TRUE(absl::IsInvalidArgument(engine->Submit(batch)));
  batch = {{-1, 0, 4096, dest.data(), 4}};
  EXPECT_TRUE(absl::IsInvalidArgument(engine->Submit(batch)));

  IoBuffer huge{dest.data(), size_t{2} << 30};
  EXPECT_TRUE(absl::IsInvalidArgument(engine->RegisterBuffers({&huge, 1})));
  IoBuffer overlap[2] = {{dest.data(), 8192}, {dest.data() + 4096, 4096}};
  EXPECT_TRUE(absl::IsInvalidArgument(engine->RegisterBuffers(overlap)));
  const int twice[2] = {fd_, fd_};
  EXPECT_TRUE(absl::IsInvalidArgument(engine->RegisterFiles(twice)));

  // Registration needs an idle engine.
  ReadRequest q{fd_, 0, 4096, dest.data(), 5};
  ASSERT_TRUE(engine->Submit({&q, 1}).ok());
  IoBuffer b{dest.data(), dest.size()};
  EXPECT_TRUE(absl::IsFailedPrecondition(engine->RegisterBuffers({&b, 1})));
  EXPECT_TRUE(absl::IsFailedPrecondition(engine->RegisterFiles({&fd_, 1})));
  std::vector<ReadCompletion> done;
  ASSERT_TRUE(engine->Wait(1, absl::Seconds(20), &done).ok());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(engine->RegisterBuffers({&b, 1}).ok());
  EXPECT_TRUE(engine->RegisterFiles({&fd_, 1}).ok());
}

// Destroying an engine with reads in flight waits for them: once it is gone nothing writes into
// the destination any more, and what was written is the file's bytes.
TEST_P(IoEngineTest, DestroyedWithReadsInFlight) {
  IoEngineOptions options;
  options.chunk_bytes = 64 << 10;
  constexpr uint64_t kBytes = 4 << 20;
  AlignedBuffer dest(kBytes);
  std::memset(dest.data(), 0xA5, kBytes);
  {
    MAKE_ENGINE_OR_SKIP(engine, options);
    ReadRequest q{fd_, 0, kBytes, dest.data(), 1};
    ASSERT_TRUE(engine->Submit({&q, 1}).ok());
  }  // waits for the reads in flight, drops the rest
  const std::vector<uint8_t> after(dest.data(), dest.data() + kBytes);
  absl::SleepFor(absl::Milliseconds(50));  // a read the destructor did not wait for lands now
  EXPECT_EQ(std::memcmp(after.data(), dest.data(), kBytes), 0) << "written after the engine was destroyed";
  for (uint64_t off = 0; off < kBytes; off += options.chunk_bytes) {
    const uint8_t* chunk = dest.data() + off;
    const bool untouched = std::all_of(chunk, chunk + options.chunk_bytes, [](uint8_t b) { return b == 0xA5; });
    if (!untouched) {
      EXPECT_EQ(std::memcmp(chunk, contents_.data() + off, options.chunk_bytes), 0) << "chunk at " << off;
    }
  }
}

std::vector<Param> AllParams() {
  std::vector<Param> p;
  for (Engine e : {Engine::kMem, Engine::kPread, Engine::kUring}) {
    for (Mode m : {Mode::kDirect, Mode::kBuffered}) p.push_back({e, m});
  }
  return p;
}

INSTANTIATE_TEST_SUITE_P(Engines, IoEngineTest, ::testing::ValuesIn(AllParams()), ParamName);

TEST(IoEngineOptions, Validation) {
  IoEngineOptions o;
  EXPECT_TRUE(ValidateIoEngineOptions(o).ok());
  o.chunk_bytes = 5000;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateIoEngineOptions(o)));
  o = IoEngineOptions();
  o.io_inflight_max = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateIoEngineOptions(o)));
  EXPECT_FALSE(CreateIoEngine(IoEngineKind::kAuto, o).ok());
  EXPECT_FALSE(PreadIoEngine::Create(o).ok());
  EXPECT_FALSE(UringIoEngine::Create(o).ok());
}

TEST(CreateIoEngine, KindsAndNames) {
  for (absl::string_view name : {"auto", "uring", "pread"}) {
    absl::StatusOr<IoEngineKind> k = ParseIoEngineKind(name);
    ASSERT_TRUE(k.ok());
    EXPECT_EQ(IoEngineKindName(*k), name);
  }
  EXPECT_TRUE(absl::IsInvalidArgument(ParseIoEngineKind("aio").status()));

  absl::StatusOr<CreatedIoEngine> p = CreateIoEngine(IoEngineKind::kPread, IoEngineOptions());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, IoEngineKind::kPread);
  EXPECT_EQ(p->engine->name(), "pread");

  absl::StatusOr<CreatedIoEngine> a = CreateIoEngine(IoEngineKind::kAuto, IoEngineOptions());
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::unique_ptr<UringIoEngine>> u = UringIoEngine::Create(IoEngineOptions());
  if (u.ok()) {
    EXPECT_EQ(a->kind, IoEngineKind::kUring);
    EXPECT_EQ(a->engine->name(), "uring");
    EXPECT_TRUE(a->fallback_reason.empty());
  } else {
    EXPECT_EQ(a->kind, IoEngineKind::kPread);
    EXPECT_THAT(a->fallback_reason, HasSubstr("io_uring"));
  }
  std::printf("auto chose %s%s\n", std::string(IoEngineKindName(a->kind)).c_str(),
              a->fallback_reason.empty() ? "" : (" because " + a->fallback_reason).c_str());
}

TEST(ReadOnlyFile, OpensDirectWherePossible) {
  TempFile f(AnyTempDir(), RandomBytes(3 * kDirectIoAlignment, 1));
  ASSERT_TRUE(f.ok());
  absl::StatusOr<ReadOnlyFile> buffered = ReadOnlyFile::Open(f.path(), DirectIo::kOff);
  ASSERT_TRUE(buffered.ok());
  EXPECT_FALSE(buffered->direct());
  EXPECT_EQ(buffered->size(), 3 * kDirectIoAlignment);
  absl::StatusOr<ReadOnlyFile> prefer = ReadOnlyFile::Open(f.path(), DirectIo::kPrefer);
  ASSERT_TRUE(prefer.ok());
  EXPECT_EQ(prefer->direct(), !DirectIoDir().empty() && DirectIoDir() == AnyTempDir());
  absl::StatusOr<ReadOnlyFile> missing = ReadOnlyFile::Open(f.path() + ".missing", DirectIo::kPrefer);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr(".missing"));
}

}  // namespace
}  // namespace mer
