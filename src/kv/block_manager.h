// The KV block manager: which KV blocks each sequence holds, shared blocks by reference count,
// and the prefix cache (as vLLM's v1 KVCacheManager, over full blocks).
//
// Block ids name blocks of an executor's KV pool (PagedKVPool on the GPU or the CPU); this class
// only does the bookkeeping, so it is plain C++ and tested without a model.
//
// Prefix cache. A full block is identified by a hash chain: h_i = xxhash64(tokens of block i,
// seed h_{i-1}), h_{-1} = 0, and a cached block keeps its tokens so a hash collision can never
// hand a sequence the wrong K/V. When a sequence's block becomes full (its K/V all computed)
// it is registered under its hash; from then on it is immutable. A new (or preempted) sequence
// looks its prompt up block by block and holds every hit with a reference. Blocks whose count
// drops to zero stay cached (evictable, least recently used first) until a fresh block is needed
// and no uncached free block is left.
//
// Copy-on-write. At least one token must be computed to get logits, so when every block of a
// prompt hits, the last token is recomputed: its K/V would be written into a cached (shared,
// immutable) block. The sequence then gets a fresh block, and the step copies the cached one
// into it first (KVBlockCopy) before anything is written. The source keeps a reference until the
// next step begins (end_step), so no allocation in the same step can reuse it before the copy.
//
// KV groups (attention/kv_groups.h). Each group of layers has its own block table per sequence;
// block ids of every paged group come from one shared pool (as vLLM's hybrid allocator: a block
// is used by one group at a time, on that group's layers), and the prefix cache is kept per
// group (a hit is a block of that group). A sliding-window group drops the blocks wholly before
// the window as the sequence advances (their table entries become kNoBlock; with prefix caching
// they stay cached and evictable); a prefix hit is taken only up to where every sliding group
// still has each block the window needs, so a hit never changes what attention reads. A state
// group (linear attention / SSM) holds one state slot per sequence (its table is that slot).
//
// State snapshots. A state group's state cannot be rebuilt from blocks, so a prefix hit of a
// state model needs the state as it was at the hit's last token. The manager keeps a pool of
// snapshot slots (the executor's storage): a step whose prefill chunk ends on a block boundary
// reserves one (reserve_snapshot), the executor copies the sequence's state into it after the
// step, and commit() ties it to the group-0 block that ends at that boundary. A decode step that
// ends on a boundary reserves a rolling one: tying it releases the sequence's previous rolling
// snapshot, so a sequence holds one beyond its prompt's, and a finished one leaves the state at
// its last full block for a follow-up turn (prompt + answer + more) to start from. A new sequence's
// hit is cut back to the last hit block that has a snapshot (and leaves at least one token to
// compute: a state cannot be rewound, so a hit never ends on the prompt's last token and no
// copy-on-write happens); Start::restore_snapshot names the snapshot the executor copies into
// the sequence's state slot before the step. A snapshot lives as long as its block stays cached:
// evicting the block frees it; when the pool is full, reserving takes the least recently used
// snapshot (created or restored) from its block, which stays cached as K/V only. When a prompt's
// K/V hit goes past its last snapshot, its first chunk stops where the K/V hit ends, so the state
// at that branch point is saved for the prompts that share it next. A state model
// without snapshot slots takes no prefix hits. Chunks are cut so that they end on boundaries
// (snapshot_chunk): see docs/architecture.md (KV groups) for the choice and its memory cost.
//
// Window pool. With KV offload the full group's blocks live in the host pool (the GPU caches
// some of them), while a sliding group's blocks are bounded by its window and stay resident on
// the GPU: giving them host ids would make the GPU's resident pool as large as the host pool.
// So a manager built with num_window_blocks > 0 keeps a second pool: sliding groups take ids
// [num_blocks, num_blocks + num_window_blocks) from it, every other paged group takes ids
// [0, num_blocks), each pool with its own free list and LRU (a prefix hit of a sliding group is
// a block of the window pool, evicted only to make room there).
//
// Events. With record_events(true) every change of the prefix cache of group 0 (the group
// routers index; every group caches the same prefixes) is recorded as a KvCacheEvent: a block
// registered under its hash is stored, an evicted one removed. take_events() hands them over.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/kv_cache_event.h"
#include "longctx/kv/block_copy.h"
#include "longctx/kv/kv_group_kind.h"

