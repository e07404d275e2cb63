#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/unicode.h"

namespace mer {
namespace {

// Token texts that llama.cpp (llama_vocab::impl::load) recognises by name whatever their stored type.
// Spelled with escapes: "\xEF\xBD\x9C" is DeepSeek's fullwidth bar U+FF5C, "\xE2\x96\x81" is U+2581.

// End-of-turn / end-of-generation markers: forced to CONTROL, and generation stops on them.
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81"
    "of\xE2\x96\x81"
    "sentence\xEF\xBD\x9C>",  // <｜end▁of▁sentence｜>
};

// Fill-in-the-middle pad / repo / file-separator markers: forced to CONTROL, and end generation.
constexpr std::string_view kFimStopTexts[] = {
    "<|fim_pad|>",   "<fim-pad>",  "<fim_pad>", "<PAD>",      "[PAD]",        "<|fim_repo|>",
    "<|repo_name|>", "<fim-repo>", "<REPO>",    "<reponame>", "<|file_sep|>",
};

// Fill-in-the-middle prefix / suffix / middle markers: forced to CONTROL only.
constexpr std::string_view kFimMarkerTexts[] = {
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<PRE>",
    "\xE2\x96\x81<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<\xEF\xBD\x9C"
    "fim\xE2\x96\x81"
    "begin\xEF\xBD\x9C>",  // <｜fim▁begin｜>
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<SUF>",
    "\xE2\x96\x81<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<\xEF\xBD\x9C"
    "fim\xE2\x96\x81"
    "hole\xEF\xBD\x9C>",  // <｜fim▁hole｜>
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<MID>",
    "\xE2\x96\x81<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<\xEF\xBD\x9C"
    "fim\xE2\x96\x81"
    "end\xEF\xBD\x9C>",  // <｜fim▁end｜>
};

// Pre-tokenizer names llama.cpp maps to LLAMA_VOCAB_PRE_TYPE_QWEN2 with clean_spaces = false.
constexpr std::string_view kQwen2PreNames[] = {"qwen2", "deepseek-r1-qwen", "kormo"};

constexpr uint64_t PairKey(int32_t left, int32_t right) {
  return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
}

struct Merge {
  int32_t rank;
  int32_t result;  // token id of left + right
};

TokenType TypeFromGguf(int32_t value) {
  if (value >= static_cast<int32_t>(TokenType::kNormal) && value <= static_cast<int32_t>(TokenType::kByte)) {
    return static_cast<TokenType>(value);
  }
  return TokenType::kUndefined;  // as llama.cpp: 0 and unknown values
}

bool IsSpecialType(TokenType type) {
  return type == TokenType::kControl || type == TokenType::kUserDefined || type == TokenType::kUnknown;
}

// llama.cpp's llama_decode_text: a NORMAL token's vocabulary string mapped back to bytes. A code point
// no byte maps to cannot come from a converted vocabulary; llama.cpp writes it as below, and so do we.
std::string DecodeNormalText(std::string_view text) {
  std::string bytes;
  size_t offset = 0;
  while (offset < text.size()) {
    const uint32_t cp = unicode::DecodeOne(text, &offset);
    const int byte = unicode::UnicodeToByte(cp);
    if (byte >= 0) {
      bytes.push_back(static_cast<char>(byte));
      continue;
    }
    std::string utf8;
    unicode::AppendUtf8(cp, &utf8);
    absl::StrAppend(&bytes, "[UNK_BYTE_0x");
    for (char c : utf8) absl::StrAppendFormat(&bytes, "%02x", static_cast<uint8_t>(c));
    // Debian's abseil has its own string_view type, not std::string_view.
    absl::StrAppend(&bytes, absl::string_view(text.data(), text.size()), "]");
  }
  return bytes;
}

}  // namespace

