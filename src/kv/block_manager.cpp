#include "kv/block_manager.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <unordered_set>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "longctx/core/error.h"

namespace longctx {

const char* kv_group_kind_name(KvGroupKind kind) {
  switch (kind) {
    case KvGroupKind::kFull:
      return "full";
    case KvGroupKind::kSlidingWindow:
      return "sliding_window";
    case KvGroupKind::kState:
      return "state";
  }
  return "?";
}

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching)
    : BlockManager(num_blocks, block_size, enable_prefix_caching, {KvGroupAlloc{}}) {}

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching,
                           std::vector<KvGroupAlloc> groups, int64_t num_state_slots,
                           int64_t num_snapshots, int64_t num_window_blocks)
    : block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      groups_(std::move(groups)),
      num_state_slots_(num_state_slots) {
  LONGCTX_CHECK(num_blocks > 0 && block_size > 0 && num_window_blocks >= 0 &&
                    num_blocks + num_window_blocks <= std::numeric_limits<int32_t>::max(),
                ErrorCode::kInvalidArgument,
                "block manager: {} blocks of {} tokens (both must be positive, blocks < 2^31)",
                num_blocks, block_size);
  LONGCTX_CHECK(!groups_.empty() && groups_.size() < 1024, ErrorCode::kInvalidArgument,
                "block manager: {} KV groups (1 to 1023)", groups_.size());
  for (const KvGroupAlloc& g : groups_) {
    LONGCTX_CHECK(g.kind != KvGroupKind::kSlidingWindow || g.window > 0,
                  ErrorCode::kInvalidArgument, "block manager: a sliding window of {} tokens",
                  g.window);
    has_state_ |= g.kind == KvGroupKind::kState;
  }
  LONGCTX_CHECK(!has_state_ ||
                    (num_state_slots > 0 && num_state_slots <= std::numeric_limits<int32_t>::max()),
                ErrorCode::kInvalidArgument,
                "block manager: a state group needs state slots, got {}", num_state_slots);
  num_main_blocks_ = num_blocks;
  blocks_.resize(num_blocks + num_window_blocks);
  for (const KvGroupAlloc& g : groups_)
    pool_of_.push_back(g.kind == KvGroupKind::kSlidingWindow && num_window_blocks > 0
                           ? BlockPool::kWindow
                           : BlockPool::kMain);
  free_[0].reserve(num_blocks);
  free_[1].reserve(num_window_blocks);
  // Popped from the back: lowest ids first, so small runs use a compact prefix of the pool.
  for (int64_t b = num_blocks; b-- > 0;) free_[0].push_back(static_cast<int32_t>(b));
  for (int64_t b = num_blocks + num_window_blocks; b-- > num_blocks;)
    free_[1].push_back(static_cast<int32_t>(b));
  for (int64_t s = has_state_ ? num_state_slots : 0; s-- > 0;)
    free_slots_.push_back(static_cast<int32_t>(s));
  by_hash_.resize(groups_.size());
  LONGCTX_CHECK(num_snapshots >= 0 && num_snapshots <= std::numeric_limits<int32_t>::max(),
                ErrorCode::kInvalidArgument, "block manager: {} state snapshots", num_snapshots);
  // Snapshots hang off group 0's blocks, so group 0 must be paged (a model with attention
  // layers: state groups come last).
  if (has_state_ && prefix_caching_ && paged(0)) num_snapshots_ = num_snapshots;
  snapshots_.resize(num_snapshots_);
  for (int64_t i = num_snapshots_; i-- > 0;) free_snapshots_.push_back(static_cast<int32_t>(i));
}

int64_t BlockManager::num_free_blocks() const {
  return num_free_blocks(BlockPool::kMain) + num_free_blocks(BlockPool::kWindow);
}

int64_t BlockManager::num_free_blocks(BlockPool pool) const {
  const int i = pool_index(pool);
  return static_cast<int64_t>(free_[i].size() + lru_[i].size());
}

int64_t BlockManager::max_blocks_held(int64_t tokens, int64_t step_tokens, BlockPool pool) const {
  int64_t n = 0;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const KvGroupAlloc& g = groups_[i];
    if (pool_of_[i] != pool) continue;
    if (g.kind == KvGroupKind::kFull) n += blocks_for(tokens);
    if (g.kind == KvGroupKind::kSlidingWindow)  // window - 1 earlier keys + the step, straddled
      n += std::min(blocks_for(tokens), blocks_for(g.window - 1 + step_tokens) + 1);
  }
  return n;
}

