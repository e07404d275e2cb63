#include "common/tokenizer/pretokenizer.h"

namespace mer {
namespace {

using unicode::CodepointClass;

constexpr uint32_t AsciiLower(uint32_t cp) { return (cp >= 'A' && cp <= 'Z') ? cp + ('a' - 'A') : cp; }

constexpr bool IsCrOrLf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// Length in code points of the qwen2 regex match that starts at `p` (< n). Each block below is one
// alternative of the regex, tried in the regex's order; a block returns only when its alternative
// matches, with the length std::regex's backtracking settles on.
size_t MatchAt(absl::Span<const uint32_t> cpts, absl::Span<const CodepointClass> classes, size_t p) {
  const size_t n = cpts.size();
  const uint32_t c = cpts[p];
  const CodepointClass cls = classes[p];
  const auto is_letter_at = [&](size_t i) { return i < n && classes[i] == CodepointClass::kLetter; };

  // (?i:'s|'t|'re|'ve|'m|'ll|'d), written by llama.cpp as '[sS]|'[tT]|... (ASCII case only).
  if (c == '\'' && p + 1 < n) {
    const uint32_t c1 = AsciiLower(cpts[p + 1]);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (p + 2 < n) {
      const uint32_t c2 = AsciiLower(cpts[p + 2]);
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    }
  }

  // [^\r\n\p{L}\p{N}]?\p{L}+ : a letter run, optionally led by one code point that is not CR, LF,
  // a letter or a number (a space, a tab, punctuation, an apostrophe that began no contraction...).
  {
    size_t q = p;
    if (cls == CodepointClass::kLetter) {
      q = p + 1;
    } else if (!IsCrOrLf(c) && cls != CodepointClass::kNumber && is_letter_at(p + 1)) {
      q = p + 2;
    }
    if (q > p) {
      while (is_letter_at(q)) ++q;
      return q - p;
    }
  }

  // \p{N} : a single number code point (qwen2 has no {1,3} here).
  if (cls == CodepointClass::kNumber) return 1;

  // " ?[^\s\p{L}\p{N}]+[\r\n]*" : an optional space, a run of "other" code points, trailing CR/LF.
  {
    size_t q = p;
    if (c == ' ' && p + 1 < n && classes[p + 1] == CodepointClass::kOther) q = p + 1;
    if (classes[q] == CodepointClass::kOther) {
      while (q < n && classes[q] == CodepointClass::kOther) ++q;
      while (q < n && IsCrOrLf(cpts[q])) ++q;
      return q - p;
    }
  }

  // What is left: `c` is whitespace (every other class matched above). Measure its run.
  size_t run_end = p;
  size_t after_last_cr_lf = 0;  // 0: the run has no CR/LF
  while (run_end < n && classes[run_end] == CodepointClass::kSpace) {
    if (IsCrOrLf(cpts[run_end])) after_last_cr_lf = run_end + 1;
    ++run_end;
  }

  // \s*[\r\n]+ : \s* backtracks from the whole run to the last CR/LF in it.
  if (after_last_cr_lf != 0) return after_last_cr_lf - p;

  // \s+(?!\S) : the whole run at the end of the text; otherwise all but its last code point, which
  // then leads the next piece (e.g. the space of " word"). Needs a run of 2 or more.
  const size_t run = run_end - p;
  if (run_end == n) return run;
  if (run >= 2) return run - 1;

  // \s+ : a single whitespace code point before a non-space.
  return run;
}

}  // namespace

void SplitQwen2(absl::Span<const uint32_t> cpts, absl::Span<const CodepointClass> classes,
                std::vector<uint32_t>* piece_lengths) {
  size_t p = 0;
  while (p < cpts.size()) {
    const size_t len = MatchAt(cpts, classes, p);
    piece_lengths->push_back(static_cast<uint32_t>(len));
    p += len;
  }
}

std::vector<std::string> PreTokenizeQwen2(std::string_view text) {
  std::vector<uint32_t> cpts;
  unicode::Decode(text, &cpts);
  std::vector<CodepointClass> classes;
  classes.reserve(cpts.size());
  for (uint32_t cp : cpts) classes.push_back(unicode::Classify(cp));
  std::vector<uint32_t> lengths;
  SplitQwen2(cpts, classes, &lengths);
  std::vector<std::string> pieces;
  pieces.reserve(lengths.size());
  size_t p = 0;
  for (uint32_t len : lengths) {
    std::string& piece = pieces.emplace_back();
    for (size_t i = p; i < p + len; ++i) unicode::AppendUtf8(cpts[i], &piece);
    p += len;
  }
  return pieces;
}

}  // namespace mer