namespace tokenizer_internal {

struct TokenizerData {
  // Invariant: texts, types, piece offsets and hidden flags all have vocab_size entries (offsets one
  // more); ids in every table are in [0, vocab_size).
  std::vector<std::string> texts;  // vocabulary strings, after "[EMPTY_<id>]" renaming
  std::vector<TokenType> types;    // after the text-based CONTROL override
  // Text -> id, the last id for duplicate texts. Keys view `texts`, which never changes once built.
  absl::flat_hash_map<std::string_view, int32_t> id_of_text;
  std::array<int32_t, 256> byte_ids{};  // token of each byte's bytes_to_unicode string
  // (left id, right id) -> merge. Invariant: left, right and result are the canonical ids (id_of_text)
  // of their texts, so BPE symbols are always token ids.
  absl::flat_hash_map<uint64_t, Merge> merges;
  int32_t num_skipped_merges = 0;
  // Special tokens (CONTROL, USER_DEFINED, UNKNOWN) in partition order: longest text first, then by id.
  std::vector<int32_t> special_ids;
  // TokenPiece(id, true) is pieces[piece_offsets[id], piece_offsets[id + 1]).
  std::string pieces;
  std::vector<uint32_t> piece_offsets;
  std::vector<uint8_t> piece_hidden;  // 1: CONTROL / UNKNOWN, shown only when render_special
  absl::flat_hash_set<int32_t> end_of_generation;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  bool add_eos = false;
};

}  // namespace tokenizer_internal

namespace {

using tokenizer_internal::TokenizerData;

// Per-call scratch buffers, reused across the pieces of one Encode call.
struct EncodeScratch {
  struct Symbol {
    int32_t id;    // token id; -1 once merged into its left neighbour
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
  };
  std::vector<uint32_t> cpts;
  std::vector<unicode::CodepointClass> classes;
  std::vector<uint32_t> piece_lengths;
  std::string piece_bytes;
  std::vector<Symbol> symbols;
  // Merge candidates as rank << 32 | left symbol index, a min-heap: the lowest rank first, and among
  // equal ranks the leftmost pair, as llm_bigram_bpe's order. A candidate only names a position; it is
  // still valid when the pair there now has that rank, i.e. is still the same pair (ranks are unique
  // per pair). One word per entry keeps the heap small for long pieces.
  std::vector<uint64_t> heap;
};

constexpr uint64_t CandidateKey(int32_t rank, int32_t left) {
  return (uint64_t{static_cast<uint32_t>(rank)} << 32) | static_cast<uint32_t>(left);
}

// The merge of the live pair starting at symbol `left`, or null.
const Merge* PairAt(const TokenizerData& data, const EncodeScratch& s, int32_t left) {
  if (left < 0) return nullptr;
  const EncodeScratch::Symbol& symbol = s.symbols[left];
  if (symbol.id < 0 || symbol.next < 0) return nullptr;
  const auto it = data.merges.find(PairKey(symbol.id, s.symbols[symbol.next].id));
  return it == data.merges.end() ? nullptr : &it->second;
}

void QueuePair(const TokenizerData& data, EncodeScratch& s, int32_t left) {
  if (const Merge* merge = PairAt(data, s, left)) {
    s.heap.push_back(CandidateKey(merge->rank, left));
    std::push_heap(s.heap.begin(), s.heap.end(), std::greater<>());
  }
}

// Merges s.piece_bytes (one pre-tokenizer piece) and appends its token ids to `out`.
void BpePiece(const TokenizerData& data, EncodeScratch& s, std::vector<int32_t>* out) {
  const std::string& bytes = s.piece_bytes;
  if (bytes.size() == 1) {
    out->push_back(data.byte_ids[static_cast<uint8_t>(bytes[0])]);
    return;
  }
  const int32_t count = static_cast<int32_t>(bytes.size());
  s.symbols.clear();
  s.heap.clear();
  for (int32_t i = 0; i < count; ++i) {
    s.symbols.push_back({data.byte_ids[static_cast<uint8_t>(bytes[i])], i - 1, i + 1 < count ? i + 1 : -1});
  }
  for (int32_t i = 0; i + 1 < count; ++i) {
    if (const Merge* merge = PairAt(data, s, i)) s.heap.push_back(CandidateKey(merge->rank, i));
  }
  std::make_heap(s.heap.begin(), s.heap.end(), std::greater<>());  // linear, unlike pushing one at a time

  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<>());
    const uint64_t key = s.heap.back();
    s.heap.pop_back();
    const int32_t rank = static_cast<int32_t>(key >> 32);
    const int32_t left_index = static_cast<int32_t>(key & 0xFFFFFFFFu);
    const Merge* merge = PairAt(data, s, left_index);
    if (merge == nullptr || merge->rank != rank) continue;  // stale: a neighbour merged meanwhile
    EncodeScratch::Symbol& left = s.symbols[left_index];
    EncodeScratch::Symbol& right = s.symbols[left.next];
    left.id = merge->result;
    right.id = -1;
    left.next = right.next;
    if (right.next >= 0) s.symbols[right.next].prev = left_index;
    QueuePair(data, s, left.prev);
    QueuePair(data, s, left_index);
  }
  // Symbol 0 is never merged away: it is the left side of every merge it takes part in.
  for (int32_t i = 0; i >= 0; i = s.symbols[i].next) out->push_back(s.symbols[i].id);
}