BlockManagerStats BlockManager::stats() const {
  BlockManagerStats s;
  s.num_blocks = num_blocks();
  s.used_blocks = num_blocks() - num_free_blocks();
  for (const auto& m : by_hash_) s.cached_blocks += static_cast<int64_t>(m.size());
  s.queries = queries_;
  s.hits = hits_;
  std::vector<std::unordered_set<int32_t>> held(groups_.size());
  for (const auto& [id, st] : seqs_)
    for (size_t g = 0; g < groups_.size(); ++g)
      for (int32_t b : st.groups[g].blocks)
        if (b != kNoBlock) held[g].insert(b);
  for (const auto& h : held) s.group_used_blocks.push_back(static_cast<int64_t>(h.size()));
  s.num_snapshots = num_snapshots_;
  s.snapshots_held = static_cast<int64_t>(snapshot_lru_.size());
  s.snapshot_restores = snapshot_restores_;
  return s;
}

std::span<const int32_t> BlockManager::table(uint64_t seq, int64_t group) const {
  auto it = seqs_.find(seq);
  LONGCTX_CHECK(it != seqs_.end() && group >= 0 && group < num_groups(), ErrorCode::kInternal,
                "block manager: sequence {} holds no blocks of group {}", seq, group);
  return it->second.groups[group].blocks;
}

void BlockManager::step_tables(uint64_t seq, int64_t end,
                               std::span<std::span<const int32_t>> out) const {
  LONGCTX_CHECK(static_cast<int64_t>(out.size()) == num_groups() - 1, ErrorCode::kInternal,
                "block manager: {} step tables asked of {} groups", out.size(), num_groups());
  const int64_t nb = blocks_for(end);
  for (int64_t g = 1; g < num_groups(); ++g) {
    const std::span<const int32_t> all = table(seq, g);
    out[g - 1] = groups_[g].kind == KvGroupKind::kState ? all : all.first(nb);
  }
}

uint64_t BlockManager::hash_block(uint64_t parent, std::span<const int32_t> tokens) const {
  return XXH64(tokens.data(), tokens.size_bytes(), parent);
}

int32_t BlockManager::lookup(int64_t g, uint64_t hash, uint64_t parent,
                             std::span<const int32_t> tokens) const {
  auto it = by_hash_[g].find(hash);
  if (it == by_hash_[g].end()) return -1;
  const Block& b = blocks_[it->second];
  if (b.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), b.tokens.begin(), b.tokens.end()))
    return -1;  // a hash collision: not the same prefix
  return it->second;
}

int32_t BlockManager::take_block(int32_t g) {
  int32_t id = -1;
  std::vector<int32_t>& free = free_[pool_index(pool_of_[g])];
  std::list<int32_t>& lru = lru_[pool_index(pool_of_[g])];
  if (!free.empty()) {
    id = free.back();
    free.pop_back();
  } else if (!lru.empty()) {
    id = lru.front();
    lru.pop_front();
    Block& b = blocks_[id];
    if (b.snapshot >= 0) drop_snapshot(b.snapshot);  // the state at its end goes with it
    by_hash_[b.group].erase(b.hash);
    if (record_events_ && b.group == 0) {
      if (events_.empty() || events_.back().kind != KvCacheEvent::Kind::kRemoved)
        events_.push_back({.kind = KvCacheEvent::Kind::kRemoved});
      events_.back().block_hashes.push_back(b.hash);
    }
    b.cached = false;
    b.tokens.clear();
  } else {
    return -1;
  }
  blocks_[id].ref = 1;
  blocks_[id].group = g;
  return id;
}

void BlockManager::acquire(int32_t id) {
  Block& b = blocks_[id];
  if (b.ref == 0) {
    LONGCTX_CHECK(b.cached, ErrorCode::kInternal, "block manager: acquiring free block {}", id);
    lru_[pool_index(pool_of_block(id))].erase(b.lru_pos);
  }
  ++b.ref;
}

void BlockManager::release(int32_t id) {
  Block& b = blocks_[id];
  LONGCTX_CHECK(b.ref > 0, ErrorCode::kInternal, "block manager: block {} released twice", id);
  if (--b.ref > 0) return;
  const int p = pool_index(pool_of_block(id));
  if (b.cached) {
    b.lru_pos = lru_[p].insert(lru_[p].end(), id);
  } else {
    free_[p].push_back(id);
  }
}

