// Block placement for a KV cache offloaded to host memory: which of the engine's blocks are on
// the GPU, and what one step must move and read. Host logic only, shared by the CUDA offload
// device and the CPU simulation that tests it in CI.
//
// The engine's block ids are host blocks: every block has a copy slot in the host pool. A GPU
// cache of num_gpu_blocks holds some of them "resident" (read in place, written by the step's
// new tokens). Per step:
//  - blocks that receive new tokens (and the partial last block) must be resident; a block whose
//    earlier rows are only on the host is loaded first;
//  - every other block of a sequence is read in place when resident, else streamed from the host
//    through a ring of GPU slots (RingItem: up to slot_blocks blocks of one layer per slot, the
//    same list for every layer);
//  - a block filled in this step is written back to the host after the step (write-through), so
//    a full block is always clean once its write-back lands and can be evicted for free; a
//    partial dirty block is written back only when evicted;
//  - eviction is LRU over blocks no sequence of the step uses.
// Write-backs carry tickets (one per batch of copies); the device reports when a ticket's copies
// landed, and the plan names the tickets loads and GPU-block reuse must wait for.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <vector>

#include "longctx/attention/forward_batch.h"
#include "longctx/kv/block_copy.h"

namespace longctx {

struct OffloadGeometry {
  int64_t num_layers = 0;
  int64_t block_size = 0;       // tokens per block
  int64_t num_host_blocks = 0;  // the engine's block ids
  int64_t num_gpu_blocks = 0;   // the GPU cache
  int64_t num_slots = 0;        // ring slots
  int64_t slot_blocks = 0;      // blocks of one layer per slot
};

// One block of every layer between the host pool and the GPU cache.
struct BlockMove {
  int32_t host = -1;
  int32_t gpu = -1;
};

// Host blocks [host_begin, host_begin + count) of one layer into slot blocks [slot_begin, ...).
struct SlotRun {
  int32_t host_begin = 0;
  int32_t count = 0;
  int32_t slot_begin = 0;
};

// Attention of batch sequences [seq_begin, seq_end) over the host blocks of one ring slot (not
// causal: every host block precedes the step's new tokens). Rows and tables are local: query
// row r is the batch's row row_begin + r; kv_indices are slot blocks.
struct RingItem {
  int32_t seq_begin = 0, seq_end = 0;
  int32_t row_begin = 0, row_end = 0;
  std::vector<int32_t> qo_indptr;   // [n + 1] local rows
  std::vector<int32_t> kv_indptr;   // [n + 1]
  std::vector<int32_t> kv_indices;  // slot blocks in [0, slot_blocks)
  std::vector<int32_t> kv_lens;     // [n] (whole blocks)
  std::vector<SlotRun> runs;        // what to load, coalesced
  int32_t num_slot_blocks = 0;      // distinct blocks loaded
  bool all_decode = true;           // every sequence has one query row
};

struct OffloadStepPlan {
  uint64_t step = 0;
  // In-place attention over resident blocks, the new tokens included (causal by position: the
  // host blocks a sequence skips here all precede its new tokens). Per batch sequence s:
  std::vector<int32_t> qo_indptr;   // [S + 1] the batch's
  std::vector<int32_t> kv_indptr;   // [S + 1]
  std::vector<int32_t> kv_indices;  // GPU blocks
  std::vector<int32_t> kv_lens;     // [S]
  std::vector<int64_t> slots;       // [T] GPU block * block_size + offset of each new token
  std::vector<RingItem> items;      // per layer, in this order

  // Before the first layer, in this order: write-back of evicted dirty blocks (ticket
  // evict_write_back_ticket), copy-on-write GPU -> GPU, loads host -> GPU (of all layers).
  std::vector<BlockMove> evict_write_backs;
  uint64_t evict_write_back_ticket = 0;
  std::vector<std::pair<int32_t, int32_t>> gpu_copies;  // (src, dst) GPU blocks
  std::vector<BlockMove> loads;
  // After the last layer: blocks filled in this step, host <- GPU (ticket write_back_ticket).
  std::vector<BlockMove> write_backs;
  uint64_t write_back_ticket = 0;
  // The ticket (0: none) the ring's and the pre-step loads must wait for (host copies in
  // flight), and the one the step's compute must wait for before it overwrites GPU blocks whose
  // previous content is still being copied out.
  uint64_t load_wait_ticket = 0;
  uint64_t compute_wait_ticket = 0;