// Pre-tokenizes and merges one raw-text fragment (the text between special tokens).
void EncodeFragment(const TokenizerData& data, std::string_view fragment, EncodeScratch& s, std::vector<int32_t>* out) {
  s.cpts.clear();
  s.classes.clear();
  s.piece_lengths.clear();
  unicode::Decode(fragment, &s.cpts);
  s.classes.reserve(s.cpts.size());
  for (uint32_t cp : s.cpts) s.classes.push_back(unicode::Classify(cp));
  SplitQwen2(s.cpts, s.classes, &s.piece_lengths);
  size_t p = 0;
  for (uint32_t len : s.piece_lengths) {
    // The canonical UTF-8 of the piece's code points: what llama.cpp's unicode_regex_split returns.
    s.piece_bytes.clear();
    for (size_t i = p; i < p + len; ++i) unicode::AppendUtf8(s.cpts[i], &s.piece_bytes);
    p += len;
    BpePiece(data, s, out);
  }
}

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::Create(TokenizerVocab vocab) {
  const size_t n = vocab.tokens.size();
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrFormat("tokenizer: %d tokens is more than int32 ids allow", n));
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tokenizer: %d token types for %d tokens", vocab.token_types.size(), n));
  }
  if (std::find(std::begin(kQwen2PreNames), std::end(kQwen2PreNames), vocab.pre) == std::end(kQwen2PreNames)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tokenizer: pre-tokenizer \"%s\" is not supported (mer implements qwen2, deepseek-r1-qwen, kormo)", vocab.pre));
  }
  const int32_t vocab_size = static_cast<int32_t>(n);
  using NamedId = std::pair<const char*, int32_t>;
  for (const auto& [name, id] : {NamedId{"bos", vocab.bos_id}, NamedId{"eos", vocab.eos_id}}) {
    if (id < -1 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokenizer: %s token id %d outside the vocabulary of %d tokens", name, id, vocab_size));
    }
  }
  if (vocab.add_bos && vocab.bos_id < 0) {
    return absl::InvalidArgumentError("tokenizer: add_bos is set but there is no bos token");
  }
  if (vocab.add_eos && vocab.eos_id < 0) {
    return absl::InvalidArgumentError("tokenizer: add_eos is set but there is no eos token");
  }

  auto data = std::make_shared<TokenizerData>();
  data->bos_id = vocab.bos_id;
  data->eos_id = vocab.eos_id;
  data->add_bos = vocab.add_bos;
  data->add_eos = vocab.add_eos;

  data->texts = std::move(vocab.tokens);
  data->types.resize(n, TokenType::kNormal);
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (!vocab.token_types.empty()) data->types[id] = TypeFromGguf(vocab.token_types[id]);
    // An empty pattern would match everywhere in the special-token partition; llama.cpp renames these.
    if (data->texts[id].empty()) data->texts[id] = absl::StrCat("[EMPTY_", id, "]");
  }
  // `texts` is final from here on: id_of_text's keys view its strings.
  data->id_of_text.reserve(n);
  for (int32_t id = 0; id < vocab_size; ++id) data->id_of_text[data->texts[id]] = id;

  const auto find_id = [&](std::string_view text) -> int32_t {
    const auto it = data->id_of_text.find(text);
    return it == data->id_of_text.end() ? -1 : it->second;
  };

  for (int byte = 0; byte < 256; ++byte) {
    const std::string text = unicode::ByteToken(static_cast<uint8_t>(byte));
    const int32_t id = find_id(text);
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokenizer: no token for byte 0x%02X (vocabulary string \"%s\")", byte, text));
    }
    data->byte_ids[byte] = id;
  }

  for (const auto& texts : {absl::MakeConstSpan(kEndOfGenerationTexts), absl::MakeConstSpan(kFimStopTexts),
                            absl::MakeConstSpan(kFimMarkerTexts)}) {
    for (std::string_view text : texts) {
      if (const int32_t id = find_id(text); id >= 0) data->types[id] = TokenType::kControl;
    }
  }
  for (const auto& texts : {absl::MakeConstSpan(kEndOfGenerationTexts), absl::MakeConstSpan(kFimStopTexts)}) {
    for (std::string_view text : texts) {
      if (const int32_t id = find_id(text); id >= 0) data->end_of_generation.insert(id);
    }
  }
  if (data->eos_id >= 0) data->end_of_generation.insert(data->eos_id);

  data->merges.reserve(vocab.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string_view merge = vocab.merges[rank];
    // As llama.cpp: split at the first space after the first byte.
    const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string_view::npos;
    if (space == std::string_view::npos || rank > static_cast<size_t>(std::numeric_limits<int32_t>::max() - 1)) {
      ++data->num_skipped_merges;
      continue;
    }
    const std::string_view left = merge.substr(0, space);
    const std::string_view right = merge.substr(space + 1);
    joined.assign(left);
    joined.append(right);
    const int32_t left_id = find_id(left);
    const int32_t right_id = find_id(right);
    const int32_t result_id = find_id(joined);
    if (left_id < 0 || right_id < 0 || result_id < 0) {
      ++data->num_skipped_merges;
      continue;
    }
    // try_emplace keeps the first, lowest, rank of a repeated merge, as llama.cpp's emplace does.
    data->merges.try_emplace(PairKey(left_id, right_id), Merge{static_cast<int32_t>(rank), result_id});
  }

  for (int32_t id = 0; id < vocab_size; ++id) {
    if (IsSpecialType(data->types[id])) data->special_ids.push_back(id);
  }
  std::stable_sort(data->special_ids.begin(), data->special_ids.end(),
                   [&](int32_t a, int32_t b) { return data->texts[a].size() > data->texts[b].size(); });

  data->piece_offsets.reserve(n + 1);
  data->piece_hidden.resize(n, 0);
  data->piece_offsets.push_back(0);
  for (int32_t id = 0; id < vocab_size; ++id) {
    switch (data->types[id]) {
      case TokenType::kNormal:
        data->pieces += DecodeNormalText(data->texts[id]);
        break;
      case TokenType::kControl:
      case TokenType::kUnknown:
        data->piece_hidden[id] = 1;
        data->pieces += data->texts[id];
        break;
      case TokenType::kUserDefined:
        data->pieces += data->texts[id];
        break;
      case TokenType::kUndefined:
      case TokenType::kUnused:
      case TokenType::kByte:  // llama.cpp's BPE token_to_piece has no case for these: they print nothing
        break;
    }
    if (data->pieces.size() > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError("tokenizer: the decoded vocabulary exceeds 4 GiB");
    }
    data->piece_offsets.push_back(static_cast<uint32_t>(data->pieces.size()));
  }

  return Tokenizer(std::move(data));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special, bool add_special) const {
  const TokenizerData& data = *data_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && data.add_bos) out.push_back(data.bos_id);

  // The partition, as llama.cpp's tokenizer_st_partition: one special token at a time, longest first;
  // each splits every raw fragment left so far at each of its occurrences, scanning left to right.
  struct Fragment {
    size_t begin;
    size_t end;
    int32_t token;  // >= 0: this special token; -1: raw text [begin, end), never empty
  };
  std::vector<Fragment> fragments;
  std::vector<Fragment> next;
  if (!text.empty()) fragments.push_back({0, text.size(), -1});
  for (int32_t special : data.special_ids) {
    const TokenType type = data.types[special];
    if (!parse_special && type != TokenType::kUserDefined) continue;
    const std::string_view pattern = data.texts[special];
    next.clear();
    bool split = false;
    for (const Fragment& f : fragments) {
      if (f.token >= 0 || f.end - f.begin < pattern.size()) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      while (true) {
        const size_t match = text.substr(pos, f.end - pos).find(pattern);
        if (match == std::string_view::npos) {
          if (pos < f.end) next.push_back({pos, f.end, -1});
          break;
        }
        split = true;
        if (match > 0) next.push_back({pos, pos + match, -1});
        next.push_back({0, 0, special});
        pos += match + pattern.size();
      }
    }
    if (split) fragments.swap(next);
  }

  EncodeScratch scratch;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
    } else {
      EncodeFragment(data, text.substr(f.begin, f.end - f.begin), scratch, &out);
    }
  }
  if (add_special && data.add_eos) out.push_back(data.eos_id);
  return out;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool render_special) const {
  std::string text;
  for (int32_t id : ids) {
    const std::string_view piece = TokenPiece(id, render_special);
    text.append(piece.data(), piece.size());
  }
  return text;
}