int64_t BlockManager::first_live_block(int64_t g, int64_t pos) const {
  if (groups_[g].kind != KvGroupKind::kSlidingWindow) return 0;
  return std::max<int64_t>(0, pos - groups_[g].window + 1) / block_size_;
}

void BlockManager::drop_out_of_window(SeqState& s, int64_t pos) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].kind != KvGroupKind::kSlidingWindow) continue;
    GroupTable& t = s.groups[g];
    const int64_t live =
        std::min<int64_t>(first_live_block(g, pos), static_cast<int64_t>(t.blocks.size()));
    for (; t.num_dropped < live; ++t.num_dropped) {
      int32_t& b = t.blocks[t.num_dropped];
      if (b != kNoBlock) release(b);
      b = kNoBlock;
    }
  }
}

void BlockManager::drop_snapshot(int32_t snapshot) {
  Snapshot& sn = snapshots_[snapshot];
  blocks_[sn.block].snapshot = -1;
  sn.block = -1;
  snapshot_lru_.erase(sn.lru_pos);
  free_snapshots_.push_back(snapshot);
}

void BlockManager::touch_snapshot(int32_t snapshot) {
  Snapshot& sn = snapshots_[snapshot];
  snapshot_lru_.splice(snapshot_lru_.end(), snapshot_lru_, sn.lru_pos);
}

int64_t BlockManager::snapshot_chunk(int64_t num_computed, int64_t n, int64_t total) const {
  if (!snapshots_enabled()) return n;
  const int64_t boundary = (num_computed + n) / block_size_ * block_size_;
  // A decode step (one token left) is never cut: its state is saved nowhere.
  if (total - num_computed <= 1 || boundary <= num_computed) return n;
  return boundary - num_computed;
}

int32_t BlockManager::reserve_snapshot(uint64_t seq, int64_t end, bool rolling) {
  if (!snapshots_enabled() || end <= 0 || end % block_size_ != 0) return -1;
  auto it = seqs_.find(seq);
  LONGCTX_CHECK(it != seqs_.end(), ErrorCode::kInternal,
                "block manager: snapshot for sequence {} that holds no blocks", seq);
  SeqState& s = it->second;
  const GroupTable& t = s.groups[0];
  const int64_t i = end / block_size_ - 1;
  LONGCTX_CHECK(s.pending_snapshot < 0 && i < static_cast<int64_t>(t.blocks.size()),
                ErrorCode::kInternal,
                "block manager: sequence {} reserves a snapshot at {} with {} blocks (pending {})",
                seq, end, t.blocks.size(), s.pending_snapshot);
  // A hit's own last block: its snapshot is where the sequence started from.
  if (cached_at(t, i) && blocks_[t.blocks[i]].snapshot >= 0) return -1;
  if (free_snapshots_.empty()) {
    if (snapshot_lru_.empty()) return -1;  // every slot reserved in this step
    drop_snapshot(snapshot_lru_.front());
  }
  s.pending_snapshot = free_snapshots_.back();
  s.pending_end = end;
  s.pending_rolling = rolling;
  free_snapshots_.pop_back();
  pending_seqs_.push_back(seq);
  return s.pending_snapshot;
}

bool BlockManager::cached_at(const GroupTable& t, int64_t i) const {
  return i < static_cast<int64_t>(t.blocks.size()) && t.blocks[i] != kNoBlock &&
         blocks_[t.blocks[i]].cached;
}

bool BlockManager::grow(GroupTable& t, int32_t g, int64_t n, int64_t first_write,
                        std::vector<KVBlockCopy>* copies) {
  if (cached_at(t, first_write)) {
    const int32_t src = t.blocks[first_write];
    const int32_t dst = take_block(g);
    if (dst < 0) return false;
    LONGCTX_CHECK(copies != nullptr, ErrorCode::kInternal,
                  "block manager: a copy-on-write needs a copy list");
    copies->push_back({src, dst});
    pending_release_.push_back(src);  // the sequence's reference, held until the copy ran
    t.blocks[first_write] = dst;
    t.num_cached_blocks = std::min<int64_t>(t.num_cached_blocks, first_write);
  }
  while (static_cast<int64_t>(t.blocks.size()) < n) {
    const int32_t id = take_block(g);
    if (id < 0) return false;
    t.blocks.push_back(id);
  }
  return true;
}