  int64_t host_blocks_read = 0;      // per layer, through the ring
  int64_t resident_blocks_read = 0;  // per layer, in place (new-token blocks included)
};

class OffloadPlanner {
 public:
  // Throws Error(kInvalidArgument) for a non-positive size.
  explicit OffloadPlanner(const OffloadGeometry& geometry);

  const OffloadGeometry& geometry() const { return g_; }
  // Plans one step over `batch` (block tables of host block ids) after the engine's copies
  // (copy-on-write, run before the step). `ticket_done(t)`: write-back ticket t has landed.
  // Throws Error(kOutOfMemory) when the step's required blocks exceed the GPU cache, and
  // Error(kInternal) if a block's rows are nowhere (a bug, never silent).
  OffloadStepPlan plan(const ForwardBatch& batch, std::span<const KVBlockCopy> copies,
                       const std::function<bool(uint64_t)>& ticket_done);

  int64_t num_resident() const { return num_resident_; }
  int64_t num_free_gpu_blocks() const { return g_.num_gpu_blocks - num_resident_; }
  int32_t gpu_block(int32_t host) const { return host_[host].gpu; }
  bool is_dirty(int32_t host) const { return host_[host].gpu_rows > host_[host].host_rows; }

  // The KV store's block I/O (engine/kv_store.h). A block the store brought: its host copy is now
  // its whole content, written outside any step; a GPU copy of its earlier content is dropped.
  // Returns the write-back ticket (0: none) that last wrote the host copy, which the import's
  // copy must follow. The caller keeps the block out of every step until the copy finished.
  uint64_t import_host(int32_t host);
  // A full block's GPU copy, -1 when not resident with every row (the host copy is then whole).
  int32_t full_gpu_block(int32_t host) const;
  // The write-back ticket (0: none) that last wrote the host copy.
  uint64_t host_ticket(int32_t host) const;
  // An export reads GPU block `gpu` after the steps so far: a new ticket, which the reuse or a
  // rewrite of that GPU block waits for (as for its write-backs); the device issues it.
  uint64_t note_export(int32_t gpu);
  // Cross-checks the maps (each resident block once, LRU list = resident set, counts); throws
  // Error(kInternal) naming the first inconsistency.
  void check_consistency() const;

 private:
  struct HostBlock {
    int32_t gpu = -1;       // its GPU block, -1: not resident
    int32_t gpu_rows = 0;   // rows valid on the GPU (resident only)
    int32_t host_rows = 0;  // rows valid in the host copy
    uint64_t ticket = 0;    // the write-back that last wrote its host copy
    std::list<int32_t>::iterator lru;
  };
  struct GpuBlock {
    int32_t host = -1;        // the host block it holds, -1: free
    uint64_t pin_step = 0;    // == step_: used by the planned step (evicted last)
    uint64_t write_step = 0;  // == step_: written by the planned step, never evicted
    uint64_t reuse_wait = 0;  // write-back of its previous content (reuse waits for it)
  };

  // A GPU block for `host` (resident already, or evicting the least recently used unpinned
  // block), pinned for this step; the step will write it.
  int32_t make_resident(int32_t host, OffloadStepPlan& plan,
                        const std::function<bool(uint64_t)>& done);
  // The step writes GPU block `gpu`: its compute waits for a write-back still reading it.
  void note_write(int32_t gpu, OffloadStepPlan& plan,
                  const std::function<bool(uint64_t)>& done) const;
  void pin(int32_t host);
  void touch(int32_t host);
  void wait_for_host_copy(int32_t host, uint64_t& ticket,
                          const std::function<bool(uint64_t)>& done) const;
  void check_block(int32_t host) const;

  OffloadGeometry g_;
  std::vector<HostBlock> host_;  // [num_host_blocks]
  std::vector<GpuBlock> gpu_;    // [num_gpu_blocks]
  std::vector<int32_t> free_gpu_;
  std::list<int32_t> lru_;  // resident host blocks, least recently used first
  int64_t num_resident_ = 0;
  uint64_t step_ = 0;
  uint64_t next_ticket_ = 0;
  uint64_t evict_ticket_ = 0, evict_ticket_step_ = 0;  // this step's eviction write-backs
};

}  // namespace longctx
