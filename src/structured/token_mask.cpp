#include "structured/token_mask.h"

#include <algorithm>
#include <numeric>

#include "longctx/core/error.h"
#include "longctx/core/parallel.h"

namespace longctx::structured {

namespace {

// Masks kept per grammar; past it the cache starts over (a long random walk through a big
// grammar must not hold memory without bound).
constexpr size_t kMaxCachedMasks = 4096;
// Tokens between two cumulative levels of a mask (TokenMask::levels) at least.
constexpr size_t kLevelTokens = 4096;

void set_bit(std::span<uint32_t> words, int32_t t) { words[t >> 5] |= uint32_t{1} << (t & 31); }

}  // namespace

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids,
                                 int64_t num_logits)
    : bytes_(std::move(token_bytes)), eos_(std::move(eos_ids)), num_logits_(num_logits) {
  LONGCTX_CHECK(num_logits_ >= static_cast<int64_t>(bytes_.size()) && num_logits_ > 0,
                ErrorCode::kInvalidArgument,
                "token vocabulary: {} tokens for logits rows of {} entries", bytes_.size(),
                num_logits_);
  for (int32_t e : eos_) {
    LONGCTX_CHECK(e >= 0 && e < num_logits_, ErrorCode::kInvalidArgument,
                  "token vocabulary: EOS id {} outside [0, {})", e, num_logits_);
  }
  for (int32_t t = 0; t < static_cast<int32_t>(bytes_.size()); ++t) {
    if (!bytes_[t].empty() && !is_eos(t)) sorted_.push_back(t);
  }
  std::sort(sorted_.begin(), sorted_.end(),
            [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  lcp_.assign(sorted_.size(), 0);
  sorted_begin_.assign(sorted_.size() + 1, 0);
  for (size_t i = 0; i < sorted_.size(); ++i) {
    const std::string& s = bytes_[sorted_[i]];
    sorted_bytes_ += s;
    sorted_begin_[i + 1] = sorted_bytes_.size();
    max_len_ = std::max(max_len_, s.size());
    if (i == 0) continue;
    const std::string& p = bytes_[sorted_[i - 1]];
    size_t k = 0;
    while (k < s.size() && k < p.size() && s[k] == p[k]) ++k;
    lcp_[i] = static_cast<int32_t>(k);
  }
}

const std::string& TokenVocabulary::bytes(int32_t token) const {
  static const std::string kNone;
  return token >= 0 && token < static_cast<int32_t>(bytes_.size()) ? bytes_[token] : kNone;
}

bool TokenVocabulary::is_eos(int32_t token) const {
  return std::find(eos_.begin(), eos_.end(), token) != eos_.end();
}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  LONGCTX_CHECK(vocab_ != nullptr, ErrorCode::kInvalidArgument, "compiled grammar: no vocabulary");
}

std::shared_ptr<const TokenMask> CompiledGrammar::mask(const GrammarState& state) const {
  std::string key = state.key();
  if (std::shared_ptr<const TokenMask> m = cached(key)) return m;
  std::shared_ptr<const TokenMask> m = compute(state);
  insert(std::move(key), m);
  return m;
}

std::pair<int64_t, int64_t> CompiledGrammar::cache_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {computed_, hits_};
}

namespace {

// The states one mask walk meets, each interned once with its transitions as they are taken: a
// lazily built DFA over the walk. Inside a string nearly every token leads back to the same few
// states, so most bytes cost an array read instead of a stack expansion. A walk meets few
// states (hundreds), so each keeps a dense row of its 256 transitions (1 KiB).
class StateTable {
 public:
  explicit StateTable(const Grammar& g) : g_(g) {}

  int32_t intern(GrammarState s) {
    std::string key = s.key();
    if (auto it = ids_.find(key); it != ids_.end()) return it->second;
    const auto id = static_cast<int32_t>(states_.size());
    edges_.resize(edges_.size() + 256, kUnknown);
    distances_.push_back(g_.distance(s));
    terminal_.push_back(g_.terminated(s) ? 1 : 0);
    states_.push_back(std::move(s));
    ids_.emplace(std::move(key), id);
    return id;
  }