BlockManager::Start BlockManager::start(uint64_t seq, std::span<const int32_t> tokens,
                                        int64_t max_new, std::vector<KVBlockCopy>* copies) {
  LONGCTX_CHECK(!holds(seq), ErrorCode::kInternal, "block manager: sequence {} started twice", seq);
  const auto n = static_cast<int64_t>(tokens.size());
  const auto num_groups = static_cast<int64_t>(groups_.size());
  LONGCTX_CHECK(n > 0 && max_new > 0, ErrorCode::kInternal,
                "block manager: start with {} tokens, max_new {}", n, max_new);
  // The prompt's full blocks that some group has cached: hashes[i] and, per group, the hit.
  std::vector<uint64_t> hashes;
  std::vector<std::vector<int32_t>> found(num_groups);  // [groups][blocks] id or -1
  int64_t max_hit = 0;  // blocks: the full groups' common cached prefix
  if (prefix_caching_ && (!has_state_ || snapshots_enabled())) {
    uint64_t parent = 0;
    for (int64_t i = 0; (i + 1) * block_size_ <= n; ++i) {
      auto blk = tokens.subspan(i * block_size_, block_size_);
      const uint64_t h = hash_block(parent, blk);
      bool full_hit = true, any = false;
      for (int64_t g = 0; g < num_groups; ++g) {
        const int32_t id = lookup(g, h, parent, blk);
        found[g].push_back(id);
        any |= id >= 0;
        if (groups_[g].kind == KvGroupKind::kFull) full_hit &= id >= 0;
      }
      if (!full_hit || !any) break;
      hashes.push_back(h);
      parent = h;
      max_hit = i + 1;
    }
  }
  // The longest hit every sliding group can serve: each block its window needs at that point.
  // A state model's hit ends where a snapshot holds its state, before the last token (its state
  // cannot be rewound to recompute it).
  auto num_cached_at = [&](int64_t h) { return std::min(h * block_size_, n - 1); };
  int64_t num_hits = max_hit;
  for (; num_hits > 0; --num_hits) {
    const int64_t c = num_cached_at(num_hits);
    bool ok = !has_state_ ||
              (num_hits * block_size_ < n && blocks_[found[0][num_hits - 1]].snapshot >= 0);
    for (int64_t g = 0; g < num_groups && ok; ++g) {
      if (!paged(g)) continue;
      for (int64_t i = first_live_block(g, c); i < num_hits && ok; ++i) ok = found[g][i] >= 0;
    }
    if (ok) break;
  }
  Start r;
  r.num_cached = num_hits > 0 ? num_cached_at(num_hits) : 0;
  r.num_new = std::min(n - r.num_cached, max_new);
  if (has_state_) {
    // K/V cached past the last snapshot (another prompt went on from there): the first chunk
    // ends where the cached prefix does, so the state at that branch point is saved and the
    // prompts that share it next start from it.
    const int64_t kv_end = std::min(max_hit, (n - 1) / block_size_) * block_size_;
    if (kv_end > r.num_cached) r.num_new = std::min(r.num_new, kv_end - r.num_cached);
  }
  r.num_new = snapshot_chunk(r.num_cached, r.num_new, n);
  const int64_t need = blocks_for(r.num_cached + r.num_new);
  const int64_t first_write = r.num_cached / block_size_;
  const bool cow = first_write < num_hits;
  // Per pool; idle hits: acquiring them takes them off the free count.
  int64_t fresh[2] = {0, 0}, hits_idle[2] = {0, 0};
  for (int64_t g = 0; g < num_groups; ++g) {
    if (!paged(g)) continue;
    const int p = pool_index(pool_of_[g]);
    const int64_t lo = first_live_block(g, r.num_cached);
    for (int64_t i = lo; i < num_hits; ++i) hits_idle[p] += blocks_[found[g][i]].ref == 0 ? 1 : 0;
    fresh[p] += need - std::max(num_hits, lo) + (cow ? 1 : 0);
  }
  // A block may appear once only in a chain, so every hit is a distinct block.
  if (fresh[0] > num_free_blocks(BlockPool::kMain) - hits_idle[0] ||
      fresh[1] > num_free_blocks(BlockPool::kWindow) - hits_idle[1])
    return Start{};
  const int64_t slots = std::count_if(groups_.begin(), groups_.end(), [](const KvGroupAlloc& g) {
    return g.kind == KvGroupKind::kState;
  });
  if (slots > num_free_state_slots()) return Start{};
  SeqState& s = seqs_[seq];
  s.groups.resize(num_groups);
  hashes.resize(num_hits);
  s.hashes = std::move(hashes);
  for (int64_t g = 0; g < num_groups; ++g) {
    GroupTable& t = s.groups[g];
    if (!paged(g)) {
      t.blocks = {free_slots_.back()};
      free_slots_.pop_back();
      continue;
    }
    const int64_t lo = first_live_block(g, r.num_cached);
    t.blocks.assign(std::min(lo, need), kNoBlock);
    t.num_dropped = static_cast<int64_t>(t.blocks.size());
    for (int64_t i = lo; i < num_hits; ++i) {
      acquire(found[g][i]);
      t.blocks.push_back(found[g][i]);
    }
    t.num_cached_blocks = num_hits;
  }
  // Every group's hits are held before any group takes fresh blocks: a hit idle in the LRU list
  // would otherwise be evicted into another group's table and then also acquired as a hit.
  for (int64_t g = 0; g < num_groups; ++g) {
    if (!paged(g)) continue;
    const bool ok = grow(s.groups[g], static_cast<int32_t>(g), need, first_write, copies);
    LONGCTX_CHECK(ok, ErrorCode::kInternal, "block manager: counted {} free blocks but ran out",
                  fresh[0] + fresh[1]);
  }
  if (has_state_ && num_hits > 0) {
    r.restore_snapshot = blocks_[found[0][num_hits - 1]].snapshot;
    touch_snapshot(r.restore_snapshot);
    ++snapshot_restores_;
  }
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
  drop_out_of_window(s, num_computed);
  const int64_t need = blocks_for(num_computed + num_new);
  const int64_t first_write = num_computed / block_size_;
  int64_t fresh[2] = {0, 0};  // per pool
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!paged(g)) continue;
    const GroupTable& t = s.groups[g];
    fresh[pool_index(pool_of_[g])] +=
        std::max<int64_t>(0, need - static_cast<int64_t>(t.blocks.size())) +
        (cached_at(t, first_write) ? 1 : 0);
  }
  if (fresh[0] > num_free_blocks(BlockPool::kMain) ||
      fresh[1] > num_free_blocks(BlockPool::kWindow))
    return false;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!paged(g)) continue;
    const bool ok = grow(s.groups[g], static_cast<int32_t>(g), need, first_write, copies);
    LONGCTX_CHECK(ok, ErrorCode::kInternal, "block manager: counted {} free blocks but ran out",
                  fresh[0] + fresh[1]);
  }
  return true;
}

