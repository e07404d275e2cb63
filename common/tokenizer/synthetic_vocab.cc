// MakeSyntheticVocab: a small deterministic Qwen-shaped vocabulary for synthetic test models.
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"

namespace mer {
namespace {

// The training text: prose, code, numbers, punctuation, whitespace of every kind the qwen2 splitter
// distinguishes, and a few non-ASCII scripts, so that merges cover what tests will feed the model.
// Changing it changes every synthetic vocabulary (and so every synthetic model's token ids).
constexpr std::string_view kCorpus =
    R"corpus(The quick brown fox jumps over the lazy dog. The dog doesn't mind; it's asleep.
A mixture-of-experts model routes each token to a few experts. The router picks the top 8 of 128 experts,
and the others stay idle. Experts that are used often should live in fast memory; the rest can wait in
RAM or on disk until the router asks for them. When an expert is missing, the engine loads it and waits.

We'll measure three things: tokens per second, time to first token, and memory traffic per token.
They've asked whether you're sure it'll fit. I'm sure: 30 billion parameters at 4 bits is about 15 GB.
DON'T PANIC. It's only a test, and the test is deterministic: same input, same output, every time.

Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 256 1024 4096 65536 3.14159 2.71828 -42 +7 1e-6 0x7FFF.
Dates and versions: 2024-05-01, 12:30:45, v1.2.3, 10/20/2030, build #4521, port 8080, 99.9% uptime.
Arithmetic: 2 + 2 = 4; 7 * 6 = 42; 10 / 4 = 2.5; (3 + 4) * 5 = 35; x^2 - 1 = (x - 1)(x + 1).

def route(hidden, router_weights, top_k=8):
    """Return the top_k experts and their weights for each token."""
    logits = hidden @ router_weights.T
    probs = softmax(logits, axis=-1)
    weights, experts = topk(probs, top_k)
    return experts, weights / weights.sum(axis=-1, keepdims=True)

for i in range(10):
    if i % 2 == 0:
        print(f"even {i}")
    else:
        print(f"odd  {i}")

#include <cstdint>
#include <vector>

// Adds two vectors element by element.
std::vector<float> Add(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    out[i] = a[i] + b[i];
  }
  return out;
}

int main(int argc, char** argv) {
	if (argc < 2) {
		return 1;  // usage: prog FILE
	}
	return 0;
}

{"model": "qwen3-moe", "experts": 128, "top_k": 8, "layers": 48, "enabled": true, "ratio": 0.75}
- item one
- item two: with a colon
* bullet [link](https://example.com/path?query=1&other=two#anchor)
> quoted text... and an ellipsis…
|| && != == <= >= -> => :: ++ -- += -= <<= >>= ... ?? !! ;;

Trailing spaces here   
	Tab-indented line
    Four-space indented line
Mixed    spacing   between     words.


Café, naïve, résumé, façade, jalapeño, Zürich, São Paulo, Kraków, Ångström, smörgåsbord.
Straße und Größe: Der schnelle braune Fuchs springt über den faulen Hund.
Ελληνικά: Η γρήγορη καφέ αλεπού. Русский: Привет, мир! Быстрая коричневая лиса.
日本語: 東京は日本の首都です。中文：你好，世界！我们在测试分词器。한국어: 안녕하세요 세계.
Emoji: 🙂 🚀 👍🏽 ❤️ — “curly quotes” and ‘single ones’, 50 € or £40 or ¥300, 20°C, ±5, ½ cup.
Arabic: مرحبا بالعالم. Hebrew: שלום עולם. Hindi: नमस्ते दुनिया. Thai: สวัสดีชาวโลก.

Once upon a time, a lighthouse keeper lived alone on a small island. Every evening she climbed the
stairs, lit the lamp, and wrote three lines in her log: the weather, the ships she had seen, and one
thing she was grateful for. The ships never stopped, but they always saw her light. Years later, a
child found the logs in a box and read them all in one night. "She wasn't lonely," the child said,
"she was busy." It's a good story, isn't it? We think so, and we've told it many times since then.

Inference engines are judged by latency and throughput. Latency is the time a user waits; throughput
is how much work the machine finishes per second. Batching raises throughput but can hurt latency,
so a scheduler has to balance the two. Caching helps both: a prefix that was computed before does not
need to be computed again. Prefetching helps too, when the engine can guess which experts come next.

fn main() {
    let numbers: Vec<u32> = (1..=10).collect();
    let total: u32 = numbers.iter().map(|n| n * n).sum();
    println!("sum of squares = {}", total);
    match total {
        0 => println!("zero"),
        n if n % 2 == 0 => println!("even: {n}"),
        _ => println!("odd"),
    }
}

$ cmake -S . -B build -G Ninja && ninja -C build -j2
$ ./build/bin/mer serve --model model.gguf --port 8080 --threads 16
$ curl -s http://localhost:8080/v1/completions -d '{"prompt": "Hello", "max_tokens": 32}'

SELECT name, COUNT(*) AS hits FROM requests WHERE status = 200 AND latency_ms < 250
GROUP BY name ORDER BY hits DESC LIMIT 10;

| layer | experts | hot | warm | cold |
|-------|---------|-----|------|------|
| 0     | 128     | 12  | 40   | 76   |
| 47    | 128     | 9   | 35   | 84   |

2025-01-15T08:30:00Z INFO  server started on port 8080 (pid 4321)
2025-01-15T08:30:01Z WARN  expert 17 of layer 3 is cold; loading from disk (12.5 MiB)
2025-01-15T08:30:02Z ERROR request 9f2c timed out after 30000 ms
2025-01-15T08:30:03Z DEBUG cache hit rate 93.7%, 1536 of 1640 lookups

Français : Le renard brun rapide saute par-dessus le chien paresseux. C'est l'été, n'est-ce pas ?
Español: El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la estación? ¡Qué bien!
Deutsch: Über den Wolken muss die Freiheit wohl grenzenlos sein. Übung macht den Meister.
Italiano: La volpe veloce salta sopra il cane pigro. Perché no? Così è la vita.
Português: A rápida raposa marrom pula sobre o cão preguiçoso. Não há nada como o coração.
Türkçe: Hızlı kahverengi tilki tembel köpeğin üzerinden atlar. Tiếng Việt: Xin chào thế giới.

The end of the corpus repeats common words so that they merge: the the the and and of of to to in in
is is that that for for with with as as on on it it this this be be are are was was by by at at
token token tokens tokens expert expert experts experts model model memory memory router router.
)corpus"
    // Raw strings cannot hold a CR that survives editors and git, so the CRLF lines are spelled out.
    "Windows line endings\r\nhere too\r\n\r\nand a lone CR\rin the middle.\r\n";

}  // namespace

