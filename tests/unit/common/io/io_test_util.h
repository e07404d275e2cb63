// Helpers for the IoEngine tests: files with known random contents in a disk-backed directory
// (where O_DIRECT works, if there is one), and a checker that drives an engine with many random
// reads in flight and compares every byte.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/io/io_engine.h"
#include "common/io/io_file.h"
#include "gtest/gtest.h"

namespace mer::testing_io {

inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&s[i], &v, std::min<size_t>(8, n - i));
  }
  return s;
}

inline uint64_t Fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// A file with the given contents, removed on destruction.
class TempFile {
 public:
  TempFile(const std::string& dir, const std::string& contents) : contents_(contents) {
    path_ = dir + "/mer_io_test_XXXXXX";
    const int fd = mkstemp(path_.data());
    if (fd < 0) {
      path_.clear();
      return;
    }
    size_t done = 0;
    while (done < contents.size()) {
      const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
      if (n <= 0) break;
      done += n;
    }
    fsync(fd);
    close(fd);
    ok_ = done == contents.size();
  }
  ~TempFile() {
    if (!path_.empty()) unlink(path_.c_str());
  }
  bool ok() const { return ok_; }
  const std::string& path() const { return path_; }
  const std::string& contents() const { return contents_; }

 private:
  std::string path_;
  std::string contents_;
  bool ok_ = false;
};

// A directory on a file system where O_DIRECT reads work ($TEST_TMPDIR, /tmp, /var/tmp, the
// working directory: ctest runs tests in the build tree, which is on disk); "" if none.
inline std::string DirectIoDir() {
  static const std::string* dir = [] {
    std::vector<std::string> candidates;
    if (const char* t = std::getenv("TEST_TMPDIR")) candidates.push_back(t);
    candidates.push_back("/tmp");
    candidates.push_back("/var/tmp");
    candidates.push_back(".");
    for (const std::string& c : candidates) {
      TempFile probe(c, std::string(2 * kDirectIoAlignment, 'x'));
      if (!probe.ok()) continue;
      if (ReadOnlyFile::Open(probe.path(), DirectIo::kRequire).ok()) return new std::string(c);
    }
    return new std::string();
  }();
  return *dir;
}

// Any writable directory, for buffered files.
inline std::string AnyTempDir() {
  const std::string d = DirectIoDir();
  if (!d.empty()) return d;
  if (const char* t = std::getenv("TEST_TMPDIR")) return t;
  return "/tmp";
}

struct RandomReadSpec {
  int reads = 300;
  int max_outstanding = 64;  // requests in flight at most
  uint64_t max_length = 0;   // 0: 6 chunks and a bit
  uint64_t align = 1;        // offsets and lengths (4096 for O_DIRECT)
  uint64_t readable = 0;     // reads stay below this offset; 0: the file's size
  bool register_buffers = true;
  uint64_t seed = 7;
};

// Drives `engine` with random reads of `contents` (the file `fd`) with up to max_outstanding
// requests in flight and checks every completion: status OK, every byte, and the guard bytes
// after the destination untouched. Half the destinations lie in a registered arena, half not.
inline void CheckRandomReads(IoEngine& engine, int fd, const std::string& contents, const RandomReadSpec& spec) {
  const uint64_t chunk = engine.options().chunk_bytes;
  const uint64_t max_len = spec.max_length ? spec.max_length : 6 * chunk + 3 * kDirectIoAlignment;
  const uint64_t readable = spec.readable ? spec.readable : contents.size();
  ASSERT_GE(readable, max_len);
  const uint64_t slot_bytes =
      (max_len + kDirectIoAlignment) / kDirectIoAlignment * kDirectIoAlignment + kDirectIoAlignment;  // + guard
  const int slots = spec.max_outstanding;
  AlignedBuffer registered(slot_bytes * slots), plain(slot_bytes * slots);
  if (spec.register_buffers) {
    IoBuffer b{registered.data(), registered.size()};
    absl::Status s = engine.RegisterBuffers({&b, 1});
    ASSERT_TRUE(s.ok()) << s;
  }
  std::mt19937_64 rng(spec.seed);
  auto pick = [&](uint64_t lo, uint64_t hi) {  // [lo, hi], rounded down to align, >= align
    uint64_t v = std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
    v -= v % spec.align;
    return std::max(v, spec.align);
  };
  struct Slot {
    bool busy = false;
    uint64_t offset = 0, length = 0;
    uint8_t* dest = nullptr;
  };
  std::vector<Slot> slot(slots);
  std::vector<int> free_slots;
  for (int i = slots - 1; i >= 0; --i) free_slots.push_back(i);
  int submitted = 0, completed = 0;
  std::vector<ReadRequest> batch;
  std::vector<ReadCompletion> done;
  while (completed < spec.reads) {
    batch.clear();
    const int want = std::uniform_int_distribution<int>(1, 12)(rng);
    while (!free_slots.empty() && submitted < spec.reads && static_cast<int>(batch.size()) < want) {
      const int s = free_slots.back();
      free_slots.pop_back();
      uint64_t length;
      switch (rng() % 4) {
        case 0:
          length = pick(1, 3 * kDirectIoAlignment);
          break;  // small
        case 1:
          length = chunk * (1 + rng() % 6);
          break;  // whole chunks
        default:
          length = pick(1, max_len);
          break;  // anything, often split
      }
      length = std::min(length, max_len);
      uint64_t offset = std::uniform_int_distribution<uint64_t>(0, readable - length)(rng);
      offset -= offset % spec.align;
      uint8_t* base = (s % 2 == 0 ? registered.data() : plain.data()) + s * slot_bytes;
      std::memset(base, 0xAB, slot_bytes);
      slot[s] = {true, offset, length, base};
      batch.push_back({fd, offset, length, base, static_cast<uint64_t>(s)});
      ++submitted;
    }
    if (!batch.empty()) {
      absl::Status st = engine.Submit(batch);
      ASSERT_TRUE(st.ok()) << st;
    }
    ASSERT_LE(engine.inflight(), engine.options().io_inflight_max);
    done.clear();
    absl::StatusOr<int> n = engine.Wait(1, absl::Seconds(20), &done);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_GT(*n, 0) << "no completion within 20 s; " << engine.outstanding() << " outstanding";
    ASSERT_EQ(static_cast<size_t>(*n), done.size());
    for (const ReadCompletion& c : done) {
      ASSERT_LT(c.tag, slot.size());
      Slot& s = slot[c.tag];
      ASSERT_TRUE(s.busy);
      ASSERT_TRUE(c.status.ok()) << c.status << " (offset " << s.offset << ", length " << s.length << ")";
      ASSERT_EQ(c.bytes, s.length);
      ASSERT_EQ(0, std::memcmp(s.dest, contents.data() + s.offset, s.length))
          << engine.name() << ": data differ at offset " << s.offset << " length " << s.length;
      for (uint64_t i = s.length; i < slot_bytes; ++i) {
        ASSERT_EQ(s.dest[i], 0xAB) << "written past the destination, offset " << s.offset << " length " << s.length;
      }
      s.busy = false;
      free_slots.push_back(static_cast<int>(c.tag));
      ++completed;
    }
  }
  EXPECT_EQ(engine.outstanding(), 0);
  EXPECT_EQ(engine.inflight(), 0);
  if (spec.register_buffers) {
    EXPECT_TRUE(engine.RegisterBuffers({}).ok());
  }
}

}  // namespace mer::testing_io