void BlockManager::commit(uint64_t seq, std::span<const int32_t> tokens, int64_t num_computed) {
  if (!prefix_caching_ || (has_state_ && !snapshots_enabled())) return;
  auto it = seqs_.find(seq);
  LONGCTX_CHECK(it != seqs_.end(), ErrorCode::kInternal,
                "block manager: commit of sequence {} that holds no blocks", seq);
  SeqState& s = it->second;
  const int64_t full = num_computed / block_size_;
  for (size_t g = 0; g < groups_.size(); ++g)
    LONGCTX_CHECK(num_computed <= static_cast<int64_t>(tokens.size()) &&
                      (!paged(g) ||
                       blocks_for(num_computed) <= static_cast<int64_t>(s.groups[g].blocks.size())),
                  ErrorCode::kInternal,
                  "block manager: sequence {} commits {} tokens of {} with {} blocks in group {}",
                  seq, num_computed, tokens.size(), s.groups[g].blocks.size(), g);
  for (auto i = static_cast<int64_t>(s.hashes.size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? 0 : s.hashes[i - 1];
    s.hashes.push_back(hash_block(parent, tokens.subspan(i * block_size_, block_size_)));
  }
  // Blocks registered one after another in group 0 extend one stored event (as vLLM's).
  int64_t last_stored = -2;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!paged(g)) continue;  // a state slot: its snapshot is tied to group 0's block below
    GroupTable& t = s.groups[g];
    for (; t.num_cached_blocks < full; ++t.num_cached_blocks) {
      const int64_t i = t.num_cached_blocks;
      if (t.blocks[i] == kNoBlock) continue;  // dropped before it was committed (a hit's gap)
      const uint64_t h = s.hashes[i];
      Block& b = blocks_[t.blocks[i]];
      // Another sequence may have cached the same prefix meanwhile: keep that one, this block
      // stays private (and goes to the free list when released).
      if (b.cached || by_hash_[g].count(h) != 0) continue;
      b.cached = true;
      b.hash = h;
      b.parent = i == 0 ? 0 : s.hashes[i - 1];
      auto blk = tokens.subspan(i * block_size_, block_size_);
      b.tokens.assign(blk.begin(), blk.end());
      by_hash_[g].emplace(h, t.blocks[i]);
      if (!record_events_ || g != 0) continue;
      if (last_stored != i - 1) {
        events_.push_back({.kind = KvCacheEvent::Kind::kStored});
        if (i > 0) events_.back().parent_block_hash = b.parent;
      }
      events_.back().block_hashes.push_back(h);
      events_.back().token_ids.insert(events_.back().token_ids.end(), blk.begin(), blk.end());
      events_.back().block_ids.push_back(t.blocks[i]);
      last_stored = i;
    }
  }
  if (s.pending_snapshot < 0) return;
  const int32_t snap = s.pending_snapshot;
  s.pending_snapshot = -1;
  LONGCTX_CHECK(s.pending_end == num_computed, ErrorCode::kInternal,
                "block manager: sequence {} reserved a snapshot at {} but committed {} tokens", seq,
                s.pending_end, num_computed);
  // The cached block ending at the boundary: this sequence's, or the same prefix's that another
  // sequence registered first (the state there is the same).
  const int64_t i = num_computed / block_size_ - 1;
  const int32_t id = lookup(0, s.hashes[i], i == 0 ? 0 : s.hashes[i - 1],
                            tokens.subspan(i * block_size_, block_size_));
  if (id < 0 || blocks_[id].snapshot >= 0) {
    free_snapshots_.push_back(snap);
    return;
  }
  blocks_[id].snapshot = snap;
  snapshots_[snap].block = id;
  snapshots_[snap].lru_pos = snapshot_lru_.insert(snapshot_lru_.end(), snap);
  if (!s.pending_rolling) return;
  // The previous rolling snapshot, unless the LRU took it meanwhile (and gave it to a block).
  const int32_t prev = s.rolling_snapshot;
  if (prev >= 0 && snapshots_[prev].block == s.rolling_block && s.rolling_block >= 0 &&
      blocks_[s.rolling_block].snapshot == prev)
    drop_snapshot(prev);
  s.rolling_snapshot = snap;
  s.rolling_block = id;
}

