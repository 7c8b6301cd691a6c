#include "kv/block_manager.h"

#include <algorithm>
#include <iterator>
#include <limits>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "longctx/core/error.h"

namespace longctx {

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching)
    : block_size_(block_size), prefix_caching_(enable_prefix_caching) {
  LONGCTX_CHECK(
      num_blocks > 0 && block_size > 0 && num_blocks <= std::numeric_limits<int32_t>::max(),
      ErrorCode::kInvalidArgument,
      "block manager: {} blocks of {} tokens (both must be positive, blocks < 2^31)", num_blocks,
      block_size);
  blocks_.resize(num_blocks);
  free_.reserve(num_blocks);
  // Popped from the back: lowest ids first, so small runs use a compact prefix of the pool.
  for (int64_t b = num_blocks; b-- > 0;) free_.push_back(static_cast<int32_t>(b));
}

int64_t BlockManager::num_free_blocks() const {
  return static_cast<int64_t>(free_.size() + lru_.size());
}

BlockManagerStats BlockManager::stats() const {
  BlockManagerStats s;
  s.num_blocks = num_blocks();
  s.used_blocks = num_blocks() - num_free_blocks();
  s.cached_blocks = static_cast<int64_t>(by_hash_.size());
  s.queries = queries_;
  s.hits = hits_;
  return s;
}

std::span<const int32_t> BlockManager::table(uint64_t seq) const {
  auto it = seqs_.find(seq);
  LONGCTX_CHECK(it != seqs_.end(), ErrorCode::kInternal,
                "block manager: sequence {} holds no blocks", seq);
  return it->second.blocks;
}

uint64_t BlockManager::hash_block(uint64_t parent, std::span<const int32_t> tokens) const {
  return XXH64(tokens.data(), tokens.size_bytes(), parent);
}

int32_t BlockManager::lookup(uint64_t hash, uint64_t parent,
                             std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const Block& b = blocks_[it->second];
  if (b.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), b.tokens.begin(), b.tokens.end()))
    return -1;  // a hash collision: not the same prefix
  return it->second;
}

int32_t BlockManager::take_block() {
  int32_t id = -1;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    id = lru_.front();
    lru_.pop_front();
    Block& b = blocks_[id];
    by_hash_.erase(b.hash);
    b.cached = false;
    b.tokens.clear();
  } else {
    return -1;
  }
  blocks_[id].ref = 1;
  return id;
}

void BlockManager::acquire(int32_t id) {
  Block& b = blocks_[id];
  if (b.ref == 0) {
    LONGCTX_CHECK(b.cached, ErrorCode::kInternal, "block manager: acquiring free block {}", id);
    lru_.erase(b.lru_pos);
  }
  ++b.ref;
}

void BlockManager::release(int32_t id) {
  Block& b = blocks_[id];
  LONGCTX_CHECK(b.ref > 0, ErrorCode::kInternal, "block manager: block {} released twice", id);
  if (--b.ref > 0) return;
  if (b.cached) {
    b.lru_pos = lru_.insert(lru_.end(), id);
  } else {
    free_.push_back(id);
  }
}

bool BlockManager::grow(SeqState& s, int64_t n, int64_t first_write,
                        std::vector<KVBlockCopy>* copies) {
  if (first_write < static_cast<int64_t>(s.blocks.size()) &&
      blocks_[s.blocks[first_write]].cached) {
    const int32_t src = s.blocks[first_write];
    const int32_t dst = take_block();
    if (dst < 0) return false;
    LONGCTX_CHECK(copies != nullptr, ErrorCode::kInternal,
                  "block manager: a copy-on-write needs a copy list");
    copies->push_back({src, dst});
    pending_release_.push_back(src);  // the sequence's reference, held until the copy ran
    s.blocks[first_write] = dst;
    s.num_cached_blocks = std::min<int64_t>(s.num_cached_blocks, first_write);
  }
  while (static_cast<int64_t>(s.blocks.size()) < n) {
    const int32_t id = take_block();
    if (id < 0) return false;
    s.blocks.push_back(id);
  }
  return true;
}

BlockManager::Start BlockManager::start(uint64_t seq, std::span<const int32_t> tokens,
                                        int64_t max_new, std::vector<KVBlockCopy>* copies) {
  LONGCTX_CHECK(!holds(seq), ErrorCode::kInternal, "block manager: sequence {} started twice", seq);
  const auto n = static_cast<int64_t>(tokens.size());
  LONGCTX_CHECK(n > 0 && max_new > 0, ErrorCode::kInternal,
                "block manager: start with {} tokens, max_new {}", n, max_new);
  std::vector<int32_t> hits;
  std::vector<uint64_t> hashes;
  if (prefix_caching_) {
    uint64_t parent = 0;
    for (int64_t i = 0; (i + 1) * block_size_ <= n; ++i) {
      auto blk = tokens.subspan(i * block_size_, block_size_);
      const uint64_t h = hash_block(parent, blk);
      const int32_t id = lookup(h, parent, blk);
      if (id < 0) break;
      hits.push_back(id);
      hashes.push_back(h);
      parent = h;
    }
  }
  const auto num_hits = static_cast<int64_t>(hits.size());
  Start r;
  r.num_cached = std::min(num_hits * block_size_, n - 1);
  r.num_new = std::min(n - r.num_cached, max_new);
  const int64_t need = blocks_for(r.num_cached + r.num_new);
  const int64_t first_write = r.num_cached / block_size_;
  const bool cow = first_write < num_hits;
  int64_t hits_idle = 0;  // hits now evictable: acquiring them takes them off the free count
  for (int32_t id : hits) hits_idle += blocks_[id].ref == 0 ? 1 : 0;
  // A block may appear once only in a chain, so every hit is a distinct block.
  const int64_t fresh = need - num_hits + (cow ? 1 : 0);
  if (fresh > num_free_blocks() - hits_idle) return Start{};
  SeqState& s = seqs_[seq];
  for (int32_t id : hits) acquire(id);
  s.blocks = std::move(hits);
  s.num_cached_blocks = num_hits;
  s.hashes = std::move(hashes);
  const bool ok = grow(s, need, first_write, copies);
  LONGCTX_CHECK(ok, ErrorCode::kInternal, "block manager: counted {} free blocks but ran out",
                fresh);
  queries_ += n;
  hits_ += r.num_cached;
  return r;
}