  // The state after byte b from state `id`; -1 when dead.
  int32_t next(int32_t id, uint8_t b) {
    const size_t edge = static_cast<size_t>(id) * 256 + b;
    if (edges_[edge] != kUnknown) return edges_[edge];
    GrammarState s = g_.advance(states_[id], b);
    const int32_t to = s.dead() ? -1 : intern(std::move(s));
    edges_[edge] = to;  // after intern, which may have grown edges_
    return to;
  }

  int32_t distance(int32_t id) const { return distances_[id]; }
  bool terminal(int32_t id) const { return terminal_[id] != 0; }

 private:
  const Grammar& g_;
  std::vector<GrammarState> states_;
  std::vector<int32_t> distances_;
  std::vector<uint8_t> terminal_;
  std::unordered_map<std::string, int32_t> ids_;
  static constexpr int32_t kUnknown = -2;  // a transition not taken yet (-1: dead)
  std::vector<int32_t> edges_;             // [states][256]: state id after a byte
};

// Orders the mask's tokens by distance and keeps a cumulative mask where at least kLevelTokens
// tokens joined since the last one (below max_distance: `bits` is the mask there). A new state
// may allow most of the vocabulary (std::sort of 150K entries: ~14 ms), and distances are small
// integers, so a counting sort does it, unless they span more than the entries (a huge minLength).
void add_levels(TokenMask& m, int64_t words) {
  auto& entries = m.by_distance;
  if (static_cast<size_t>(m.max_distance) > entries.size()) {
    std::sort(entries.begin(), entries.end());
  } else {
    std::vector<size_t> start(static_cast<size_t>(m.max_distance) + 2, 0);
    for (const auto& e : entries) ++start[static_cast<size_t>(e.first) + 1];
    for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
    std::vector<std::pair<int32_t, int32_t>> sorted(entries.size());
    for (const auto& e : entries) sorted[start[static_cast<size_t>(e.first)]++] = e;
    entries = std::move(sorted);
  }
  std::vector<uint32_t> cum(static_cast<size_t>(words), 0);
  size_t last = 0;
  for (size_t i = 0; i < m.by_distance.size();) {
    const int32_t d = m.by_distance[i].first;
    if (d == m.max_distance) break;
    for (; i < m.by_distance.size() && m.by_distance[i].first == d; ++i)
      set_bit(cum, m.by_distance[i].second);
    if (i - last >= kLevelTokens) {
      m.levels.push_back({d, i, cum});
      last = i;
    }
  }
}

}  // namespace

std::shared_ptr<const TokenMask> CompiledGrammar::compute(const GrammarState& state) const {
  auto m = std::make_shared<TokenMask>();
  walk(state, 0, vocab_->sorted_.size(), *m);
  finish(state, *m);
  return m;
}

void CompiledGrammar::walk(const GrammarState& state, size_t begin, size_t end,
                           TokenMask& out) const {
  TokenMask* m = &out;
  const TokenVocabulary& v = *vocab_;
  m->bits.assign(v.mask_words(), 0);
  StateTable table(grammar_);
  // at[k]: the state after the first k bytes of the current token; valid for k <= alive.
  std::vector<int32_t> at(v.max_len_ + 1, -1);
  at[0] = table.intern(state);
  size_t alive = 0;  // the slice's first token shares nothing walked yet
  const size_t n = end;
  for (size_t i = begin; i < n;) {
    const int32_t t = v.sorted_[i];
    const std::string_view b(v.sorted_bytes_.data() + v.sorted_begin_[i],
                             v.sorted_begin_[i + 1] - v.sorted_begin_[i]);
    size_t k = std::min<size_t>(v.lcp_[i], alive);
    bool dead = false;
    for (; k < b.size(); ++k) {
      at[k + 1] = table.next(at[k], static_cast<uint8_t>(b[k]));
      if (at[k + 1] < 0) {
        dead = true;
        break;
      }
    }
    if (dead) {
      // Every following token that shares the dead prefix b[0..k] is dead too.
      alive = k;
      ++i;
      while (i < n && static_cast<size_t>(v.lcp_[i]) >= k + 1) ++i;
      continue;
    }
    alive = b.size();
    const int32_t d = table.distance(at[alive]);
    if (d < Grammar::kInfinite) {
      set_bit(m->bits, t);
      m->by_distance.emplace_back(d, t);
      m->max_distance = std::max(m->max_distance, d);
      if (table.terminal(at[alive])) m->ending.push_back(t);
    }
    ++i;
  }
}