void BlockManager::truncate(uint64_t seq, int64_t num_tokens) {
  auto it = seqs_.find(seq);
  LONGCTX_CHECK(it != seqs_.end() && num_tokens >= 0, ErrorCode::kInternal,
                "block manager: truncate sequence {} to {} tokens", seq, num_tokens);
  SeqState& s = it->second;
  const int64_t keep = blocks_for(num_tokens);
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!paged(g)) continue;
    GroupTable& t = s.groups[g];
    LONGCTX_CHECK(t.num_cached_blocks <= std::max<int64_t>(keep, num_tokens / block_size_),
                  ErrorCode::kInternal,
                  "block manager: sequence {} truncated to {} tokens below its {} committed blocks",
                  seq, num_tokens, t.num_cached_blocks);
    while (static_cast<int64_t>(t.blocks.size()) > keep) {
      if (t.blocks.back() != kNoBlock) release(t.blocks.back());
      t.blocks.pop_back();
    }
  }
}

void BlockManager::free(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  if (it->second.pending_snapshot >= 0) free_snapshots_.push_back(it->second.pending_snapshot);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<int32_t>& blocks = it->second.groups[g].blocks;
    if (!paged(g)) {
      free_slots_.push_back(blocks[0]);
      continue;
    }
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b)
      if (*b != kNoBlock) release(*b);
  }
  seqs_.erase(it);
}

void BlockManager::end_step() {
  for (int32_t id : pending_release_) release(id);
  pending_release_.clear();
  // A failed step saved no state: its reservations go back (a committed one was cleared).
  for (uint64_t seq : pending_seqs_) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end() || it->second.pending_snapshot < 0) continue;
    free_snapshots_.push_back(it->second.pending_snapshot);
    it->second.pending_snapshot = -1;
  }
  pending_seqs_.clear();
}

int64_t BlockManager::cached_prefix(std::span<const int32_t> tokens,
                                    std::vector<uint64_t>* hashes) const {
  hashes->clear();
  int64_t hits = 0;
  uint64_t parent = 0;
  for (int64_t i = 0; (i + 1) * block_size_ <= static_cast<int64_t>(tokens.size()); ++i) {
    auto blk = tokens.subspan(i * block_size_, block_size_);
    const uint64_t h = hash_block(parent, blk);
    if (hits == i && prefix_caching_ && !has_state_ && lookup(0, h, parent, blk) >= 0) ++hits;
    hashes->push_back(h);
    parent = h;
  }
  return hits;
}

