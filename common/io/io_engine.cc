#include "common/io/io_engine.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/pread_io_engine.h"
#include "common/io/uring_io_engine.h"

namespace mer {

absl::string_view IoEngineKindName(IoEngineKind kind) {
  switch (kind) {
    case IoEngineKind::kAuto:
      return "auto";
    case IoEngineKind::kUring:
      return "uring";
    case IoEngineKind::kPread:
      return "pread";
  }
  return "?";
}

absl::StatusOr<IoEngineKind> ParseIoEngineKind(absl::string_view name) {
  for (IoEngineKind kind : {IoEngineKind::kAuto, IoEngineKind::kUring, IoEngineKind::kPread}) {
    if (name == IoEngineKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown I/O engine \"", name, "\" (auto, uring or pread)"));
}

absl::Status ValidateIoEngineOptions(const IoEngineOptions& options) {
  if (options.io_inflight_max < 1 || options.io_inflight_max > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("io_inflight_max ", options.io_inflight_max, " is not in 1..4096"));
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes % 4096 != 0 || options.chunk_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes ", options.chunk_bytes, " is not a multiple of 4096 in 4 KiB .. 1 GiB"));
  }
  if (options.pread_threads < 0 || options.pread_threads > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("pread_threads ", options.pread_threads, " is not in 0..4096"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CreatedIoEngine> CreateIoEngine(IoEngineKind kind, const IoEngineOptions& options) {
  if (absl::Status s = ValidateIoEngineOptions(options); !s.ok()) return s;
  CreatedIoEngine created;
  if (kind == IoEngineKind::kUring || kind == IoEngineKind::kAuto) {
    absl::StatusOr<std::unique_ptr<UringIoEngine>> uring = UringIoEngine::Create(options);
    if (uring.ok()) {
      created.engine = std::move(uring).value();
      created.kind = IoEngineKind::kUring;
      return created;
    }
    if (kind == IoEngineKind::kUring) return uring.status();
    created.fallback_reason = uring.status().ToString();
  }
  absl::StatusOr<std::unique_ptr<PreadIoEngine>> pread = PreadIoEngine::Create(options);
  if (!pread.ok()) return pread.status();
  created.engine = std::move(pread).value();
  created.kind = IoEngineKind::kPread;
  return created;
}

std::string ErrnoName(int error_number) {
  const char* name = strerrorname_np(error_number);
  const char* text = strerrordesc_np(error_number);
  if (name == nullptr) return absl::StrCat("errno ", error_number);
  return absl::StrCat(name, " (", text != nullptr ? text : "", ")");
}

}  // namespace mer
