// `mer pack`: write an expert store (docs/expert_store.md) from a qwen3moe GGUF, or verify one.
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/store/expert_store.h"
#include "common/store/packer.h"
#include "tools/mer/cli_util.h"

namespace mer::cli {
namespace {

constexpr char kHelp[] = R"(usage: mer pack --model FILE.gguf --out STORE_DIR [--verify] [--force] [--threads N]
                [--no-direct]
       mer pack --verify --out STORE_DIR

Writes the expert store of a qwen3moe model: STORE_DIR/experts.bin (one 4096-byte aligned blob
per layer and expert holding its gate, up and down matrices), STORE_DIR/dense.gguf (every other
tensor and all metadata) and STORE_DIR/manifest (layout and checksums). The model streams
through; it is never held in memory. --verify re-reads the store and checks every checksum
(without --model it only verifies). --force replaces a store already in STORE_DIR. --no-direct
writes experts.bin through the page cache instead of with O_DIRECT.
)";

absl::Status Verify(const std::string& dir, int threads) {
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertStore> store, ExpertStore::Open(dir));
  StoreVerifyOptions o;
  o.threads = threads;
  ASSIGN_OR_RETURN(const StoreVerifyStats v, store->VerifyAll(o));
  RETURN_IF_ERROR(store->LoadDenseWeights().status());
  std::printf("verified     %llu blobs and dense.gguf: %s in %.2f s (%.2f GB/s)%s\n",
              static_cast<unsigned long long>(v.blobs), Bytes(v.bytes).c_str(), v.seconds,
              v.bytes / 1e9 / std::max(v.seconds, 1e-9), store->direct_io() ? ", O_DIRECT" : "");
  return absl::OkStatus();
}

absl::Status Pack(const Args& args) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args, {"model", "out", "threads"}, {"verify", "force", "no-direct"}));
  ASSIGN_OR_RETURN(const std::string out, f.Required("out"));
  ASSIGN_OR_RETURN(const int64_t threads, f.Int("threads", 0));
  if (threads < 0 || threads > 1024) return absl::InvalidArgumentError("--threads must be in [0, 1024]");
  if (!f.Has("model")) {
    if (!f.Has("verify")) return absl::InvalidArgumentError("--model is required (or --verify alone)");
    return Verify(out, static_cast<int>(threads));
  }
  const std::string model = f.String("model");
  PackOptions o;
  o.threads = static_cast<int>(threads);
  o.overwrite = f.Has("force");
  o.direct_io = !f.Has("no-direct");
  std::error_code ec;
  const uint64_t model_bytes = std::filesystem::file_size(model, ec);  // the store is about as large
  ProgressLine progress("mer pack:", ec ? 0 : model_bytes);
  o.progress = [&](int done, int n_layer) { progress.Update(model_bytes * done / std::max(1, n_layer)); };
  absl::StatusOr<PackStats> packed = PackExpertStore(model, out, o);
  progress.Finish();
  ASSIGN_OR_RETURN(const PackStats s, std::move(packed));
  std::printf("packed       %s -> %s\n", model.c_str(), out.c_str());
  std::printf("experts.bin  %llu blobs x %s (%s of weights each) = %s%s\n",
              static_cast<unsigned long long>(s.blob_count), Bytes(s.blob_bytes).c_str(),
              Bytes(s.expert_payload_bytes / std::max<uint64_t>(s.blob_count, 1)).c_str(),
              Bytes(s.experts_bytes).c_str(), s.direct_io ? ", written with O_DIRECT" : "");
  std::printf("dense.gguf   %llu tensors, %s\n", static_cast<unsigned long long>(s.dense_tensors),
              Bytes(s.dense_bytes).c_str());
  std::printf("manifest     %llu bytes\n", static_cast<unsigned long long>(s.manifest_bytes));
  std::printf("time         %.2f s in all, %s in %.2f s: %.2f GB/s\n", s.seconds,
              Bytes(s.experts_bytes + s.dense_bytes).c_str(), s.seconds,
              (s.experts_bytes + s.dense_bytes) / 1e9 / std::max(s.seconds, 1e-9));
  std::printf("             experts.bin alone %.2f s: %.2f GB/s\n", s.experts_seconds,
              s.experts_bytes / 1e9 / std::max(s.experts_seconds, 1e-9));
  if (f.Has("verify")) RETURN_IF_ERROR(Verify(out, o.threads));
  return absl::OkStatus();
}

}  // namespace

int RunPack(const Args& args) {
  if (MaybeHelp(args, kHelp)) return 0;
  const absl::Status s = Pack(args);
  return s.ok() ? 0 : Fail("pack", s);
}

}  // namespace mer::cli
