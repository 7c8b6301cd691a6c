#include "attention/backends/offload_planner.h"

#include <algorithm>
#include <unordered_map>

#include "longctx/core/error.h"

namespace longctx {

OffloadPlanner::OffloadPlanner(const OffloadGeometry& geometry) : g_(geometry) {
  LONGCTX_CHECK(g_.num_layers > 0 && g_.block_size > 0 && g_.num_host_blocks > 0 &&
                    g_.num_gpu_blocks > 0 && g_.num_slots > 0 && g_.slot_blocks > 0,
                ErrorCode::kInvalidArgument,
                "KV offload: layers {}, block size {}, host blocks {}, GPU blocks {}, slots {} of "
                "{} blocks must all be positive",
                g_.num_layers, g_.block_size, g_.num_host_blocks, g_.num_gpu_blocks, g_.num_slots,
                g_.slot_blocks);
  host_.resize(g_.num_host_blocks);
  gpu_.resize(g_.num_gpu_blocks);
  free_gpu_.reserve(g_.num_gpu_blocks);
  for (int64_t b = g_.num_gpu_blocks; b-- > 0;) free_gpu_.push_back(static_cast<int32_t>(b));
}

void OffloadPlanner::pin(int32_t host) { gpu_[host_[host].gpu].pin_step = step_; }

void OffloadPlanner::touch(int32_t host) { lru_.splice(lru_.end(), lru_, host_[host].lru); }

void OffloadPlanner::wait_for_host_copy(int32_t host, uint64_t& ticket,
                                        const std::function<bool(uint64_t)>& done) const {
  const uint64_t t = host_[host].ticket;
  if (t != 0 && t > ticket && !done(t)) ticket = t;
}

void OffloadPlanner::check_block(int32_t host) const {
  LONGCTX_CHECK(host >= 0 && host < g_.num_host_blocks, ErrorCode::kInvalidArgument,
                "KV offload: block {} outside the host pool of {} blocks", host,
                g_.num_host_blocks);
}

void OffloadPlanner::note_write(int32_t gpu, OffloadStepPlan& plan,
                                const std::function<bool(uint64_t)>& done) const {
  const uint64_t w = gpu_[gpu].reuse_wait;
  if (w != 0 && w > plan.compute_wait_ticket && !done(w)) plan.compute_wait_ticket = w;
}

int32_t OffloadPlanner::make_resident(int32_t host, OffloadStepPlan& plan,
                                      const std::function<bool(uint64_t)>& done) {
  HostBlock& h = host_[host];
  if (h.gpu >= 0) {
    pin(host);
    gpu_[h.gpu].write_step = step_;
    note_write(h.gpu, plan, done);
    return h.gpu;
  }
  int32_t g = -1;
  if (!free_gpu_.empty()) {
    g = free_gpu_.back();
    free_gpu_.pop_back();
  } else {
    // Blocks the step does not use first; then blocks it only reads (read from the host instead).
    auto it = std::find_if(lru_.begin(), lru_.end(),
                           [&](int32_t b) { return gpu_[host_[b].gpu].pin_step != step_; });
    if (it == lru_.end())
      it = std::find_if(lru_.begin(), lru_.end(),
                        [&](int32_t b) { return gpu_[host_[b].gpu].write_step != step_; });
    LONGCTX_CHECK(it != lru_.end(), ErrorCode::kInternal,
                  "KV offload: no GPU block to evict (the step's size was checked)");
    const int32_t victim = *it;
    HostBlock& v = host_[victim];
    g = v.gpu;
    if (v.gpu_rows > v.host_rows) {  // dirty: its rows must reach the host before reuse
      plan.evict_write_backs.push_back({victim, g});
      v.host_rows = v.gpu_rows;
      // The eviction write-backs share one ticket, taken when the first is planned.
      if (evict_ticket_step_ != step_) {
        evict_ticket_step_ = step_;
        evict_ticket_ = ++next_ticket_;
      }
      v.ticket = evict_ticket_;
      gpu_[g].reuse_wait = evict_ticket_;
    }
    lru_.erase(v.lru);
    v.gpu = -1;
    v.gpu_rows = 0;
    --num_resident_;
  }
  note_write(g, plan, done);
  gpu_[g].host = host;
  gpu_[g].pin_step = step_;
  gpu_[g].write_step = step_;
  h.gpu = g;
  h.gpu_rows = 0;
  h.lru = lru_.insert(lru_.end(), host);
  ++num_resident_;
  return g;
}

namespace {

// Builds ring items from each sequence's host blocks, up to slot_blocks distinct blocks each.
class ItemBuilder {
 public:
  ItemBuilder(const ForwardBatch& batch, int64_t block_size, int64_t slot_blocks,
              std::vector<RingItem>& out)
      : batch_(batch), bs_(block_size), slot_blocks_(slot_blocks), out_(out) {}