bool BlockManager::append(uint64_t seq, int64_t num_computed, int64_t num_new,
                          std::vector<KVBlockCopy>* copies) {
  auto it = seqs_.find(seq);
  LONGCTX_CHECK(it != seqs_.end(), ErrorCode::kInternal,
                "block manager: append to sequence {} that holds no blocks", seq);
  SeqState& s = it->second;
  const int64_t need = blocks_for(num_computed + num_new);
  const int64_t first_write = num_computed / block_size_;
  const bool cow =
      first_write < static_cast<int64_t>(s.blocks.size()) && blocks_[s.blocks[first_write]].cached;
  const int64_t fresh =
      std::max<int64_t>(0, need - static_cast<int64_t>(s.blocks.size())) + (cow ? 1 : 0);
  if (fresh > num_free_blocks()) return false;
  const bool ok = grow(s, need, first_write, copies);
  LONGCTX_CHECK(ok, ErrorCode::kInternal, "block manager: counted {} free blocks but ran out",
                fresh);
  return true;
}

void BlockManager::commit(uint64_t seq, std::span<const int32_t> tokens, int64_t num_computed) {
  if (!prefix_caching_) return;
  auto it = seqs_.find(seq);
  LONGCTX_CHECK(it != seqs_.end(), ErrorCode::kInternal,
                "block manager: commit of sequence {} that holds no blocks", seq);
  SeqState& s = it->second;
  LONGCTX_CHECK(num_computed <= static_cast<int64_t>(tokens.size()) &&
                    blocks_for(num_computed) <= static_cast<int64_t>(s.blocks.size()),
                ErrorCode::kInternal,
                "block manager: sequence {} commits {} tokens of {} with {} blocks", seq,
                num_computed, tokens.size(), s.blocks.size());
  const int64_t full = num_computed / block_size_;
  for (auto i = static_cast<int64_t>(s.hashes.size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? 0 : s.hashes[i - 1];
    s.hashes.push_back(hash_block(parent, tokens.subspan(i * block_size_, block_size_)));
  }
  for (; s.num_cached_blocks < full; ++s.num_cached_blocks) {
    const int64_t i = s.num_cached_blocks;
    const uint64_t h = s.hashes[i];
    Block& b = blocks_[s.blocks[i]];
    // Another sequence may have cached the same prefix meanwhile: keep that one, this block
    // stays private (and goes to the free list when released).
    if (b.cached || by_hash_.count(h) != 0) continue;
    b.cached = true;
    b.hash = h;
    b.parent = i == 0 ? 0 : s.hashes[i - 1];
    auto blk = tokens.subspan(i * block_size_, block_size_);
    b.tokens.assign(blk.begin(), blk.end());
    by_hash_.emplace(h, s.blocks[i]);
  }
}

void BlockManager::free(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) release(*b);
  seqs_.erase(it);
}

void BlockManager::end_step() {
  for (int32_t id : pending_release_) release(id);
  pending_release_.clear();
}

void BlockManager::check_consistency() const {
  std::vector<int32_t> refs(blocks_.size(), 0);
  for (const auto& [id, s] : seqs_) {
    for (int32_t b : s.blocks) {
      LONGCTX_CHECK(b >= 0 && b < num_blocks(), ErrorCode::kInternal,
                    "block manager: sequence {} holds block {} outside the pool", id, b);
      ++refs[b];
    }
  }
  for (int32_t b : pending_release_) ++refs[b];
  std::vector<int> where(blocks_.size(), 0);  // 1 free list, 2 LRU
  for (int32_t b : free_) where[b] += 1;
  for (int32_t b : lru_) where[b] += 2;
  int64_t cached = 0;
  for (int64_t i = 0; i < num_blocks(); ++i) {
    const Block& b = blocks_[i];
    LONGCTX_CHECK(b.ref == refs[i], ErrorCode::kInternal,
                  "block manager: block {} has ref {} but {} holders", i, b.ref, refs[i]);
    const int expect = b.ref > 0 ? 0 : (b.cached ? 2 : 1);
    LONGCTX_CHECK(where[i] == expect, ErrorCode::kInternal,
                  "block manager: block {} (ref {}, cached {}) is in list {} not {}", i, b.ref,
                  b.cached, where[i], expect);
    if (b.cached) {
      ++cached;
      auto it = by_hash_.find(b.hash);
      LONGCTX_CHECK(it != by_hash_.end() && it->second == i, ErrorCode::kInternal,
                    "block manager: cached block {} is not under its hash", i);
      LONGCTX_CHECK(static_cast<int64_t>(b.tokens.size()) == block_size_, ErrorCode::kInternal,
                    "block manager: cached block {} keeps {} tokens", i, b.tokens.size());
    }
  }
  LONGCTX_CHECK(cached == static_cast<int64_t>(by_hash_.size()), ErrorCode::kInternal,
                "block manager: {} cached blocks but {} hashes", cached, by_hash_.size());
}

}  // namespace longctx
