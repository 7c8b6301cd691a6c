#include "tokenizer/bpe.h"

#include <algorithm>
#include <climits>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "longctx/core/error.h"

namespace longctx::tokenizer {

size_t StringHash::operator()(std::string_view s) const {
  return static_cast<size_t>(XXH3_64bits(s.data(), s.size()));
}

void MergeTable::build(
    const std::vector<std::pair<uint64_t, std::pair<int32_t, int32_t>>>& entries) {
  size_t cap = 16;
  while (cap < entries.size() * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  size_ = 0;
  for (const auto& [key, value] : entries) {
    size_t i = slot_of(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    if (slots_[i].key == kEmpty) ++size_;
    // A repeated pair keeps the later rank, as a map built by iterating the merges would.
    slots_[i] = Slot{key, value.first, value.second};
  }
}

WordCache::WordCache(size_t max_entries) : max_entries_(max_entries) {
  size_t cap = 16;
  while (cap < max_entries * 2) cap <<= 1;
  slots_.resize(cap);
}

bool WordCache::lookup(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Entry& e = slots_[i];
    if (e.ids_len == 0) return false;
    if (e.hash == hash && e.key_len == word.size() &&
        std::equal(word.begin(), word.end(), keys_.begin() + e.key_off)) {
      out.insert(out.end(), ids_.begin() + e.ids_off, ids_.begin() + e.ids_off + e.ids_len);
      return true;
    }
  }
}

void WordCache::insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t n) {
  if (n == 0 || word.size() > kMaxWordBytes) return;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || size_ >= max_entries_) return;
  size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  for (; slots_[i].ids_len != 0; i = (i + 1) & mask) {
    const Entry& e = slots_[i];
    if (e.hash == hash && e.key_len == word.size() &&
        std::equal(word.begin(), word.end(), keys_.begin() + e.key_off))
      return;  // another thread got here first
  }
  Entry& e = slots_[i];
  e.hash = hash;
  e.key_off = static_cast<uint32_t>(keys_.size());
  e.key_len = static_cast<uint32_t>(word.size());
  e.ids_off = static_cast<uint32_t>(ids_.size());
  e.ids_len = static_cast<uint32_t>(n);
  keys_.append(word);
  ids_.insert(ids_.end(), ids, ids + n);
  ++size_;
}

BpeModel::BpeModel(StringIdMap vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options)
    : vocab_(std::move(vocab)), options_(options), cache_(options.cache_entries) {
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (it != vocab_.end()) byte_ids_[b] = it->second;
  }
  std::vector<std::pair<uint64_t, std::pair<int32_t, int32_t>>> entries;
  entries.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto a = vocab_.find(left);
    auto b = vocab_.find(right);
    joined = left + right;
    auto m = vocab_.find(joined);
    LONGCTX_CHECK(a != vocab_.end() && b != vocab_.end() && m != vocab_.end(),
                  ErrorCode::kInvalidArgument,
                  "tokenizer.json: model.merges[{}] uses a token that is not in model.vocab", rank);
    entries.push_back(
        {MergeTable::pack(a->second, b->second), {static_cast<int32_t>(rank), m->second}});
  }
  merges_.build(entries);
}

std::optional<int32_t> BpeModel::find(std::string_view bytes) const {
  auto it = vocab_.find(bytes);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    int32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
    if (id >= 0) {
      out.push_back(id);
    } else if (options_.unk_id) {
      out.push_back(*options_.unk_id);
    }
    return;
  }
  uint64_t hash = XXH3_64bits(word.data(), word.size());
  if (cache_.lookup(word, hash, out)) return;
  size_t start = out.size();
  auto it = options_.ignore_merges ? vocab_.find(word) : vocab_.end();
  if (it != vocab_.end()) {
    out.push_back(it->second);  // ignore_merges: a word that is a token is taken whole
  } else {
    merge_word(word, out);
  }
  cache_.insert(word, hash, out.data() + start, out.size() - start);
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() <= 64) {
    merge_word_scan(word, out);
  } else {
    merge_word_heap(word, out);
  }
}

// Short words: symbols in a small array with the rank of each adjacent pair; each step merges
// the lowest-rank (then leftmost) pair and refreshes only the two pairs it touched.
void BpeModel::merge_word_scan(std::string_view word, std::vector<int32_t>& out) const {
  int32_t ids[64], ranks[64], merged[64];
  int m = 0;
  for (char c : word) {
    int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) {
      if (!options_.unk_id) continue;
      id = *options_.unk_id;
    }
    ids[m++] = id;
  }
  auto refresh = [&](int i) {
    if (!merges_.find(ids[i], ids[i + 1], &ranks[i], &merged[i])) ranks[i] = INT_MAX;
  };
  for (int i = 0; i + 1 < m; ++i) refresh(i);
  while (m > 1) {
    int best = 0;
    for (int i = 1; i + 1 < m; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == INT_MAX) break;
    ids[best] = merged[best];
    for (int i = best + 1; i + 1 < m; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --m;
    if (best + 1 < m) refresh(best);
    if (best > 0) refresh(best - 1);
  }
  out.insert(out.end(), ids, ids + m);
}

// Long words: a doubly linked list of symbols and a min-heap of candidate merges keyed by
// (rank, position), with stale entries skipped when popped. O(n log n).
void BpeModel::merge_word_heap(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  syms.clear();
  heap.clear();
  for (char c : word) {
    int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) {
      if (!options_.unk_id) continue;
      id = *options_.unk_id;
    }
    int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1, true});
    if (n > 0) syms[n - 1].next = n;
  }
  auto push_pair = [&](int32_t pos) {
    int32_t next = syms[pos].next;
    Candidate c{0, pos, 0};
    if (merges_.find(syms[pos].id, syms[next].id, &c.rank, &c.merged)) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    Candidate top = heap.back();
    heap.pop_back();
    Symbol& s = syms[top.pos];
    if (!s.alive || s.next < 0) continue;
    int32_t rank, merged;
    if (!merges_.find(s.id, syms[s.next].id, &rank, &merged) || rank != top.rank ||
        merged != top.merged)
      continue;  // stale: the pair at pos changed since this entry was pushed
    Symbol& right = syms[s.next];
    right.alive = false;
    s.id = merged;
    s.next = right.next;
    if (s.next >= 0) syms[s.next].prev = top.pos;
    if (s.prev >= 0) push_pair(s.prev);
    if (s.next >= 0) push_pair(top.pos);
  }
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace longctx::tokenizer
