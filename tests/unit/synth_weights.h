// A synthetic model loaded for a test the way the engines load a GGUF: written to a temporary
// file, mapped, and the file removed at once (the mapping keeps the data).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/model/model_weights.h"
#include "common/model/synth_model.h"

namespace mer::testing_support {

struct SynthWeights {
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<ModelWeights> weights;
};

// The model `o` describes. `name` tells apart the files of one test process, the pid those of
// processes running at once.
inline absl::StatusOr<SynthWeights> LoadSynthWeights(const SynthOptions& o, const std::string& name) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("mer_" + name + "_" + std::to_string(getpid()) + ".gguf");
  if (const absl::Status s = WriteSynthModel(o, path.string()); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path.string());
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
  if (!file.ok()) return file.status();
  SynthWeights m;
  m.file = std::move(*file);
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = ModelWeights::Load(m.file);
  if (!weights.ok()) return weights.status();
  m.weights = std::move(*weights);
  return m;
}

}  // namespace mer::testing_support
