// `mer generate`, `mer score` and `mer tokenize`: one sequence on the CPU engine.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/model/model_tokenizer.h"
#include "services/compute/generation.h"
#include "tools/mer/cli_util.h"

namespace mer::cli {
namespace {

constexpr char kGenerateHelp[] = R"(usage: mer generate (--model F.gguf | --store STORE_DIR --residency NAME)
                    (--prompt TEXT | --prompt-tokens 1,2,3) --max-tokens N
                    [--temperature T --top-k K --top-p P --seed S --repetition-penalty R]
                    [--threads N] [--print-token-ids] [--ignore-eos] [--ctx N] [--batch N]

Generates up to N tokens. Greedy unless --temperature > 0. --batch: the prompt chunk, tokens per
step (default 256 on cpu, 1024 on cuda). Prints the text as it is generated,
or with --print-token-ids the generated ids (not the prompt's) on one line. Speed goes to stderr.
Generation stops at the vocabulary's end-of-generation tokens (EOS, <|im_end|>, <|endoftext|>,
...) unless --ignore-eos; why it stopped goes to stderr ("finish: stop token ..." or "finish: length").
With --store and --residency the dense weights and the tokenizer come from STORE_DIR/dense.gguf
and the experts from the mer-residency instance NAME serving STORE_DIR; the residency counters
this process saw go to stderr at the end.
)";

constexpr char kScoreHelp[] = R"(usage: mer score --model F.gguf --prompt-tokens 1,2,3 --continuation-tokens 4,5,6
                 --logits-out FILE [--threads N]

Teacher forcing: writes little-endian float32 [len(continuation), n_vocab] to FILE, row i being
the logits that predict continuation[i] after the prompt and continuation[0..i).
)";

constexpr char kTokenizeHelp[] = R"(usage: mer tokenize --model F.gguf (--text TEXT | --text-file FILE) [--no-special]

Prints the token ids of the text on one line (special tokens are parsed unless --no-special;
no BOS is added).
)";

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status Generate(const Args& args) {
  ASSIGN_OR_RETURN(
      Flags f, Flags::Parse(args,
                            {"model", "store", "residency", "threads", "ctx", "batch", "backend", "vram-expert-budget",
                             "pin-experts", "vram-prefetch", "prompt", "prompt-tokens", "max-tokens", "temperature",
                             "top-k", "top-p", "seed", "repetition-penalty"},
                            {"print-token-ids", "ignore-eos"}));
  ASSIGN_OR_RETURN(LoadedModel m, LoadModel(f, 0));
  ASSIGN_OR_RETURN(const GenerationRequest req, GenerationRequestFromFlags(f, *m.tokenizer));

  const bool ids_only = f.Has("print-token-ids");
  const Tokenizer& tok = *m.tokenizer;
  GenerationStats stats;
  auto generated = mer::Generate(
      *m.engine, 0, req,
      [&](int32_t id) {
        if (ids_only) return;
        const std::string piece = tok.TokenBytes(id);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      },
      &stats);
  if (m.residency != nullptr) std::fprintf(stderr, "residency: %s\n", m.residency->FormatStats().c_str());
  if (!generated.ok()) return generated.status();
  const std::vector<int32_t>& out = *generated;
  if (ids_only) std::printf("%s", absl::StrJoin(out, " ").c_str());
  std::printf("\n");
  std::fflush(stdout);  // the text before the statistics on stderr
  if (!out.empty() && req.IsStop(out.back())) {
    std::fprintf(stderr, "finish: stop token %s (id %d)\n", std::string(tok.TokenText(out.back())).c_str(), out.back());
  } else {
    std::fprintf(stderr, "finish: length\n");
  }
  std::fprintf(stderr, "prompt %d tokens in %.3f s (%.1f tokens/s); generated %d tokens, %.1f tokens/s\n",
               stats.prompt_tokens, stats.prompt_seconds, stats.prompt_tokens / stats.prompt_seconds,
               stats.generated_tokens,
               stats.generated_tokens > 1 ? (stats.generated_tokens - 1) / stats.decode_seconds : 0.0);
  return absl::OkStatus();
}

absl::Status Score(const Args& args) {
  ASSIGN_OR_RETURN(Flags f,
                   Flags::Parse(args,
                                {"model", "threads", "ctx", "batch", "backend", "vram-expert-budget", "pin-experts",
                                 "vram-prefetch", "prompt-tokens", "continuation-tokens", "logits-out"},
                                {}));
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, ParseIdList(f.String("prompt-tokens"), "--prompt-tokens"));
  ASSIGN_OR_RETURN(std::vector<int32_t> cont, ParseIdList(f.String("continuation-tokens"), "--continuation-tokens"));
  ASSIGN_OR_RETURN(const std::string out_path, f.Required("logits-out"));
  ASSIGN_OR_RETURN(LoadedModel m, LoadModel(f, static_cast<int>(prompt.size() + cont.size())));
  const int64_t n_vocab = m.weights->config().n_vocab;
  std::vector<float> logits(cont.size() * n_vocab);
  RETURN_IF_ERROR(mer::Score(*m.engine, 0, prompt, cont, logits.data()));
  std::FILE* out = std::fopen(out_path.c_str(), "wb");
  if (out == nullptr) return absl::UnavailableError(absl::StrCat("cannot create ", out_path));
  const size_t written = std::fwrite(logits.data(), sizeof(float), logits.size(), out);
  if (std::fclose(out) != 0 || written != logits.size())
    return absl::UnavailableError(absl::StrCat("writing ", out_path, " failed"));
  return absl::OkStatus();
}

absl::Status Tokenize(const Args& args) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args, {"model", "text", "text-file"}, {"no-special"}));
  if (f.Has("text") == f.Has("text-file"))
    return absl::InvalidArgumentError("give exactly one of --text and --text-file");
  std::string text = f.String("text");
  if (f.Has("text-file")) {
    ASSIGN_OR_RETURN(text, ReadFile(f.String("text-file")));
  }
  ASSIGN_OR_RETURN(const std::string path, f.Required("model"));
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  ASSIGN_OR_RETURN(Tokenizer tokenizer, LoadTokenizer(*file));
  std::printf("%s\n", absl::StrJoin(tokenizer.Encode(text, !f.Has("no-special")), " ").c_str());
  return absl::OkStatus();
}

}  // namespace

int RunGenerate(const Args& args) {
  if (MaybeHelp(args, kGenerateHelp)) return 0;
  const absl::Status s = Generate(args);
  return s.ok() ? 0 : Fail("generate", s);
}

int RunScore(const Args& args) {
  if (MaybeHelp(args, kScoreHelp)) return 0;
  const absl::Status s = Score(args);
  return s.ok() ? 0 : Fail("score", s);
}

int RunTokenize(const Args& args) {
  if (MaybeHelp(args, kTokenizeHelp)) return 0;
  const absl::Status s = Tokenize(args);
  return s.ok() ? 0 : Fail("tokenize", s);
}

}  // namespace mer::cli
