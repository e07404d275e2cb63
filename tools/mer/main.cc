// `mer`: the command line of the mer inference system.
#include <cstdio>
#include <cstring>
#include <string>

#include "mer/version.h"
#include "tools/mer/commands.h"

namespace {

constexpr char kUsage[] = R"(usage: mer <command> [flags]

commands:
  synth      write a synthetic qwen3moe GGUF model with deterministic random weights
  info       print a GGUF model's geometry, tensor types and sizes
  generate   generate text (or token ids) from a prompt
  score      teacher-forced logits of a continuation (for comparisons)
  tokenize   print the token ids of a text
  bench      measure prompt and decode speed (greedy, 31 prompt + 128 generated tokens)
  trace      record routing traces; replay them against cache policies, or run them on a backend
  pack       write a model's expert store (dense.gguf, experts.bin, manifest), or verify one
  up         start mer-residency, mer-compute and mer-gateway on a model; Ctrl-C stops them
  client     call a running mer-gateway: generate, health, model info
  loadgen    drive N concurrent Generate streams; throughput, TTFT and inter-token latency

Run `mer <command> --help` for the flags of a command; `mer --version` prints the version.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0 || std::strcmp(argv[1], "version") == 0) {
    std::printf("mer %s\n", MER_VERSION_STRING);
    return 0;
  }
  const std::string command = argv[1];
  const mer::cli::Args args(argv + 2, argv + argc);
  if (command == "synth") return mer::cli::RunSynth(args);
  if (command == "info") return mer::cli::RunInfo(args);
  if (command == "generate") return mer::cli::RunGenerate(args);
  if (command == "score") return mer::cli::RunScore(args);
  if (command == "tokenize") return mer::cli::RunTokenize(args);
  if (command == "bench") return mer::cli::RunBench(args);
  if (command == "trace") return mer::cli::RunTrace(args);
  if (command == "pack") return mer::cli::RunPack(args);
  if (command == "up") return mer::cli::RunUp(args);
  if (command == "client") return mer::cli::RunClient(args);
  if (command == "loadgen") return mer::cli::RunLoadgen(args);
  std::fprintf(stderr, "mer: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