std::string_view SyntheticVocabCorpus() { return kCorpus; }

TokenizerVocab MakeSyntheticVocab(int32_t vocab_size, int32_t max_merges) {
  constexpr int32_t kNumBytes = 256;
  constexpr int32_t kNumSpecial = 3;
  CHECK_MSG(vocab_size >= kNumBytes + kNumSpecial, "a synthetic vocabulary needs at least 259 tokens");
  CHECK(max_merges >= 0);

  TokenizerVocab vocab;
  absl::flat_hash_map<std::string, int32_t> id_of_text;
  const auto add_token = [&](std::string text, TokenType type) {
    const int32_t id = static_cast<int32_t>(vocab.tokens.size());
    id_of_text.emplace(text, id);
    vocab.tokens.push_back(std::move(text));
    vocab.token_types.push_back(static_cast<int32_t>(type));
    return id;
  };
  for (int byte = 0; byte < kNumBytes; ++byte) {
    add_token(unicode::ByteToken(static_cast<uint8_t>(byte)), TokenType::kNormal);
  }

  // Unique corpus words (pre-tokenizer pieces) with their counts, as token id sequences. std::map keeps
  // the order, and with it everything below, deterministic.
  std::map<std::string, int64_t> word_counts;
  for (std::string& piece : PreTokenizeQwen2(kCorpus)) ++word_counts[std::move(piece)];
  struct Word {
    std::vector<int32_t> ids;
    int64_t count;
  };
  std::vector<Word> words;
  words.reserve(word_counts.size());
  for (const auto& [bytes, count] : word_counts) {
    Word& word = words.emplace_back();
    word.count = count;
    for (char c : bytes) word.ids.push_back(static_cast<uint8_t>(c));  // byte b is token b
  }

  const int32_t max_merge_tokens = vocab_size - kNumSpecial;
  absl::flat_hash_map<uint64_t, int64_t> pair_counts;
  while (static_cast<int32_t>(vocab.merges.size()) < max_merges &&
         static_cast<int32_t>(vocab.tokens.size()) < max_merge_tokens) {
    pair_counts.clear();
    for (const Word& word : words) {
      for (size_t i = 0; i + 1 < word.ids.size(); ++i) {
        pair_counts[(uint64_t{static_cast<uint32_t>(word.ids[i])} << 32) | static_cast<uint32_t>(word.ids[i + 1])] +=
            word.count;
      }
    }
    // The most frequent pair; ties go to the smallest (left, right) strings. Token strings are unique,
    // so this is a total order and the choice does not depend on the hash map's iteration order.
    int32_t best_left = -1;
    int32_t best_right = -1;
    int64_t best_count = 0;
    for (const auto& [key, count] : pair_counts) {
      const int32_t left = static_cast<int32_t>(key >> 32);
      const int32_t right = static_cast<int32_t>(key & 0xFFFFFFFFu);
      const bool better = best_left < 0 || count > best_count ||
                          (count == best_count && std::tie(vocab.tokens[left], vocab.tokens[right]) <
                                                      std::tie(vocab.tokens[best_left], vocab.tokens[best_right]));
      if (better) {
        best_left = left;
        best_right = right;
        best_count = count;
      }
    }
    if (best_left < 0 || best_count < 2) break;

    std::string merged = vocab.tokens[best_left] + vocab.tokens[best_right];
    vocab.merges.push_back(absl::StrCat(vocab.tokens[best_left], " ", vocab.tokens[best_right]));
    // Two different splits can spell the same string ("a"+"bc", "ab"+"c"): reuse its token.
    const auto existing = id_of_text.find(merged);
    const int32_t result =
        existing != id_of_text.end() ? existing->second : add_token(std::move(merged), TokenType::kNormal);

    for (Word& word : words) {
      size_t out = 0;
      for (size_t i = 0; i < word.ids.size(); ++i) {
        if (i + 1 < word.ids.size() && word.ids[i] == best_left && word.ids[i + 1] == best_right) {
          word.ids[out++] = result;
          ++i;
        } else {
          word.ids[out++] = word.ids[i];
        }
      }
      word.ids.resize(out);
    }
  }

  const int32_t endoftext = add_token("<|endoftext|>", TokenType::kControl);
  add_token("<|im_start|>", TokenType::kControl);
  add_token("<|im_end|>", TokenType::kControl);
  while (static_cast<int32_t>(vocab.tokens.size()) < vocab_size) {
    add_token(absl::StrCat("[PAD", vocab.tokens.size(), "]"), TokenType::kUnused);
  }
  vocab.pre = "qwen2";
  vocab.bos_id = endoftext;
  vocab.eos_id = endoftext;
  vocab.add_bos = false;
  return vocab;
}

}  // namespace mer
