// The GGUF "gpt2" byte-level BPE tokenizer, as llama.cpp runs it for tokenizer.ggml.pre = "qwen2"
// (Qwen2/Qwen3 and their MoE models), so that mer's token ids equal llama.cpp's on the same GGUF file.
//
// Encoding, as llama_tokenize(vocab, text, add_special, parse_special):
//  1. Special-token partition (llama.cpp's tokenizer_st_partition): the special tokens (types CONTROL,
//     USER_DEFINED, UNKNOWN), longest text first, each split out of the remaining raw text wherever it
//     occurs, left to right. With parse_special = false, CONTROL and UNKNOWN tokens are left as text but
//     USER_DEFINED ones are still split out (as llama.cpp and Hugging Face do).
//  2. Each remaining raw fragment is decoded leniently as UTF-8 (each invalid byte becomes U+FFFD, see
//     unicode::DecodeOne) and split by the qwen2 pre-tokenizer (pretokenizer.h).
//  3. Each piece, as UTF-8 bytes, starts as one byte token per byte (GPT-2 bytes_to_unicode names), and
//     merges are applied lowest rank first, leftmost first among equal ranks (llm_tokenizer_bpe).
//  4. Each final symbol is a vocabulary token; its id is emitted.
//
// Decoding, as llama_detokenize(..., remove_special = false, unparse_special = render_special) with
// qwen2's clean_spaces = false: the concatenation of the tokens' pieces (TokenPiece).
//
// A Tokenizer is immutable and cheap to copy (shared state); all methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mer {

namespace tokenizer_internal {
struct TokenizerData;
}  // namespace tokenizer_internal

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The tokenizer part of a GGUF file's metadata.
struct TokenizerVocab {
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens; id = index
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (TokenType values); same length, or
                                     // empty when the file has none (then every token is NORMAL)
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right"; rank = index
  std::string pre = "qwen2";         // tokenizer.ggml.pre
  int32_t bos_id = -1;               // tokenizer.ggml.bos_token_id; -1: none
  int32_t eos_id = -1;               // tokenizer.ggml.eos_token_id; -1: none
  bool add_bos = false;              // tokenizer.ggml.add_bos_token (qwen2: false)
  bool add_eos = false;              // tokenizer.ggml.add_eos_token (qwen2: false)
  std::string chat_template;         // tokenizer.chat_template (Jinja); empty when the file has none
};

class Tokenizer {
 public:
  // Validates `vocab` and builds the lookup tables. InvalidArgument when:
  //  - token_types is neither empty nor as long as tokens, or there are more than INT32_MAX tokens;
  //  - `pre` is not a pre-tokenizer mer implements ("qwen2", and "deepseek-r1-qwen" and "kormo", which
  //    llama.cpp treats as qwen2);
  //  - a byte has no token (the error names the byte): every byte must be encodable;
  //  - bos_id or eos_id is outside [-1, vocab size), or add_bos / add_eos asks for a missing token.
  // Tolerated: duplicate token texts (looking up a text gives its last id, as llama.cpp's text->id map
  // would; note that llama.cpp's loader itself asserts that texts are unique); empty tokens (renamed
  // "[EMPTY_<id>]", as llama.cpp does); merges without a space (skipped); duplicate merges (the first
  // rank wins, as in llama.cpp).
  // Merges whose left part, right part or result is not a token are skipped (llama.cpp would still
  // apply them and then fall back to bytes: only reachable with an inconsistent vocabulary, never with
  // one converted from Hugging Face). As llama.cpp does, tokens whose text marks them as end-of-turn or
  // fill-in-the-middle markers ("<|im_end|>", "<|endoftext|>", "<|fim_prefix|>", ...) are treated as
  // CONTROL whatever their stored type.
  static absl::StatusOr<Tokenizer> Create(TokenizerVocab vocab);

  // Token ids of `text` (any bytes). add_special: prepend bos / append eos where the vocabulary's
  // add_bos / add_eos ask for it. Linear in the text size apart from BPE's O(n log n) per piece, and
  // O(text size) per special token for the partition.
  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true, bool add_special = false) const;

  // The bytes of `ids` (out-of-range ids contribute nothing). render_special: include the text of
  // CONTROL and UNKNOWN tokens, which are otherwise dropped. Not necessarily valid UTF-8: a multi-byte
  // character may be split across tokens, and Decode of a prefix of the ids may end mid-character.
  std::string Decode(absl::Span<const int32_t> ids, bool render_special = false) const;

  // What Decode emits for one token, for streaming: Decode(ids) == concatenation of TokenPiece(id).
  // NORMAL tokens: their text mapped back through bytes_to_unicode; USER_DEFINED: their text as is;
  // CONTROL and UNKNOWN: their text only when render_special; UNUSED, BYTE and UNDEFINED (e.g. the
  // "[PAD<n>]" padding) and out-of-range ids: nothing. The view lives as long as any copy of *this.
  std::string_view TokenPiece(int32_t id, bool render_special = false) const;

  // The raw bytes one token stands for: TokenPiece(id, /*render_special=*/true).
  std::string TokenBytes(int32_t id) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1: none
  int32_t eos_id() const;  // -1: none
  bool add_bos() const;
  bool add_eos() const;

  // The token's vocabulary string (byte-level unicode for NORMAL tokens); empty for out-of-range ids.
  std::string_view TokenText(int32_t id) const;
  // The type the tokenizer uses (after the text-based CONTROL override); kUndefined when out of range.
  TokenType GetTokenType(int32_t id) const;
  // The id whose vocabulary string is `text` (the last one for duplicates), or -1.
  int32_t TokenId(std::string_view text) const;
  // Whether generation should stop at `id`, as llama.cpp's llama_vocab_is_eog: eos, and tokens whose
  // text is an end-of-turn marker ("<|im_end|>", "<|endoftext|>", ...) or a FIM pad/repo/file-sep marker.
  bool IsEndOfGeneration(int32_t id) const;
  // Every id for which IsEndOfGeneration is true, ascending: where generation stops by default.
  std::vector<int32_t> EndOfGenerationIds() const;

  int32_t num_merges() const;          // merges in use
  int32_t num_skipped_merges() const;  // merges dropped by Create (see there)

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_internal::TokenizerData> data) : data_(std::move(data)) {}
  std::shared_ptr<const tokenizer_internal::TokenizerData> data_;  // never null
};

// A deterministic synthetic vocabulary for synthetic test models (`mer synth`), shaped like a Qwen one:
//  ids 0..255: the byte tokens (id = byte value; NORMAL);
//  then up to max_merges merges learned from an embedded English/code/multilingual corpus by a simple
//    BPE trainer (the corpus is pre-tokenized with the qwen2 splitter; the most frequent adjacent pair
//    is merged, ties broken by the lexicographically smallest (left, right) vocabulary strings; pairs
//    seen fewer than twice are not merged), one NORMAL token per new merge result;
//  then "<|endoftext|>" (bos and eos), "<|im_start|>", "<|im_end|>" as CONTROL;
//  then "[PAD<id>]" tokens of type UNUSED up to vocab_size, as the HF->GGUF conversion pads Qwen.
// Fewer merges than max_merges when the corpus runs out of pairs or the vocabulary of room.
// pre = "qwen2", add_bos = false. Requires vocab_size >= 259 and max_merges >= 0.
TokenizerVocab MakeSyntheticVocab(int32_t vocab_size, int32_t max_merges);

// The text MakeSyntheticVocab learns its merges from (a few KB, UTF-8, with CRLF line endings in places).
std::string_view SyntheticVocabCorpus();

}  // namespace mer
