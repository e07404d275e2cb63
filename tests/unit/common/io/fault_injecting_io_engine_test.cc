// FaultInjectingIoEngine, and through it the engines' fault handling: injected short reads are
// continued (data still exact), injected EIO fails the read covering it with DataLoss naming the
// offset, EAGAIN is retried, slow reads respect Wait's timeout, bit flips are delivered (and a
// checksum over the blob tells), and everything is deterministic for a seed.
#include "common/io/fault_injecting_io_engine.h"

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/check.h"
#include "common/io/io_engine.h"
#include "common/io/io_file.h"
#include "common/io/mem_io_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/io/io_test_util.h"

namespace mer {
namespace {

using ::mer::testing_io::AnyTempDir;
using ::mer::testing_io::CheckRandomReads;
using ::mer::testing_io::DirectIoDir;
using ::mer::testing_io::Fnv1a;
using ::mer::testing_io::RandomBytes;
using ::mer::testing_io::RandomReadSpec;
using ::mer::testing_io::TempFile;
using ::testing::HasSubstr;

constexpr uint64_t kFileBytes = 4 << 20;

struct Fixture {
  std::string contents = RandomBytes(kFileBytes, 3);
  int fd = -1;
  std::unique_ptr<FaultInjectingIoEngine> engine;
};

// A fault injector over a MemIoEngine holding `contents`.
Fixture OverMem(const FaultInjectionOptions& faults, IoEngineOptions options = {}, MemIoOptions mem = {}) {
  Fixture f;
  auto inner = MemIoEngine::Create(options, mem);
  CHECK(inner.ok());
  f.fd = (*inner)->AddFile(f.contents);
  auto e = FaultInjectingIoEngine::Create(std::move(inner).value(), faults);
  CHECK(e.ok());
  f.engine = std::move(e).value();
  return f;
}

// Reads every request of `batch` and returns the completions by tag (bounded wait).
std::vector<ReadCompletion> ReadAll(IoEngine& engine, const std::vector<ReadRequest>& batch) {
  EXPECT_TRUE(engine.Submit(batch).ok());
  std::vector<ReadCompletion> done;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (done.size() < batch.size() && absl::Now() < deadline) {
    EXPECT_TRUE(engine.Wait(static_cast<int>(batch.size()), absl::Seconds(5), &done).ok());
  }
  EXPECT_EQ(done.size(), batch.size()) << "reads did not complete within 30 s";
  std::vector<ReadCompletion> by_tag(batch.size());
  for (ReadCompletion& c : done) by_tag.at(c.tag) = std::move(c);
  return by_tag;
}

TEST(FaultInjectingIoEngine, PassesThroughWithoutFaults) {
  IoEngineOptions options;
  options.chunk_bytes = 64 << 10;
  Fixture f = OverMem({}, options);
  EXPECT_EQ(f.engine->name(), "fault(mem)");
  RandomReadSpec spec;
  spec.reads = 200;
  CheckRandomReads(*f.engine, f.fd, f.contents, spec);
  EXPECT_EQ(f.engine->fault_stats().errors + f.engine->fault_stats().short_reads, 0u);
}

TEST(FaultInjectingIoEngine, InjectedShortReadsAreContinued) {
  IoEngineOptions options;
  options.chunk_bytes = 64 << 10;
  FaultInjectionOptions faults;
  faults.short_read_probability = 0.5;
  faults.short_read_alignment = 4096;
  Fixture f = OverMem(faults, options);
  RandomReadSpec spec;
  spec.reads = 300;
  spec.align = 4096;  // as under O_DIRECT: continuations stay aligned
  CheckRandomReads(*f.engine, f.fd, f.contents, spec);
  EXPECT_GT(f.engine->fault_stats().short_reads, 50u);
  EXPECT_EQ(f.engine->stats().short_reads, f.engine->fault_stats().short_reads);
  EXPECT_EQ(f.engine->stats().requests_failed, 0u);
}

TEST(FaultInjectingIoEngine, UnalignedShortReadsAreContinuedToo) {
  FaultInjectionOptions faults;
  faults.short_read_probability = 1.0;
  faults.short_read_alignment = 0;  // any length, down to a byte
  IoEngineOptions options;
  options.chunk_bytes = 16 << 10;
  Fixture f = OverMem(faults, options);
  RandomReadSpec spec;
  spec.reads = 100;
  spec.max_length = 100 << 10;
  CheckRandomReads(*f.engine, f.fd, f.contents, spec);
  EXPECT_GT(f.engine->stats().short_reads, 100u);
}

TEST(MemIoEngine, ShortReadsFromTheEngineAreContinued) {
  IoEngineOptions options;
  options.chunk_bytes = 64 << 10;
  MemIoOptions mem;
  mem.max_bytes_per_read = 12288;  // every chunk comes back in 3..6 pieces
  auto e = MemIoEngine::Create(options, mem);
  ASSERT_TRUE(e.ok());
  const std::string contents = RandomBytes(kFileBytes, 9);
  const int fd = (*e)->AddFile(contents);
  RandomReadSpec spec;
  spec.reads = 200;
  CheckRandomReads(**e, fd, contents, spec);
  EXPECT_GT((*e)->stats().short_reads, 200u);
  EXPECT_EQ((*e)->stats().requests_failed, 0u);
}

TEST(FaultInjectingIoEngine, EioFailsTheReadCoveringItWithItsOffset) {
  IoEngineOptions options;
  options.chunk_bytes = 64 << 10;
  options.io_inflight_max = 2;
  FaultInjectionOptions faults;
  const uint64_t bad = (1 << 20) + 70000;  // inside the chunk at 1 MiB + 64 KiB
  faults.rules.push_back({.kind = FaultKind::kError, .offset_begin = bad, .offset_end = bad + 1});
  Fixture f = OverMem(faults, options);
  AlignedBuffer dest(3 << 20);
  // tag 0: 1 MiB .. 2 MiB covers it, 16 chunks; tag 1 and 2 do not.
  std::vector<ReadRequest> batch = {{f.fd, 1 << 20, 1 << 20, dest.data(), 0},
                                    {f.fd, 0, 1 << 20, dest.data() + (1 << 20), 1},
                                    {f.fd, 2 << 20, 1 << 20, dest.data() + (2 << 20), 2}};
  std::vector<ReadCompletion> done = ReadAll(*f.engine, batch);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_TRUE(absl::IsDataLoss(done[0].status)) << done[0].status;
  EXPECT_THAT(done[0].status.message(), HasSubstr("EIO"));
  EXPECT_THAT(done[0].status.message(), HasSubstr(absl::StrCat("file offset ", (1 << 20) + 65536)));
  EXPECT_THAT(done[0].status.message(), HasSubstr(absl::StrCat("offset ", 1 << 20)));
  EXPECT_EQ(done[0].bytes, 0u);
  for (int t : {1, 2}) {
    ASSERT_TRUE(done[t].status.ok()) << done[t].status;
    EXPECT_EQ(0, std::memcmp(dest.data() + (t == 1 ? 1 << 20 : 2 << 20), f.contents.data() + (t == 1 ? 0 : 2 << 20),
                             1 << 20));
  }
  // The failed read's chunks not yet issued were dropped: fewer than 48 chunks went out.
  EXPECT_LT(f.engine->stats().chunks_issued, 48u);
  EXPECT_EQ(f.engine->stats().requests_failed, 1u);
  EXPECT_EQ(f.engine->fault_stats().errors, 1u);
}

TEST(FaultInjectingIoEngine, TransientEagainIsRetriedPersistentFails) {
  FaultInjectionOptions faults;
  faults.rules.push_back(
      {.kind = FaultKind::kError, .offset_begin = 0, .offset_end = 4096, .times = 3, .error = EAGAIN});
  Fixture f = OverMem(faults);
  AlignedBuffer dest(8192);
  std::vector<ReadCompletion> done = ReadAll(*f.engine, {{f.fd, 0, 8192, dest.data(), 0}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(f.engine->stats().retries, 3u);
  EXPECT_EQ(0, std::memcmp(dest.data(), f.contents.data(), 8192));

  f.engine->AddRule({.kind = FaultKind::kError, .offset_begin = 0, .offset_end = 4096, .error = EAGAIN});
  done = ReadAll(*f.engine, {{f.fd, 0, 8192, dest.data(), 0}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(done[0].status)) << done[0].status;
  EXPECT_THAT(done[0].status.message(), HasSubstr("EAGAIN"));
}

TEST(FaultInjectingIoEngine, EndOfFileIsOutOfRange) {
  FaultInjectionOptions faults;
  faults.short_read_probability = 1.0;
  Fixture f = OverMem(faults);
  AlignedBuffer dest(1 << 20);
  std::vector<ReadCompletion> done = ReadAll(*f.engine, {{f.fd, kFileBytes - 65536, 1 << 20, dest.data(), 0}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(absl::IsOutOfRange(done[0].status)) << done[0].status;
  EXPECT_THAT(done[0].status.message(), HasSubstr(absl::StrCat("offset ", kFileBytes - 65536)));
  EXPECT_THAT(done[0].status.message(), HasSubstr(absl::StrCat("read of ", 1 << 20, " bytes")));
}

TEST(FaultInjectingIoEngine, BitFlipsAreDeliveredAndChecksumsCatchThem) {
  FaultInjectionOptions faults;
  const uint64_t byte = 123457;
  faults.rules.push_back({.kind = FaultKind::kBitFlip, .offset_begin = byte, .offset_end = byte + 1, .times = 1});
  Fixture f = OverMem(faults);
  const uint64_t offset = 100 << 10, length = 200 << 10;
  AlignedBuffer dest(length);
  std::vector<ReadCompletion> done = ReadAll(*f.engine, {{f.fd, offset, length, dest.data(), 0}});
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(done[0].status.ok()) << done[0].status;  // the read "succeeds"
  const auto* want = reinterpret_cast<const uint8_t*>(f.contents.data()) + offset;
  EXPECT_NE(Fnv1a(dest.data(), length), Fnv1a(want, length));
  for (uint64_t i = 0; i < length; ++i) {
    const uint8_t diff = dest.data()[i] ^ want[i];
    if (offset + i == byte) {
      EXPECT_EQ(__builtin_popcount(diff), 1) << "one bit of byte " << byte;
    } else {
      ASSERT_EQ(diff, 0) << "byte " << offset + i;
    }
  }
  EXPECT_EQ(f.engine->fault_stats().bit_flips, 1u);
  // times = 1: the next read is clean.
  done = ReadAll(*f.engine, {{f.fd, offset, length, dest.data(), 0}});
  ASSERT_TRUE(done[0].status.ok());
  EXPECT_EQ(Fnv1a(dest.data(), length), Fnv1a(want, length));
}

TEST(FaultInjectingIoEngine, SlowReadsRespectWaitTimeouts) {
  FaultInjectionOptions faults;
  faults.delay_probability = 1.0;
  faults.delay = absl::Milliseconds(500);
  Fixture f = OverMem(faults);
  AlignedBuffer dest(8192);
  const absl::Time start = absl::Now();
  ReadRequest q{f.fd, 0, 8192, dest.data(), 0};
  ASSERT_TRUE(f.engine->Submit({&q, 1}).ok());
  std::vector<ReadCompletion> done;
  absl::StatusOr<int> n = f.engine->Wait(1, absl::Milliseconds(20), &done);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(400));
  n = f.engine->Wait(1, absl::Seconds(10), &done);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 1);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(f.engine->fault_stats().delays, 1u);
}

// Which tags of 200 one-chunk reads fail under error_probability 0.2, with this seed.
std::set<uint64_t> FailedTags(uint64_t seed) {
  FaultInjectionOptions faults;
  faults.seed = seed;
  faults.error_probability = 0.2;
  faults.bit_flip_probability = 0.1;
  IoEngineOptions options;
  options.io_inflight_max = 16;
  Fixture f = OverMem(faults, options);
  AlignedBuffer dest(200 * 8192);
  std::vector<ReadRequest> batch;
  for (int i = 0; i < 200; ++i) {
    batch.push_back({f.fd, static_cast<uint64_t>(i) * 8192, 8192, dest.data() + i * 8192, static_cast<uint64_t>(i)});
  }
  std::set<uint64_t> failed;
  for (const ReadCompletion& c : ReadAll(*f.engine, batch)) {
    if (!c.status.ok()) {
      EXPECT_TRUE(absl::IsDataLoss(c.status)) << c.status;
      failed.insert(c.tag);
    } else if (std::memcmp(dest.data() + c.tag * 8192, f.contents.data() + c.tag * 8192, 8192)) {
      failed.insert(1000 + c.tag);  // flipped
    }
  }
  return failed;
}

TEST(FaultInjectingIoEngine, DeterministicForASeed) {
  const std::set<uint64_t> a = FailedTags(11), b = FailedTags(11), c = FailedTags(12);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_GT(a.size(), 20u);
  EXPECT_LT(a.size(), 100u);
}

// Faults over a real file and engine (auto: io_uring where available, else pread).
TEST(FaultInjectingIoEngine, OverARealEngine) {
  const std::string dir = DirectIoDir().empty() ? AnyTempDir() : DirectIoDir();
  const std::string contents = RandomBytes(kFileBytes, 5);
  TempFile file(dir, contents);
  ASSERT_TRUE(file.ok());
  absl::StatusOr<ReadOnlyFile> open = ReadOnlyFile::Open(file.path(), DirectIo::kPrefer);
  ASSERT_TRUE(open.ok()) << open.status();
  IoEngineOptions options;
  options.chunk_bytes = 64 << 10;
  absl::StatusOr<CreatedIoEngine> inner = CreateIoEngine(IoEngineKind::kAuto, options);
  ASSERT_TRUE(inner.ok()) << inner.status();
  FaultInjectionOptions faults;
  faults.short_read_probability = 0.3;
  faults.delay_probability = 0.05;
  faults.delay = absl::Milliseconds(5);
  auto e = FaultInjectingIoEngine::Create(std::move(inner->engine), faults);
  ASSERT_TRUE(e.ok());
  std::printf("%s over %s, %s\n", (*e)->name().c_str(), dir.c_str(), open->direct() ? "O_DIRECT" : "buffered");
  RandomReadSpec spec;
  spec.reads = 200;
  spec.align = 4096;
  CheckRandomReads(**e, open->fd(), contents, spec);
  EXPECT_GT((*e)->stats().short_reads, 0u);
  EXPECT_GT((*e)->fault_stats().delays, 0u);

  // Then an EIO on one chunk.
  (*e)->ClearFaults();
  (*e)->AddRule({.kind = FaultKind::kError, .fd = open->fd(), .offset_begin = 3 << 20, .offset_end = (3 << 20) + 4096});
  AlignedBuffer dest(1 << 20);
  std::vector<ReadCompletion> done = ReadAll(**e, {{open->fd(), (3 << 20) - (64 << 10), 256 << 10, dest.data(), 0}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(absl::IsDataLoss(done[0].status)) << done[0].status;
  EXPECT_THAT(done[0].status.message(), HasSubstr(absl::StrCat("file offset ", 3 << 20)));
}

}  // namespace
}  // namespace mer
