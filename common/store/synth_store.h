// `mer synth --store-out`: a synthetic model (common/model/synth_model.h) written straight into
// an expert store, for geometries whose GGUF and store do not fit on one disk together (the
// Qwen3-30B-A3B geometry in Q8_0 is 31 GB each; a 64 GiB disk). No GGUF is
// written: every blob is generated from the model's row functions, in parallel, and written as
// `mer pack` writes blobs, and dense.gguf streams tensor by tensor.
//
// The result is the store `mer pack` makes of the file `mer synth --out` writes with the same
// options, byte for byte in experts.bin and dense.gguf. The manifest's source identity (size and
// header checksum) is that file's, computed without writing it; its mtime is 0 and its name says
// how it was made.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model/synth_model.h"
#include "common/store/packer.h"

namespace mer {

// Writes the store of the model `synth` describes into `dir` (created if missing). Uses
// pack.threads (0: all cores), pack.direct_io, pack.overwrite (AlreadyExists without it when `dir`
// holds a store) and pack.progress; synth.threads is not used. InvalidArgument for a geometry
// WriteSynthModel refuses.
absl::StatusOr<PackStats> WriteSynthStore(const SynthOptions& synth, const std::string& dir,
                                          const PackOptions& pack = {});

}  // namespace mer