void CompiledGrammar::finish(const GrammarState& state, TokenMask& m) const {
  const TokenVocabulary& v = *vocab_;
  if (grammar_.accepting(state)) {
    for (int32_t e : v.eos_) {
      set_bit(m.bits, e);
      m.by_distance.emplace_back(0, e);
      m.ending.push_back(e);
    }
  }
  std::sort(m.ending.begin(), m.ending.end());
  add_levels(m, v.mask_words());
}

std::shared_ptr<const TokenMask> CompiledGrammar::cached(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) return nullptr;
  ++hits_;
  return it->second;
}

void CompiledGrammar::insert(std::string key, std::shared_ptr<const TokenMask> m) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (cache_.size() >= kMaxCachedMasks) cache_.clear();
  ++computed_;
  cache_.emplace(std::move(key), std::move(m));
}

void prepare_masks(std::span<GrammarMatcher* const> matchers, size_t slice_tokens) {
  LONGCTX_CHECK(slice_tokens > 0, ErrorCode::kInvalidArgument, "prepare_masks: empty slices");
  struct Job {
    const CompiledGrammar* grammar = nullptr;
    const GrammarState* state = nullptr;
    std::string key;
    std::vector<GrammarMatcher*> users;
    std::vector<TokenMask> parts;  // one per slice of the sorted vocabulary
    bool failed = false;
  };
  std::vector<Job> jobs;
  for (GrammarMatcher* m : matchers) {
    if (m->ended_ || m->pending_ >= 0 || m->mask_ != nullptr) continue;
    std::string key = m->state_.key();
    if ((m->mask_ = m->grammar_->cached(key)) != nullptr) continue;
    auto same = std::find_if(jobs.begin(), jobs.end(), [&](const Job& j) {
      return j.grammar == m->grammar_.get() && j.key == key;
    });
    if (same == jobs.end()) {
      jobs.push_back({m->grammar_.get(), &m->state_, std::move(key), {}, {}, false});
      same = jobs.end() - 1;
    }
    same->users.push_back(m);
  }
  if (jobs.empty()) return;
  // Slices of every job, as one list of tasks: (job, slice).
  std::vector<std::pair<size_t, size_t>> tasks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const size_t n = jobs[j].grammar->num_walked();
    const size_t slices = std::clamp<size_t>((n + slice_tokens - 1) / slice_tokens, 1, 64);
    jobs[j].parts.resize(slices);
    for (size_t s = 0; s < slices; ++s) tasks.emplace_back(j, s);
  }
  // A pool worker must not throw: a failed walk (a grammar past its bounds) leaves its
  // matchers to fill_mask, whose own walk throws the error for its row.
  parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto [j, s] = tasks[i];
      Job& job = jobs[j];
      const size_t n = job.grammar->num_walked(), slices = job.parts.size();
      try {
        job.grammar->walk(*job.state, n * s / slices, n * (s + 1) / slices, job.parts[s]);
      } catch (...) {
        job.parts[s].bits.clear();  // read as failed below
      }
    }
  });
  parallel_for(static_cast<int64_t>(jobs.size()), [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      Job& job = jobs[j];
      TokenMask& m = job.parts.front();
      for (const TokenMask& p : job.parts) job.failed = job.failed || p.bits.empty();
      if (job.failed) continue;
      // In slice order, so the entries come in the order of one whole walk.
      for (size_t s = 1; s < job.parts.size(); ++s) {
        TokenMask& p = job.parts[s];
        for (size_t w = 0; w < m.bits.size(); ++w) m.bits[w] |= p.bits[w];
        m.by_distance.insert(m.by_distance.end(), p.by_distance.begin(), p.by_distance.end());
        m.ending.insert(m.ending.end(), p.ending.begin(), p.ending.end());
        m.max_distance = std::max(m.max_distance, p.max_distance);
        p = TokenMask{};
      }
      job.grammar->finish(*job.state, m);
    }
  });
  for (Job& job : jobs) {
    if (job.failed) continue;
    auto m = std::make_shared<const TokenMask>(std::move(job.parts.front()));
    for (GrammarMatcher* u : job.users) u->mask_ = m;
    job.grammar->insert(std::move(job.key), std::move(m));
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(grammar_->grammar().initial()) {}

void GrammarMatcher::fill_mask(int64_t remaining, std::span<uint32_t> words) {
  LONGCTX_CHECK(static_cast<int64_t>(words.size()) == grammar_->vocab().mask_words(),
                ErrorCode::kInternal, "grammar mask: {} words for {} logits", words.size(),
                grammar_->vocab().num_logits());
  settle();
  std::fill(words.begin(), words.end(), 0u);
  if (ended_) return;
  const TokenMask* m = &current_mask();
  const int64_t budget = std::max<int64_t>(remaining - 1, 0);
  if (m->max_distance <= budget) {
    std::copy(m->bits.begin(), m->bits.end(), words.begin());
    return;
  }
  const auto& order = m->by_distance;
  if (order.empty()) return;
  // Nothing completes in time: take the tokens that close fastest.
  const int64_t limit = std::max<int64_t>(budget, order.front().first);
  // The deepest cumulative level within the limit, then the tokens after it.
  size_t i = 0;
  for (auto it = m->levels.rbegin(); it != m->levels.rend(); ++it) {
    if (it->distance <= limit) {
      std::copy(it->bits.begin(), it->bits.end(), words.begin());
      i = it->end;
      break;
    }
  }
  for (; i < order.size() && order[i].first <= limit; ++i) set_bit(words, order[i].second);
}

const TokenMask& GrammarMatcher::current_mask() {
  if (mask_ == nullptr) mask_ = grammar_->mask(state_);
  return *mask_;
}

bool GrammarMatcher::take(int32_t token) {
  settle();
  if (ended_ || token < 0 || token >= grammar_->vocab().num_logits()) return false;
  const TokenMask& m = current_mask();
  if (((m.bits[token >> 5] >> (token & 31)) & 1) == 0) return false;
  const bool ends = std::binary_search(m.ending.begin(), m.ending.end(), token);
  if (grammar_->vocab().is_eos(token)) {
    ended_ = true;  // an EOS is allowed only where the document may end: no walk
    return true;
  }
  pending_ = token;
  pending_ends_ = ends;
  return true;
}

void GrammarMatcher::settle() {
  if (pending_ < 0) return;
  const int32_t token = pending_;
  pending_ = -1;
  LONGCTX_CHECK(accept(token), ErrorCode::kInternal,
                "structured output: the grammar refused token {}, which its mask allowed", token);
}

bool GrammarMatcher::accept(int32_t token) {
  settle();
  if (ended_) return false;
  const TokenVocabulary& v = grammar_->vocab();
  if (v.is_eos(token)) {
    if (!grammar_->grammar().accepting(state_)) return false;
    ended_ = true;
    return true;
  }
  const std::string& b = v.bytes(token);
  if (b.empty()) return false;
  GrammarState next = grammar_->grammar().advance(state_, b);
  if (next.dead() || grammar_->grammar().distance(next) >= Grammar::kInfinite) return false;
  state_ = std::move(next);
  mask_.reset();
  return true;
}

bool GrammarMatcher::terminated() const {
  if (ended_) return true;
  return pending_ >= 0 ? pending_ends_ : grammar_->grammar().terminated(state_);
}

bool GrammarMatcher::accepting() {
  settle();
  return ended_ || grammar_->grammar().accepting(state_);
}

}  // namespace longctx::structured
