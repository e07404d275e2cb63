// Expert-store read benchmark: N random 4096-aligned blob reads (default 5 MiB, one Qwen3-30B-A3B
// Q8_0 expert) from a file with O_DIRECT, through the residency I/O engines at several queue
// depths, against a plain loop of blocking O_DIRECT pread. Prints GB/s and p50/p99 latency.
// Not a test; see --help.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/io/io_engine.h"
#include "common/io/io_file.h"
#include "common/io/pread_io_engine.h"
#include "common/io/uring_io_engine.h"

namespace mer {
namespace {

constexpr char kUsage[] = R"(usage: store_read_bench --file PATH [options]

Reads --reads random blobs of --blob-mib MiB at 4096-aligned offsets of PATH with O_DIRECT (the
page cache is bypassed; nothing is dropped from it), through
  uring   UringIoEngine (registered buffers and file, reads split into --chunk-kib chunks)
  pread   PreadIoEngine (one thread per read in flight)
at each queue depth of --depths (chunk reads in flight at the device; enough blobs are kept
submitted to fill it), and as a baseline
  loop    a plain loop of blocking O_DIRECT pread of one whole blob at a time
and prints GB/s (10^9 bytes/s) and per-blob latency (submit to completion) p50/p99/max.

options:
  --file PATH        the file to read (on the disk to measure)
  --create-gib G     first create PATH with G GiB of data if it is missing or smaller
  --blob-mib M       blob size in MiB (default 5; may be fractional, rounded up to 4 KiB)
  --reads N          blobs read per configuration (default 200)
  --depths LIST      queue depths (default 1,4,16,64)
  --chunk-kib K      chunk size of the engines (default 1024)
  --engines LIST     any of uring,pread,loop (default all)
  --no-fixed         do not register buffers with io_uring (plain IORING_OP_READ)
  --allow-buffered   run even if O_DIRECT is impossible (then it measures the page cache)
  --seed S           offsets' seed (default 1)

Another baseline, by hand (sequential, one 5 MiB O_DIRECT read at a time):
  dd if=PATH of=/dev/null bs=5M iflag=direct count=200
)";

struct Args {
  std::string file;
  double create_gib = 0;
  double blob_mib = 5;
  int reads = 200;
  std::vector<int> depths = {1, 4, 16, 64};
  uint64_t chunk_kib = 1024;
  std::vector<std::string> engines = {"uring", "pread", "loop"};
  bool fixed = true;
  bool allow_buffered = false;
  uint64_t seed = 1;
};

[[noreturn]] void Usage(const char* problem) {
  if (problem != nullptr) std::fprintf(stderr, "store_read_bench: %s\n\n", problem);
  std::fputs(kUsage, problem != nullptr ? stderr : stdout);
  std::exit(problem != nullptr ? 2 : 0);
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage((arg + " needs a value").c_str());
      return argv[++i];
    };
    bool ok = true;
    if (arg == "--help" || arg == "-h") {
      Usage(nullptr);
    } else if (arg == "--file") {
      a.file = value();
    } else if (arg == "--create-gib") {
      ok = absl::SimpleAtod(value(), &a.create_gib);
    } else if (arg == "--blob-mib") {
      ok = absl::SimpleAtod(value(), &a.blob_mib) && a.blob_mib > 0;
    } else if (arg == "--reads") {
      ok = absl::SimpleAtoi(value(), &a.reads) && a.reads > 0;
    } else if (arg == "--depths") {
      a.depths.clear();
      for (absl::string_view d : absl::StrSplit(value(), ',')) {
        int v = 0;
        ok = ok && absl::SimpleAtoi(d, &v) && v >= 1 && v <= 4096;
        a.depths.push_back(v);
      }
    } else if (arg == "--chunk-kib") {
      ok = absl::SimpleAtoi(value(), &a.chunk_kib) && a.chunk_kib > 0 && a.chunk_kib % 4 == 0;
    } else if (arg == "--engines") {
      a.engines = absl::StrSplit(value(), ',');
      for (const std::string& e : a.engines) ok = ok && (e == "uring" || e == "pread" || e == "loop");
    } else if (arg == "--no-fixed") {
      a.fixed = false;
    } else if (arg == "--allow-buffered") {
      a.allow_buffered = true;
    } else if (arg == "--seed") {
      ok = absl::SimpleAtoi(value(), &a.seed);
    } else {
      Usage(("unknown argument " + arg).c_str());
    }
    if (!ok) Usage(("bad value for " + arg).c_str());
  }
  if (a.file.empty()) Usage("--file is required");
  return a;
}

// Each 4 KiB block of a file the benchmark creates starts with its offset ^ kMark, so reads can
// be checked cheaply.
constexpr uint64_t kMark = 0x4d45524245544348ull;