std::string_view Tokenizer::TokenPiece(int32_t id, bool render_special) const {
  const TokenizerData& data = *data_;
  if (id < 0 || id >= vocab_size()) return {};
  if (data.piece_hidden[id] && !render_special) return {};
  const uint32_t begin = data.piece_offsets[id];
  return std::string_view(data.pieces).substr(begin, data.piece_offsets[id + 1] - begin);
}

std::string Tokenizer::TokenBytes(int32_t id) const { return std::string(TokenPiece(id, true)); }

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(data_->texts.size()); }
int32_t Tokenizer::bos_id() const { return data_->bos_id; }
int32_t Tokenizer::eos_id() const { return data_->eos_id; }
bool Tokenizer::add_bos() const { return data_->add_bos; }
bool Tokenizer::add_eos() const { return data_->add_eos; }

std::string_view Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return data_->texts[id];
}

TokenType Tokenizer::GetTokenType(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUndefined;
  return data_->types[id];
}

int32_t Tokenizer::TokenId(std::string_view text) const {
  const auto it = data_->id_of_text.find(text);
  return it == data_->id_of_text.end() ? -1 : it->second;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const { return data_->end_of_generation.contains(id); }

std::vector<int32_t> Tokenizer::EndOfGenerationIds() const {
  std::vector<int32_t> ids(data_->end_of_generation.begin(), data_->end_of_generation.end());
  std::sort(ids.begin(), ids.end());
  return ids;
}

int32_t Tokenizer::num_merges() const { return static_cast<int32_t>(data_->merges.size()); }
int32_t Tokenizer::num_skipped_merges() const { return data_->num_skipped_merges; }

}  // namespace mer