  void add(int32_t seq, int32_t host) {
    if (open_ && slot_of_.find(host) == slot_of_.end() &&
        static_cast<int64_t>(slot_host_.size()) == slot_blocks_)
      close();
    if (!open_) {
      open_ = true;
      seq_begin_ = seq;
      per_seq_.clear();
    }
    while (seq_begin_ + static_cast<int32_t>(per_seq_.size()) <= seq) per_seq_.emplace_back();
    auto [it, fresh] = slot_of_.emplace(host, static_cast<int32_t>(slot_host_.size()));
    if (fresh) slot_host_.push_back(host);
    per_seq_[seq - seq_begin_].push_back(it->second);
  }

  void close() {
    if (!open_) return;
    RingItem item;
    const int32_t n = static_cast<int32_t>(per_seq_.size());
    item.seq_begin = seq_begin_;
    item.seq_end = seq_begin_ + n;
    item.row_begin = batch_.qo_indptr[item.seq_begin];
    item.row_end = batch_.qo_indptr[item.seq_end];
    item.qo_indptr.push_back(0);
    item.kv_indptr.push_back(0);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t s = seq_begin_ + i;
      item.qo_indptr.push_back(batch_.qo_indptr[s + 1] - item.row_begin);
      item.kv_indices.insert(item.kv_indices.end(), per_seq_[i].begin(), per_seq_[i].end());
      item.kv_indptr.push_back(static_cast<int32_t>(item.kv_indices.size()));
      item.kv_lens.push_back(static_cast<int32_t>(per_seq_[i].size() * bs_));
      item.all_decode = item.all_decode && batch_.q_len(s) == 1;
    }
    for (int32_t p = 0; p < static_cast<int32_t>(slot_host_.size()); ++p) {
      const int32_t h = slot_host_[p];
      if (!item.runs.empty() && item.runs.back().host_begin + item.runs.back().count == h)
        ++item.runs.back().count;
      else
        item.runs.push_back({h, 1, p});
    }
    item.num_slot_blocks = static_cast<int32_t>(slot_host_.size());
    out_.push_back(std::move(item));
    open_ = false;
    slot_of_.clear();
    slot_host_.clear();
  }

 private:
  const ForwardBatch& batch_;
  int64_t bs_, slot_blocks_;
  std::vector<RingItem>& out_;
  bool open_ = false;
  int32_t seq_begin_ = 0;
  std::vector<std::vector<int32_t>> per_seq_;     // slot positions per sequence of the open item
  std::unordered_map<int32_t, int32_t> slot_of_;  // host block -> slot position
  std::vector<int32_t> slot_host_;                // slot position -> host block
};

}  // namespace

