// Prompt-lookup (n-gram) drafts for speculative decoding, as vLLM's `ngram` method: the last n
// tokens of a sequence (n from max_n down to min_n) are looked up among the sequence's earlier
// tokens (prompt and generated), and the up-to-k tokens that followed their most recent earlier
// occurrence are the draft.
//
// Cost. The drafter indexes each sequence incrementally: for every n in [min_n, max_n] a hash map
// from the n-gram ending at position e to the latest such e, so a token appended costs
// (max_n - min_n + 1) map updates of an O(n) hash, and a proposal (max_n - min_n + 1) lookups plus
// one O(n) comparison of the hit (a 64-bit hash collision only turns a hit into a miss for that
// n). Nothing scans the context: a proposal at 128K tokens costs what it costs at 1K. Memory is
// one map entry (~40 bytes with std::unordered_map) per token and n, ~5 MiB per n at 128K.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace longctx {

class NgramDrafter {
 public:
  NgramDrafter() = default;
  // 1 <= min_n <= max_n (checked by SpeculativeConfig::validate).
  NgramDrafter(int64_t min_n, int64_t max_n);

  // The draft after `tokens` (at most `k` tokens; empty when no n-gram of the suffix occurred
  // before). `tokens` must extend the tokens of the previous call (the drafter indexes only what
  // was appended since); a shorter sequence starts the index over.
  std::vector<int32_t> propose(std::span<const int32_t> tokens, int64_t k);

 private:
  // The n-gram tokens[e - n, e) as a key.
  static uint64_t key_of(std::span<const int32_t> tokens, int64_t e, int64_t n);

  int64_t min_n_ = 0, max_n_ = 0;
  // [n - min_n] n-gram key -> the latest end e (exclusive) of an indexed occurrence.
  std::vector<std::unordered_map<uint64_t, int32_t>> index_;
  int64_t indexed_ = 0;  // ends e < indexed_ are in the index
};

}  // namespace longctx