// A block whose K/V came from outside (the KV store) joins the prefix cache under hash `h`, with a
// BlockStored event marked imported.
void BlockManager::cache_imported(int32_t id, uint64_t h, uint64_t parent,
                                  std::span<const int32_t> tokens) {
  Block& b = blocks_[id];
  b.cached = true;
  b.hash = h;
  b.parent = parent;
  b.tokens.assign(tokens.begin(), tokens.end());
  by_hash_[0].emplace(h, id);
  if (record_events_) {
    KvCacheEvent e{.kind = KvCacheEvent::Kind::kStored};
    if (parent != 0) e.parent_block_hash = parent;
    e.block_hashes = {h};
    e.token_ids.assign(tokens.begin(), tokens.end());
    e.block_ids = {id};
    e.imported = true;
    events_.push_back(std::move(e));
  }
}

int32_t BlockManager::import_block(uint64_t parent, std::span<const int32_t> tokens, int64_t keep) {
  LONGCTX_CHECK(groups_.size() == 1 && !has_state_ && prefix_caching_ &&
                    static_cast<int64_t>(tokens.size()) == block_size_,
                ErrorCode::kInternal,
                "block manager: importing a block needs one KV group, prefix caching and a "
                "full block");
  const uint64_t h = hash_block(parent, tokens);
  // Taking a block evicts the least recently used cached one when no uncached block is free;
  // `keep` counts the blocks the caller imported just before (the most recent of the LRU),
  // which must not be the one evicted.
  if (by_hash_[0].count(h) != 0 || num_free_blocks(BlockPool::kMain) <= keep) return -1;
  const int32_t id = take_block(0);
  if (id < 0) return -1;
  cache_imported(id, h, parent, tokens);
  release(id);  // ref 0: to the LRU's most recent end
  return id;
}

int32_t BlockManager::take_pinned() {
  LONGCTX_CHECK(groups_.size() == 1 && !has_state_ && prefix_caching_, ErrorCode::kInternal,
                "block manager: importing a block needs one KV group and prefix caching");
  const int32_t id = take_block(0);  // ref 1: the pin's
  if (id >= 0) pinned_.insert(id);
  return id;
}

bool BlockManager::cache_pinned(int32_t id, uint64_t parent, std::span<const int32_t> tokens) {
  LONGCTX_CHECK(pinned_.count(id) != 0 && !blocks_[id].cached &&
                    static_cast<int64_t>(tokens.size()) == block_size_,
                ErrorCode::kInternal,
                "block manager: caching block {}, which is not a pinned uncached block, or a "
                "block of {} tokens",
                id, tokens.size());
  const uint64_t h = hash_block(parent, tokens);
  if (by_hash_[0].count(h) != 0) return false;
  cache_imported(id, h, parent, tokens);
  return true;
}

void BlockManager::unpin(int32_t id) {
  const auto it = pinned_.find(id);
  LONGCTX_CHECK(it != pinned_.end(), ErrorCode::kInternal, "block manager: block {} is not pinned",
                id);
  pinned_.erase(it);
  release(id);
}

void BlockManager::record_events(bool on) {
  record_events_ = on;
  if (!on) events_.clear();
}

std::vector<KvCacheEvent> BlockManager::take_events() {
  std::vector<KvCacheEvent> out;
  out.swap(events_);
  return out;
}

std::vector<uint64_t> BlockManager::cached_hashes() const {
  std::vector<uint64_t> out;
  out.reserve(by_hash_[0].size());
  for (const auto& [h, id] : by_hash_[0]) out.push_back(h);
  std::sort(out.begin(), out.end());
  return out;
}