OffloadStepPlan OffloadPlanner::plan(const ForwardBatch& batch, std::span<const KVBlockCopy> copies,
                                     const std::function<bool(uint64_t)>& done) {
  OffloadStepPlan plan;
  plan.step = ++step_;
  const int32_t bs = static_cast<int32_t>(g_.block_size);
  const int64_t num_seqs = batch.num_seqs();
  LONGCTX_CHECK(static_cast<int64_t>(batch.block_table_indptr.size()) == num_seqs + 1,
                ErrorCode::kInvalidArgument, "KV offload: {} block-table offsets for {} sequences",
                batch.block_table_indptr.size(), num_seqs);
  for (int32_t b : batch.block_tables) check_block(b);
  auto table = [&](int64_t s) { return batch.block_tables.data() + batch.block_table_indptr[s]; };
  auto first_token = [&](int64_t s) { return batch.kv_lens[s] - batch.q_len(s); };

  // The blocks the step writes must all be resident at once: checked before anything changes.
  {
    std::vector<int32_t> written;
    for (const KVBlockCopy& c : copies) written.push_back(c.dst);
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int32_t n = (batch.kv_lens[s] + bs - 1) / bs;
      for (int32_t j = first_token(s) / bs; j < n; ++j) written.push_back(table(s)[j]);
    }
    std::sort(written.begin(), written.end());
    written.erase(std::unique(written.begin(), written.end()), written.end());
    const int64_t distinct = static_cast<int64_t>(written.size());
    LONGCTX_CHECK(distinct <= g_.num_gpu_blocks, ErrorCode::kOutOfMemory,
                  "KV offload: the step writes {} blocks of {} tokens, more than the GPU cache's "
                  "{}; raise --gpu-kv-budget or lower --max-num-batched-tokens / --max-num-seqs",
                  distinct, g_.block_size, g_.num_gpu_blocks);
    for (int32_t b : written) {
      check_block(b);
      if (host_[b].gpu >= 0) gpu_[host_[b].gpu].write_step = step_;  // never evicted now
    }
  }
  // Every resident block the step touches is pinned before anything is evicted.
  for (int32_t b : batch.block_tables)
    if (host_[b].gpu >= 0) pin(b);
  for (const KVBlockCopy& c : copies) {
    check_block(c.src);
    check_block(c.dst);
    if (host_[c.src].gpu >= 0) pin(c.src);
  }

  // Copy-on-write: dst gets src's rows, on the GPU.
  for (const KVBlockCopy& c : copies) {
    const HostBlock& src = host_[c.src];
    const int32_t rows = std::max(src.gpu >= 0 ? src.gpu_rows : 0, src.host_rows);
    const int32_t g = make_resident(c.dst, plan, done);
    if (src.gpu >= 0 && src.gpu_rows >= rows) {
      plan.gpu_copies.emplace_back(src.gpu, g);
    } else {
      plan.loads.push_back({c.src, g});
      wait_for_host_copy(c.src, plan.load_wait_ticket, done);
    }
    host_[c.dst].gpu_rows = rows;
    host_[c.dst].host_rows = 0;
  }

  // Blocks that receive new tokens: resident, with their earlier rows.
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t kv_len = batch.kv_lens[s], first = first_token(s);
    const int32_t n = (kv_len + bs - 1) / bs;
    for (int32_t j = first / bs; j < n; ++j) {
      const int32_t b = table(s)[j];
      HostBlock& h = host_[b];
      const int32_t row0 = std::max(first - j * bs, 0), rows_end = std::min(bs, kv_len - j * bs);
      if (row0 == 0) {  // the block starts afresh (a new owner writes from its first row)
        make_resident(b, plan, done);
        h.gpu_rows = 0;
        h.host_rows = 0;
      } else if (h.gpu >= 0 && h.gpu_rows >= row0) {
        gpu_[h.gpu].write_step = step_;
        note_write(h.gpu, plan, done);
      } else {
        LONGCTX_CHECK(h.host_rows >= row0, ErrorCode::kInternal,
                      "KV offload: sequence {} continues block {} at row {}, but only {} rows are "
                      "on the GPU and {} on the host",
                      batch.seq_ids.empty() ? s : batch.seq_ids[s], b, row0,
                      h.gpu >= 0 ? h.gpu_rows : 0, h.host_rows);
        const int32_t g = make_resident(b, plan, done);
        plan.loads.push_back({b, g});
        wait_for_host_copy(b, plan.load_wait_ticket, done);
        h.gpu_rows = h.host_rows;
      }
      h.gpu_rows = std::max(h.gpu_rows, rows_end);
      if (rows_end == bs) plan.write_backs.push_back({b, h.gpu});
    }
  }

  // Tables: earlier blocks in place when resident, else through the ring.
  ItemBuilder items(batch, g_.block_size, g_.slot_blocks, plan.items);
  plan.qo_indptr = batch.qo_indptr;
  plan.kv_indptr.push_back(0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t kv_len = batch.kv_lens[s], first = first_token(s);
    const int32_t n = (kv_len + bs - 1) / bs, first_new = first / bs;
    int32_t host_rows_skipped = 0;
    for (int32_t j = 0; j < n; ++j) {
      const int32_t b = table(s)[j];
      const HostBlock& h = host_[b];
      if (j >= first_new || (h.gpu >= 0 && h.gpu_rows == bs)) {
        plan.kv_indices.push_back(h.gpu);
        touch(b);
        continue;
      }
      LONGCTX_CHECK(h.host_rows == bs, ErrorCode::kInternal,
                    "KV offload: block {} (full in sequence {}) has {} rows on the GPU and {} on "
                    "the host",
                    b, batch.seq_ids.empty() ? s : batch.seq_ids[s], h.gpu >= 0 ? h.gpu_rows : 0,
                    h.host_rows);
      wait_for_host_copy(b, plan.load_wait_ticket, done);
      items.add(static_cast<int32_t>(s), b);
      host_rows_skipped += bs;
      ++plan.host_blocks_read;
    }
    plan.kv_indptr.push_back(static_cast<int32_t>(plan.kv_indices.size()));
    plan.kv_lens.push_back(kv_len - host_rows_skipped);
  }
  items.close();
  plan.resident_blocks_read = static_cast<int64_t>(plan.kv_indices.size());

  // New tokens' slots in the GPU cache.
  plan.slots.reserve(batch.slot_mapping.size());
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int32_t t = batch.qo_indptr[s]; t < batch.qo_indptr[s + 1]; ++t) {
      const int64_t pos = first_token(s) + (t - batch.qo_indptr[s]);
      const int32_t b = table(s)[pos / bs];
      plan.slots.push_back(int64_t(host_[b].gpu) * bs + pos % bs);
    }
  }

  // Write-through of the blocks this step fills.
  if (!plan.write_backs.empty()) {
    plan.write_back_ticket = ++next_ticket_;
    for (const BlockMove& m : plan.write_backs) {
      host_[m.host].host_rows = bs;
      host_[m.host].ticket = plan.write_back_ticket;
      gpu_[m.gpu].reuse_wait = plan.write_back_ticket;
    }
  }
  if (!plan.evict_write_backs.empty()) plan.evict_write_back_ticket = evict_ticket_;
  return plan;
}