bool CreateFile(const std::string& path, uint64_t bytes) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= bytes) {
    std::printf("using existing %s (%.2f GiB)\n", path.c_str(), st.st_size / double(1ull << 30));
    return true;
  }
  bool direct = true;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) {
    direct = false;
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd < 0) {
    std::perror(("create " + path).c_str());
    return false;
  }
  constexpr uint64_t kBlock = 8 << 20;
  AlignedBuffer buf(kBlock);
  std::mt19937_64 rng(99);
  for (uint64_t i = 0; i < kBlock; i += 8) {
    const uint64_t v = rng();
    std::memcpy(buf.data() + i, &v, 8);
  }
  const absl::Time start = absl::Now();
  for (uint64_t off = 0; off < bytes; off += kBlock) {
    const uint64_t n = std::min(kBlock, bytes - off);
    for (uint64_t b = 0; b < n; b += 4096) {
      const uint64_t tag = (off + b) ^ kMark;
      std::memcpy(buf.data() + b, &tag, 8);
    }
    const uint64_t write_len = (n + 4095) / 4096 * 4096;
    if (pwrite(fd, buf.data(), write_len, static_cast<off_t>(off)) != static_cast<ssize_t>(write_len)) {
      std::perror("write");
      close(fd);
      return false;
    }
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fsync(fd) != 0) std::perror("fsync");
  close(fd);
  const double s = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("created %s: %.2f GiB in %.1f s (%.2f GB/s, %s writes)\n", path.c_str(), bytes / double(1ull << 30), s,
              bytes / s / 1e9, direct ? "O_DIRECT" : "buffered");
  return true;
}

struct Result {
  std::string engine;
  int depth = 0;
  int blobs_in_flight = 0;
  std::string fixed;
  double gbps = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  int errors = 0;
  int bad_data = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

int CheckBlob(const uint8_t* p, uint64_t offset, uint64_t blob, bool verify) {
  if (!verify) return 0;
  for (uint64_t b : {uint64_t{0}, blob - 4096}) {
    uint64_t tag;
    std::memcpy(&tag, p + b, 8);
    if (tag != ((offset + b) ^ kMark)) return 1;
  }
  return 0;
}

void Finish(Result& r, const std::vector<double>& lat_ms, uint64_t bytes, double seconds) {
  r.gbps = bytes / seconds / 1e9;
  r.p50_ms = Percentile(lat_ms, 0.50);
  r.p99_ms = Percentile(lat_ms, 0.99);
  r.max_ms = Percentile(lat_ms, 1.0);
}

Result RunLoop(int fd, const std::vector<uint64_t>& offsets, uint64_t blob, bool verify) {
  Result r;
  r.engine = "loop";
  r.depth = 1;
  r.blobs_in_flight = 1;
  r.fixed = "-";
  AlignedBuffer buf(blob);
  std::vector<double> lat;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t off : offsets) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t done = 0;
    while (done < blob) {
      const ssize_t n = pread(fd, buf.data() + done, blob - done, static_cast<off_t>(off + done));
      if (n <= 0) {
        ++r.errors;
        break;
      }
      done += n;
    }
    lat.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    r.bad_data += CheckBlob(buf.data(), off, blob, verify);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Finish(r, lat, blob * offsets.size(), s);
  return r;
}

