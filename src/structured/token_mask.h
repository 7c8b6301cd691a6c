// Grammar -> per-token masks over a tokenizer's vocabulary, as xgrammar and llama.cpp do: a
// token is allowed in a state when the grammar takes every one of its bytes from there. The
// vocabulary is sorted by bytes, so one walk shares the state of every common prefix and skips
// every token under a dead prefix. A mask is computed once per state and cached (a grammar
// state that recurs costs a lookup). EOS tokens are allowed only where a document may end.
//
// "Always parses" within max_tokens: with each allowed token the cache keeps the distance of the
// state it leads to (the fewest bytes that complete a document from there). With `remaining`
// tokens left, this one included, a token is allowed only when its distance is at most
// remaining - 1; a vocabulary holding every single byte as a token (byte-level BPE) can then
// always complete, one byte per token, by the last one. When no token fits (the budget was
// already short at the start) the tokens of least distance are allowed, closing as fast as the
// grammar can.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "structured/grammar.h"

namespace longctx::structured {

// The vocabulary as the grammar sees it: each token's bytes as they appear in decoded text.
// Tokens given no bytes (special tokens) are never allowed; eos_ids end a document.
class TokenVocabulary {
 public:
  // `num_logits`: the width of a logits row (may exceed token_bytes.size(): padding).
  TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids,
                  int64_t num_logits);
  int64_t num_logits() const { return num_logits_; }
  int64_t mask_words() const { return (num_logits_ + 31) / 32; }
  const std::string& bytes(int32_t token) const;
  bool is_eos(int32_t token) const;
  const std::vector<int32_t>& eos_ids() const { return eos_; }

 private:
  friend class CompiledGrammar;
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_;
  int64_t num_logits_ = 0;
  std::vector<int32_t> sorted_;  // tokens with bytes, by bytes
  std::vector<int32_t> lcp_;     // common prefix length of sorted_[i] with sorted_[i - 1]
  // The bytes of sorted_ one after another (sorted_[i]'s from sorted_begin_[i] to [i + 1]): a
  // walk reads them in order instead of each token's string wherever it lives.
  std::string sorted_bytes_;
  std::vector<size_t> sorted_begin_;
  size_t max_len_ = 0;
};

// The tokens allowed in one state.
struct TokenMask {
  // A cumulative mask: every allowed token whose distance is at most `distance`; `end` of them
  // lead `by_distance`.
  struct Level {
    int32_t distance = 0;
    size_t end = 0;
    std::vector<uint32_t> bits;
  };
  std::vector<uint32_t> bits;  // bit t of word t / 32: token t allowed
  // (distance after the token, token) of every allowed token, by distance.
  std::vector<std::pair<int32_t, int32_t>> by_distance;
  // Levels where many tokens share a distance (a string's body: most of the vocabulary), so that
  // a budget short of max_distance costs a copy and the few tokens past the level, not a walk
  // over every allowed token.
  std::vector<Level> levels;
  int32_t max_distance = 0;  // over by_distance
  // The allowed tokens after which the document must end (the grammar's terminated state), by
  // id: what a step needs to know of a sampled token before its grammar walks its bytes.
  std::vector<int32_t> ending;
};

class GrammarMatcher;

// Tokens of the sorted vocabulary per task when prepare_masks splits a walk.
inline constexpr size_t kMaskSliceTokens = 16384;

// Looks up the masks of the matchers' current states and computes those not cached, each walk
// split over the thread pool in slices of `slice_tokens` tokens of the byte-sorted vocabulary
// (merged, a mask is the same as one walk's): a new state costs the step its longest slice, not
// a whole-vocabulary walk on one thread while the other rows' threads wait. Matchers with a
// token still to settle, or already ended, are skipped; a walk that fails (a grammar past its
// bounds) leaves its matchers to fill_mask, which throws. Call it from outside the pool.
void prepare_masks(std::span<GrammarMatcher* const> matchers,
                   size_t slice_tokens = kMaskSliceTokens);

// A grammar with its vocabulary and mask cache: what requests with the same schema share.
// Thread-safe (the cache is locked); matchers hold it by shared_ptr.
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab);
  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocab() const { return *vocab_; }
  std::shared_ptr<const TokenMask> mask(const GrammarState& state) const;
  // Masks computed, masks found in the cache.
  std::pair<int64_t, int64_t> cache_stats() const;

 private:
  friend void prepare_masks(std::span<GrammarMatcher* const>, size_t);
  std::shared_ptr<const TokenMask> compute(const GrammarState& state) const;
  // Adds the allowed tokens of vocab().sorted_[begin, end) to `m` (bits, by_distance, ending,
  // max_distance), in sorted order.
  void walk(const GrammarState& state, size_t begin, size_t end, TokenMask& m) const;
  // Completes a mask walked over the whole vocabulary: the EOS tokens, ending's order, levels.
  void finish(const GrammarState& state, TokenMask& m) const;
  std::shared_ptr<const TokenMask> cached(const std::string& key) const;  // null: not cached
  size_t num_walked() const { return vocab_->sorted_.size(); }            // tokens a walk visits
  void insert(std::string key, std::shared_ptr<const TokenMask> m) const;

  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const TokenMask>> cache_;
  mutable int64_t computed_ = 0, hits_ = 0;
};

// One request's place in its grammar.
//
// A token is taken in two halves so that the walk over its bytes can leave a step's critical
// path: take() checks it against the current state's mask and answers terminated() at once;
// settle() walks its bytes, and the engine runs it with the next mask fill, while the device
// computes the next step. accept() is both at once.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  // The tokens allowed next, bit t of words[t / 32], when at most `remaining` tokens (this one
  // included) may still be generated. words.size() must be vocab().mask_words(). Settles first.
  void fill_mask(int64_t remaining, std::span<uint32_t> words);
  // Moves past `token`; false (state unchanged) when the grammar does not take it.
  bool accept(int32_t token);
  // Takes `token` if the current state's mask allows it (the one fill_mask used; looked up when
  // none was) and leaves its walk to settle(); false (nothing taken) when it is not allowed.
  // Takes exactly the tokens accept() takes, and terminated() answers as after accept().
  bool take(int32_t token);
  // Walks the bytes of the token take() left (nothing when none). Throws Error(kInternal) if the
  // grammar refuses it, which the mask it was checked against rules out.
  void settle();
  // The document is complete and nothing may follow (a request ends here).
  bool terminated() const;
  // A document may end here. Settles first.
  bool accepting();
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  friend void prepare_masks(std::span<GrammarMatcher* const>, size_t);
  // The current state's mask, looked up once per state.
  const TokenMask& current_mask();

  std::shared_ptr<const CompiledGrammar> grammar_;
  GrammarState state_;
  std::shared_ptr<const TokenMask> mask_;  // of state_ (null until looked up)
  int32_t pending_ = -1;                   // taken, not yet walked
  bool pending_ends_ = false;              // the document ends with pending_
  bool ended_ = false;                     // an EOS was accepted
};

}  // namespace longctx::structured