uint64_t OffloadPlanner::import_host(int32_t host) {
  check_block(host);
  HostBlock& h = host_[host];
  if (h.gpu >= 0) {  // stale now; its GPU block keeps reuse_wait for copies still reading it
    gpu_[h.gpu].host = -1;
    free_gpu_.push_back(h.gpu);
    lru_.erase(h.lru);
    --num_resident_;
    h.gpu = -1;
    h.gpu_rows = 0;
  }
  const uint64_t last = h.ticket;
  h.host_rows = static_cast<int32_t>(g_.block_size);
  h.ticket = 0;
  return last;
}

int32_t OffloadPlanner::full_gpu_block(int32_t host) const {
  check_block(host);
  const HostBlock& h = host_[host];
  return h.gpu >= 0 && h.gpu_rows == g_.block_size ? h.gpu : -1;
}

uint64_t OffloadPlanner::host_ticket(int32_t host) const {
  check_block(host);
  return host_[host].ticket;
}

uint64_t OffloadPlanner::note_export(int32_t gpu) {
  LONGCTX_CHECK(gpu >= 0 && gpu < g_.num_gpu_blocks, ErrorCode::kInternal,
                "KV offload: export of GPU block {} outside the cache of {}", gpu,
                g_.num_gpu_blocks);
  const uint64_t t = ++next_ticket_;
  gpu_[gpu].reuse_wait = t;
  return t;
}

void OffloadPlanner::check_consistency() const {
  int64_t resident = 0;
  std::vector<uint8_t> seen(g_.num_gpu_blocks, 0);
  for (int64_t b = 0; b < g_.num_host_blocks; ++b) {
    const HostBlock& h = host_[b];
    LONGCTX_CHECK(h.host_rows >= 0 && h.host_rows <= g_.block_size, ErrorCode::kInternal,
                  "KV offload: block {} has {} host rows", b, h.host_rows);
    if (h.gpu < 0) continue;
    ++resident;
    LONGCTX_CHECK(h.gpu < g_.num_gpu_blocks && !seen[h.gpu] && gpu_[h.gpu].host == b &&
                      h.gpu_rows >= h.host_rows && h.gpu_rows <= g_.block_size,
                  ErrorCode::kInternal,
                  "KV offload: block {} on GPU block {} ({} GPU rows, {} host rows) is "
                  "inconsistent",
                  b, h.gpu, h.gpu_rows, h.host_rows);
    seen[h.gpu] = 1;
  }
  LONGCTX_CHECK(resident == num_resident_ && static_cast<int64_t>(lru_.size()) == resident &&
                    resident + static_cast<int64_t>(free_gpu_.size()) == g_.num_gpu_blocks,
                ErrorCode::kInternal,
                "KV offload: {} resident blocks, {} counted, {} in the LRU, {} GPU blocks free "
                "of {}",
                resident, num_resident_, lru_.size(), free_gpu_.size(), g_.num_gpu_blocks);
  for (int32_t g : free_gpu_)
    LONGCTX_CHECK(!seen[g] && gpu_[g].host < 0, ErrorCode::kInternal,
                  "KV offload: free GPU block {} holds block {}", g, gpu_[g].host);
}

}  // namespace longctx