namespace longctx {

struct BlockManagerStats {
  int64_t num_blocks = 0;
  int64_t used_blocks = 0;                 // held by at least one sequence
  int64_t cached_blocks = 0;               // registered in the prefix cache (used or evictable)
  int64_t queries = 0;                     // prompt tokens looked up
  int64_t hits = 0;                        // of those, tokens whose K/V were found cached
  std::vector<int64_t> group_used_blocks;  // [groups] blocks (state slots) held, per group
  int64_t num_snapshots = 0;               // state snapshot slots
  int64_t snapshots_held = 0;              // of those, tied to a cached block
  int64_t snapshot_restores = 0;           // prefix hits that started from a snapshot
};

// A block table entry a sliding window dropped (or a prefix hit did not need).
inline constexpr int32_t kNoBlock = -1;

class BlockManager {
 public:
  // One full-attention group. Throws Error(kInvalidArgument) for non-positive sizes.
  BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching);
  // `groups` in the order of attention/kv_groups.h (group 0 first); num_state_slots: sequences
  // that may hold state at once (> 0 when a group is kState); num_snapshots: state snapshot
  // slots for prefix hits of a state model (ignored without a state group or prefix caching).
  // num_window_blocks: the window pool's blocks (sliding groups' ids, above); 0: one pool.
  BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching,
               std::vector<KvGroupAlloc> groups, int64_t num_state_slots = 0,
               int64_t num_snapshots = 0, int64_t num_window_blocks = 0);

  int64_t num_groups() const { return static_cast<int64_t>(groups_.size()); }
  const KvGroupAlloc& group(int64_t g) const { return groups_[g]; }
  // Blocks a sequence of `tokens` tokens holds at most in `pool`, all its groups together, when a
  // step runs at most `step_tokens` of its tokens (the window, the step and a straddled block).
  int64_t max_blocks_held(int64_t tokens, int64_t step_tokens,
                          BlockPool pool = BlockPool::kMain) const;
  // The pool a group's blocks come from.
  BlockPool pool_of(int64_t group) const { return pool_of_[group]; }
  // Blocks of a pool (kMain: ids [0, n); kWindow: ids [num_blocks(kMain), ...)).
  int64_t pool_blocks(BlockPool pool) const {
    return pool == BlockPool::kMain ? num_main_blocks_
                                    : static_cast<int64_t>(blocks_.size()) - num_main_blocks_;
  }
  int64_t num_free_state_slots() const { return static_cast<int64_t>(free_slots_.size()); }
  // A state model whose prefixes are cached with state snapshots.
  bool snapshots_enabled() const { return num_snapshots_ > 0; }
  int64_t num_free_snapshots() const { return static_cast<int64_t>(free_snapshots_.size()); }

  int64_t block_size() const { return block_size_; }
  // Every block id, both pools.
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  bool prefix_caching() const { return prefix_caching_; }
  // Blocks a new allocation can take: uncached free ones plus evictable cached ones (both pools).
  int64_t num_free_blocks() const;
  int64_t num_free_blocks(BlockPool pool) const;
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  BlockManagerStats stats() const;

  // Whether `seq` holds blocks (was allocated and not freed since).
  bool holds(uint64_t seq) const { return seqs_.count(seq) != 0; }
  // The blocks of `seq` in group `group`, in token order (block i holds tokens
  // [i * block_size, (i + 1) * block_size)); kNoBlock where a sliding window dropped one. A state
  // group's table is its one state slot.
  std::span<const int32_t> table(uint64_t seq, int64_t group = 0) const;
  // What a step that ends at token `end` reads of `seq` in groups 1..G-1, into out[G - 1]: a
  // state group's slot whole, the others' tables cut to blocks_for(end) (nothing with one group).
  void step_tables(uint64_t seq, int64_t end, std::span<std::span<const int32_t>> out) const;

  // Starts a sequence that holds nothing: looks its tokens up in the prefix cache (at most
  // tokens.size() - 1 of them count as computed), then takes blocks for the cached tokens and
  // num_new = min(tokens.size() - num_cached, max_new) more. num_cached is -1 when there are
  // not enough free blocks (nothing changes then). A copy-on-write goes to `copies`.
  // With snapshots, num_new is cut as snapshot_chunk() cuts it.
  struct Start {
    int64_t num_cached = -1;  // -1: not enough blocks
    int64_t num_new = 0;
    int32_t restore_snapshot = -1;  // a state model's hit: the snapshot its state starts from
  };
  Start start(uint64_t seq, std::span<const int32_t> tokens, int64_t max_new,
              std::vector<KVBlockCopy>* copies);
  // Makes room for tokens [num_computed, num_computed + num_new) of a sequence that holds
  // blocks, after dropping the blocks its sliding groups no longer need (those stay dropped).
  // False (and nothing else changes) when the free blocks do not suffice.
  bool append(uint64_t seq, int64_t num_computed, int64_t num_new,
              std::vector<KVBlockCopy>* copies);
  // With snapshots: how many of the `n` tokens after `num_computed` (of `total`) a prefill step
  // runs so that it ends on a block boundary: a chunk cut short is cut back to its last boundary,
  // and a prompt's last chunk runs up to its last boundary first (the tail in the next step), so
  // the state there can be saved. n itself when no boundary is crossed, or without snapshots.
  int64_t snapshot_chunk(int64_t num_computed, int64_t n, int64_t total) const;
  // A snapshot slot for the state of `seq` after a step ending at `end` (a block boundary past
  // its hit), which the executor fills after the step and commit() ties to the block ending
  // there; -1 (nothing reserved) without snapshots, off a boundary, or when that block has one.
  // Reserving may take the least recently used snapshot from its block. `rolling`: a decode
  // step's (see above).
  int32_t reserve_snapshot(uint64_t seq, int64_t end, bool rolling = false);
  // After a step computed K/V up to `num_computed` tokens: registers the blocks that became
  // full in the prefix cache (their tokens are tokens[block * block_size, ...)) and ties the
  // sequence's reserved snapshot to its block.
  void commit(uint64_t seq, std::span<const int32_t> tokens, int64_t num_computed);
  // Speculative decoding's rollback: the sequence keeps the blocks of its first `num_tokens`
  // tokens in every paged group and releases the rest (blocks taken for rejected draft tokens).
  // Nothing past `num_tokens` may have been committed.
  void truncate(uint64_t seq, int64_t num_tokens);
  // Drops every block the sequence holds (tail first, so the prefix stays cached longest) and its
  // state slot and reserved snapshot. Unknown ids are ignored.
  void free(uint64_t seq);
  // Releases the sources of this step's copies and the snapshots reserved for a step that did
  // not commit them (call once the step ran or failed).
  void end_step();

  // The chain hashes of the full blocks of `tokens` (group 0's scheme), and how many leading
  // ones are cached.
  int64_t cached_prefix(std::span<const int32_t> tokens, std::vector<uint64_t>* hashes) const;
  // Registers a block whose K/V come from elsewhere (a KV store) as cached and evictable, under
  // the chain hash of `tokens` after `parent`, when a block can be taken with more than `keep`
  // blocks free before (blocks imported just before stay). Returns its id (the caller writes
  // its K/V before the next step), or -1 (nothing changed). One KV group, prefix caching on.
  int32_t import_block(uint64_t parent, std::span<const int32_t> tokens, int64_t keep);
  // An asynchronous import's blocks (one KV group, prefix caching on): take_pinned() takes a
  // block for writing (evicting the least recently used cached one when no uncached block is
  // free) and holds it pinned, out of every sequence and of eviction, while its K/V arrive; -1
  // when none can be taken. cache_pinned() registers a pinned block under the chain hash of
  // `tokens` after `parent` (it stays pinned); false when that hash is cached already (the
  // caller unpins it). unpin() drops the pin: a cached block becomes evictable, another one free.
  int32_t take_pinned();
  bool cache_pinned(int32_t id, uint64_t parent, std::span<const int32_t> tokens);
  void unpin(int32_t id);
  int64_t num_pinned() const { return static_cast<int64_t>(pinned_.size()); }

  // Records prefix-cache transitions of group 0 from now on (false: stops and drops any).
  void record_events(bool on);
  // The transitions recorded since the last call, in order.
  std::vector<KvCacheEvent> take_events();
  // The chain hashes of group 0's cached blocks (used or evictable), sorted. For tests.
  std::vector<uint64_t> cached_hashes() const;

  // Checks every invariant (reference counts equal the tables' references, free lists and the
  // hash table consistent); throws Error(kInternal) naming the first broken one. For tests.
  void check_consistency() const;

 private:
  void cache_imported(int32_t id, uint64_t h, uint64_t parent, std::span<const int32_t> tokens);
  struct Block {
    int32_t ref = 0;
    bool cached = false;  // registered under `hash`
    uint64_t hash = 0;
    uint64_t parent = 0;          // hash of the previous block of its chain (0 for the first)
    int32_t group = 0;            // the group it was taken for (its cache map, when cached)
    std::vector<int32_t> tokens;  // [block_size] when cached
    std::list<int32_t>::iterator lru_pos;  // valid while cached with ref == 0
    int32_t snapshot = -1;                 // group 0, cached: the state snapshot at its end
  };
  struct Snapshot {
    int32_t block = -1;                    // the cached block it belongs to (-1: free/reserved)
    std::list<int32_t>::iterator lru_pos;  // valid while tied to a block
  };
  struct GroupTable {
    std::vector<int32_t> blocks;    // block ids (kNoBlock: dropped); a state group: {slot}
    int64_t num_cached_blocks = 0;  // leading blocks registered (or hit) in the prefix cache
    int64_t num_dropped = 0;        // leading entries a sliding window dropped
  };
  struct SeqState {
    std::vector<GroupTable> groups;  // [groups]
    std::vector<uint64_t> hashes;    // chain hash of each of its full (computed) blocks
    int32_t pending_snapshot = -1;   // reserved for the state at pending_end (this step)
    int64_t pending_end = 0;
    bool pending_rolling = false;   // the reservation is a decode step's
    int32_t rolling_snapshot = -1;  // the last rolling snapshot it tied, to rolling_block
    int32_t rolling_block = -1;
  };

  bool paged(int64_t g) const { return groups_[g].kind != KvGroupKind::kState; }
  // The first block a sliding group still needs when queries start at position `pos` (keys at
  // positions > pos - window); 0 for a full group.
  int64_t first_live_block(int64_t g, int64_t pos) const;
  // Releases the blocks of sliding groups wholly before the window at `pos`.
  void drop_out_of_window(SeqState& s, int64_t pos);
  // Takes one block for writing in group g: an uncached free block, else the least recently used
  // cached one (dropping it from the cache). -1 when none.
  int32_t take_block(int32_t g);
  BlockPool pool_of_block(int32_t id) const {
    return id < num_main_blocks_ ? BlockPool::kMain : BlockPool::kWindow;
  }
  static int pool_index(BlockPool pool) { return pool == BlockPool::kMain ? 0 : 1; }
  void acquire(int32_t block);  // ref++ (leaving the LRU if it was there)
  void release(int32_t block);  // ref--; at 0 to the LRU (cached) or the free list
  // The block holding tokens with this chain hash and these tokens, or -1.
  int32_t lookup(int64_t g, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const;
  uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens) const;
  // Unties a snapshot from its block and returns it to the free list.
  void drop_snapshot(int32_t snapshot);
  // Marks a snapshot most recently used.
  void touch_snapshot(int32_t snapshot);
  // Whether group g's block at index i is cached (a copy-on-write target when written).
  bool cached_at(const GroupTable& t, int64_t i) const;
  // Gives group g of a sequence fresh blocks until it has `n`; copy-on-write of the block at index
  // `first_write` when it is cached. False (undoing nothing: callers check counts first) when out
  // of blocks.
  bool grow(GroupTable& t, int32_t g, int64_t n, int64_t first_write,
            std::vector<KVBlockCopy>* copies);

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<KvGroupAlloc> groups_;
  bool has_state_ = false;     // a kState group (prefix hits need snapshots then)
  std::vector<Block> blocks_;  // [num_blocks + num_window_blocks]
  int64_t num_main_blocks_ = 0;
  std::vector<BlockPool> pool_of_;   // [groups]
  std::vector<int32_t> free_[2];     // per pool: uncached, ref 0 (popped from the back)
  std::list<int32_t> lru_[2];        // per pool: cached, ref 0, least recent first
  std::vector<int32_t> free_slots_;  // state slots no sequence holds
  int64_t num_state_slots_ = 0;
  int64_t num_snapshots_ = 0;            // 0: a state model takes no prefix hits
  std::vector<Snapshot> snapshots_;      // [num_snapshots]
  std::vector<int32_t> free_snapshots_;  // neither tied to a block nor reserved
  std::list<int32_t> snapshot_lru_;      // tied to a block, least recently used first
  std::vector<uint64_t> pending_seqs_;   // sequences that reserved a snapshot this step
  int64_t snapshot_restores_ = 0;
  // [groups] chain hash -> cached block of that group
  std::vector<std::unordered_map<uint64_t, int32_t>> by_hash_;
  std::unordered_map<uint64_t, SeqState> seqs_;
  std::vector<int32_t> pending_release_;     // copy sources held until end_step()
  std::unordered_multiset<int32_t> pinned_;  // take_pinned()'s blocks (a reference each)
  int64_t queries_ = 0, hits_ = 0;
  bool record_events_ = false;
  std::vector<KvCacheEvent> events_;
};

}  // namespace longctx