void BlockManager::check_consistency() const {
  std::vector<int32_t> refs(blocks_.size(), 0);
  std::vector<int32_t> slot_holders(num_state_slots_, 0);
  for (const auto& [id, s] : seqs_) {
    LONGCTX_CHECK(s.groups.size() == groups_.size(), ErrorCode::kInternal,
                  "block manager: sequence {} has {} group tables of {}", id, s.groups.size(),
                  groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      const GroupTable& t = s.groups[g];
      if (!paged(g)) {
        LONGCTX_CHECK(t.blocks.size() == 1 && t.blocks[0] >= 0 && t.blocks[0] < num_state_slots_,
                      ErrorCode::kInternal, "block manager: sequence {} has a bad state slot", id);
        ++slot_holders[t.blocks[0]];
        continue;
      }
      for (size_t i = 0; i < t.blocks.size(); ++i) {
        const int32_t b = t.blocks[i];
        const bool dropped = static_cast<int64_t>(i) < t.num_dropped;
        LONGCTX_CHECK(dropped == (b == kNoBlock), ErrorCode::kInternal,
                      "block manager: sequence {} group {} entry {} is {} (dropped up to {})", id,
                      g, i, b, t.num_dropped);
        if (dropped) continue;
        LONGCTX_CHECK(b >= 0 && b < num_blocks(), ErrorCode::kInternal,
                      "block manager: sequence {} holds block {} outside the pool", id, b);
        LONGCTX_CHECK(
            blocks_[b].group == static_cast<int32_t>(g) && pool_of_block(b) == pool_of_[g],
            ErrorCode::kInternal,
            "block manager: block {} of group {} is held by group {} (or is not of its "
            "pool)",
            b, blocks_[b].group, g);
        ++refs[b];
      }
    }
  }
  for (int32_t b : pending_release_) ++refs[b];
  for (int32_t b : pinned_) ++refs[b];
  for (int32_t slot : free_slots_) ++slot_holders[slot];
  for (int64_t i = 0; i < num_state_slots_; ++i)
    LONGCTX_CHECK(slot_holders[i] == 1, ErrorCode::kInternal,
                  "block manager: state slot {} has {} holders (free list included)", i,
                  slot_holders[i]);
  std::vector<int> where(blocks_.size(), 0);  // 1 free list, 2 LRU
  for (int p = 0; p < 2; ++p) {
    for (int32_t b : free_[p]) where[b] += pool_index(pool_of_block(b)) == p ? 1 : 4;
    for (int32_t b : lru_[p]) where[b] += pool_index(pool_of_block(b)) == p ? 2 : 4;
  }
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
      const auto& m = by_hash_[b.group];
      auto it = m.find(b.hash);
      LONGCTX_CHECK(it != m.end() && it->second == i, ErrorCode::kInternal,
                    "block manager: cached block {} is not under its hash", i);
      LONGCTX_CHECK(static_cast<int64_t>(b.tokens.size()) == block_size_, ErrorCode::kInternal,
                    "block manager: cached block {} keeps {} tokens", i, b.tokens.size());
    }
  }
  int64_t hashes = 0;
  for (const auto& m : by_hash_) hashes += static_cast<int64_t>(m.size());
  LONGCTX_CHECK(cached == hashes, ErrorCode::kInternal,
                "block manager: {} cached blocks but {} hashes", cached, hashes);
  // Every snapshot slot is free, reserved by one live sequence, or tied to one cached block of
  // group 0 (and then in the LRU list).
  std::vector<int32_t> snapshot_holders(snapshots_.size(), 0);
  for (int32_t sn : free_snapshots_) ++snapshot_holders[sn];
  for (const auto& [id, s] : seqs_)
    if (s.pending_snapshot >= 0) ++snapshot_holders[s.pending_snapshot];
  for (int32_t sn : snapshot_lru_) {
    ++snapshot_holders[sn];
    const int32_t b = snapshots_[sn].block;
    LONGCTX_CHECK(b >= 0 && blocks_[b].cached && blocks_[b].group == 0 &&
                      blocks_[b].snapshot == sn && *snapshots_[sn].lru_pos == sn,
                  ErrorCode::kInternal, "block manager: snapshot {} is not tied to its block {}",
                  sn, b);
  }
  for (size_t sn = 0; sn < snapshots_.size(); ++sn)
    LONGCTX_CHECK(snapshot_holders[sn] == 1, ErrorCode::kInternal,
                  "block manager: snapshot {} has {} holders (free list included)", sn,
                  snapshot_holders[sn]);
  for (int64_t i = 0; i < num_blocks(); ++i) {
    const int32_t sn = blocks_[i].snapshot;
    LONGCTX_CHECK(sn < 0 || (sn < static_cast<int32_t>(snapshots_.size()) &&
                             snapshots_[sn].block == i && blocks_[i].cached),
                  ErrorCode::kInternal, "block manager: block {} names snapshot {}", i, sn);
  }
}

}  // namespace longctx