bool RunEngine(const std::string& kind, int depth, const Args& args, int fd, const std::vector<uint64_t>& offsets,
               uint64_t blob, bool verify, Result* out) {
  IoEngineOptions options;
  options.io_inflight_max = depth;
  options.chunk_bytes = args.chunk_kib << 10;
  options.pread_threads = depth;
  std::unique_ptr<IoEngine> engine;
  if (kind == "uring") {
    auto e = UringIoEngine::Create(options);
    if (!e.ok()) {
      std::printf("uring qd %d: %s\n", depth, e.status().ToString().c_str());
      return false;
    }
    engine = std::move(e).value();
  } else {
    auto e = PreadIoEngine::Create(options);
    if (!e.ok()) {
      std::printf("pread qd %d: %s\n", depth, e.status().ToString().c_str());
      return false;
    }
    engine = std::move(e).value();
  }
  const uint64_t chunks_per_blob = (blob + options.chunk_bytes - 1) / options.chunk_bytes;
  const int blobs =
      static_cast<int>(std::min<uint64_t>(offsets.size(), (depth + chunks_per_blob - 1) / chunks_per_blob));
  Result& r = *out;
  r = Result();
  r.engine = kind;
  r.depth = depth;
  r.blobs_in_flight = blobs;
  AlignedBuffer arena(blob * blobs);
  r.fixed = "no";
  if (kind == "uring" && args.fixed) {
    IoBuffer b{arena.data(), arena.size()};
    absl::Status s = engine->RegisterBuffers({&b, 1});
    if (s.ok()) {
      r.fixed = "yes";
    } else {
      std::printf("uring qd %d: no fixed buffers: %s\n", depth, s.ToString().c_str());
    }
  }
  (void)engine->RegisterFiles({&fd, 1});

  std::vector<std::chrono::steady_clock::time_point> submitted(blobs);
  std::vector<uint64_t> slot_offset(blobs);
  std::vector<double> lat;
  lat.reserve(offsets.size());
  size_t next = 0, completed = 0;
  std::vector<ReadRequest> batch;
  std::vector<ReadCompletion> done;
  auto request = [&](int slot) {
    slot_offset[slot] = offsets[next++];
    submitted[slot] = std::chrono::steady_clock::now();
    batch.push_back({fd, slot_offset[slot], blob, arena.data() + slot * blob, static_cast<uint64_t>(slot)});
  };
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < blobs; ++s) request(s);
  while (completed < offsets.size()) {
    if (!batch.empty()) {
      absl::Status s = engine->Submit(batch);
      if (!s.ok()) {
        std::printf("%s qd %d: Submit: %s\n", kind.c_str(), depth, s.ToString().c_str());
        return false;
      }
      batch.clear();
    }
    done.clear();
    absl::StatusOr<int> n = engine->Wait(1, absl::Seconds(60), &done);
    if (!n.ok() || *n == 0) {
      std::printf("%s qd %d: Wait: %s\n", kind.c_str(), depth,
                  n.ok() ? "no completion in 60 s" : n.status().ToString().c_str());
      return false;
    }
    const auto now = std::chrono::steady_clock::now();
    for (const ReadCompletion& c : done) {
      const int slot = static_cast<int>(c.tag);
      lat.push_back(std::chrono::duration<double, std::milli>(now - submitted[slot]).count());
      if (!c.status.ok()) {
        if (r.errors++ == 0) std::printf("  error: %s\n", c.status.ToString().c_str());
      } else {
        r.bad_data += CheckBlob(arena.data() + slot * blob, slot_offset[slot], blob, verify);
      }
      ++completed;
      if (next < offsets.size()) request(slot);
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Finish(r, lat, blob * offsets.size(), s);
  const IoEngineStats st = engine->stats();
  if (kind == "uring" && r.fixed == "yes" && st.fixed_buffer_chunks != st.chunks_issued) {
    r.fixed = "part";
  }
  return true;
}

int Main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  const uint64_t blob = (static_cast<uint64_t>(args.blob_mib * (1 << 20)) + 4095) / 4096 * 4096;
  if (args.create_gib > 0 && !CreateFile(args.file, static_cast<uint64_t>(args.create_gib * (1ull << 30)))) {
    return 1;
  }
  auto file = ReadOnlyFile::Open(args.file, args.allow_buffered ? DirectIo::kPrefer : DirectIo::kRequire);
  if (!file.ok()) {
    std::fprintf(stderr, "store_read_bench: %s\n", file.status().ToString().c_str());
    return 1;
  }
  if (file->size() < blob) {
    std::fprintf(stderr, "store_read_bench: %s is smaller than one blob\n", args.file.c_str());
    return 1;
  }
  std::mt19937_64 rng(args.seed);
  std::vector<uint64_t> offsets(args.reads);
  const uint64_t slots = (file->size() - blob) / 4096;
  for (uint64_t& o : offsets) o = std::uniform_int_distribution<uint64_t>(0, slots)(rng) * 4096;

  // Reads are checked when the file is one this benchmark wrote.
  bool verify = false;
  {
    AlignedBuffer probe(4096);
    uint64_t tag = 0;
    if (pread(file->fd(), probe.data(), 4096, 0) == 4096) std::memcpy(&tag, probe.data(), 8);
    verify = tag == kMark;
  }

  std::printf(
      "file %s: %.2f GiB, %s; %d random reads of %.2f MiB (4 KiB aligned), chunks of "
      "%" PRIu64 " KiB; data %s\n",
      args.file.c_str(), file->size() / double(1ull << 30), file->direct() ? "O_DIRECT" : "BUFFERED (page cache!)",
      args.reads, blob / double(1 << 20), args.chunk_kib,
      verify ? "verified" : "not verified (not a file this benchmark wrote)");
  std::printf("%-6s %5s %6s %6s %8s %9s %9s %9s %s\n", "engine", "qd", "blobs", "fixed", "GB/s", "p50 ms", "p99 ms",
              "max ms", "errors");
  auto print = [](const Result& r) {
    std::printf("%-6s %5d %6d %6s %8.3f %9.2f %9.2f %9.2f %d%s\n", r.engine.c_str(), r.depth, r.blobs_in_flight,
                r.fixed.c_str(), r.gbps, r.p50_ms, r.p99_ms, r.max_ms, r.errors, r.bad_data ? " BAD DATA" : "");
    std::fflush(stdout);
  };
  int failures = 0;
  for (const std::string& kind : args.engines) {
    if (kind == "loop") {
      Result r = RunLoop(file->fd(), offsets, blob, verify);
      print(r);
      failures += r.errors + r.bad_data;
      continue;
    }
    for (int depth : args.depths) {
      Result r;
      if (!RunEngine(kind, depth, args, file->fd(), offsets, blob, verify, &r)) {
        ++failures;
        continue;
      }
      print(r);
      failures += r.errors + r.bad_data;
    }
  }
  std::printf(
      "qd: chunk reads in flight; blobs: blobs kept submitted; latency: per blob, "
      "submit to completion.\nbaseline by hand: dd if=%s of=/dev/null bs=5M "
      "iflag=direct count=%d\n",
      args.file.c_str(), args.reads);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace mer

int main(int argc, char** argv) { return mer::Main(argc, argv); }
