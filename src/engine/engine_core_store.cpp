// EngineCore's side of the shared KV store (kv_store.h, docs/fleet.md "Shared KV store"): the
// exports of computed blocks, and the reads of a waiting request's blocks, on the engine thread
// (kv_store_sync_reads) or in the background with the request held (advance_store_loads).
#include <algorithm>
#include <chrono>
#include <functional>
#include <span>
#include <vector>

#include "engine/engine_core.h"
#include "engine/kv_store.h"
#include "longctx/core/error.h"

namespace longctx {

void EngineCore::start_kv_exports() {
  if (kv_store_->num_waiting_exports() == 0) return;
  // The executor copies the block into a staging buffer (on a GPU without waiting); the
  // store's writer thread waits for the copy.
  kv_store_->start_exports([this](int32_t block, std::span<std::byte> dst) {
    return executor_->read_kv_block_async(block, dst);
  });
}

void EngineCore::forget_overwritten_exports(std::span<const StepInput> inputs,
                                            std::span<const KVBlockCopy> copies) {
  if (kv_store_ == nullptr || kv_store_->num_waiting_exports() == 0) return;
  const int64_t bs = blocks_.block_size();
  std::vector<int32_t> written;
  for (const StepInput& in : inputs) {
    const int64_t first = in.num_computed / bs;
    const int64_t last = (in.num_computed + in.num_new - 1) / bs;
    for (int64_t b = first; b <= last && b < static_cast<int64_t>(in.block_table.size()); ++b)
      written.push_back(in.block_table[b]);
  }
  for (const KVBlockCopy& c : copies) written.push_back(c.dst);
  kv_store_->forget_exports(written);
}

void EngineCore::import_from_store() {
  const int64_t bs = blocks_.block_size();
  std::vector<uint64_t> hashes;
  std::vector<KvStoreBlockRef> refs;
  int64_t imported = 0;  // this pass's blocks, kept from evicting one another
  for (Sequence* seq : scheduler_.all()) {
    if (seq->store_checked || seq->status != SequenceStatus::kWaiting) continue;
    seq->store_checked = true;
    // Blocks before the last prompt token (that one is always computed, for its logits).
    const auto prompt = std::span<const int32_t>(seq->tokens)
                            .first(static_cast<size_t>(seq->num_prompt_tokens - 1));
    const int64_t cached = blocks_.cached_prefix(prompt, &hashes);
    refs.clear();
    for (auto i = cached; i < static_cast<int64_t>(hashes.size()); ++i)
      refs.push_back(
          {hashes[i], i == 0 ? 0 : hashes[i - 1], prompt.subspan(i * bs, static_cast<size_t>(bs))});
    // The store reads the next blocks while this one's copy to the device runs, straight out
    // of the store's read buffer (pinned for a GPU executor); get_prefix returns once every
    // copy finished (the next step reads the imported blocks).
    kv_store_->get_prefix(
        refs, [&](size_t i, std::span<const std::byte> bytes, std::function<void()>* reuse_after) {
          const int32_t id = blocks_.import_block(refs[i].parent, refs[i].tokens, imported);
          if (id < 0) return false;
          kv_store_->forget_exports(std::span(&id, 1));  // an evicted block, overwritten now
          *reuse_after = executor_->write_kv_block_async(id, bytes);
          ++imported;
          return true;
        });
  }
}

void EngineCore::advance_store_loads() {
  const int64_t bs = blocks_.block_size();
  // The blocks a load may pin: those free beyond one for each running sequence (its next
  // block), so a load does not preempt the running sequences.
  auto spare = [&] { return blocks_.num_free_blocks(BlockPool::kMain) - scheduler_.num_running(); };
  // The blocks that arrived, each into a pinned block (on a GPU: a copy on the copy stream from
  // the store's pinned read buffer; the loader thread waits for it before the load ends).
  for (StoreLoad& l : loads_) {
    for (const KvStoreLoad::Hit& hit : l.load->take_hits()) {
      // Aborted, or no block to spare: the load ends here and the rest is recomputed.
      const int32_t id = l.seq != nullptr && spare() > 0 ? blocks_.take_pinned() : -1;
      if (id < 0) {
        l.load->stop();
        break;
      }
      l.blocks.push_back(id);
      kv_store_->forget_exports(std::span(&id, 1));  // an evicted block, overwritten now
      try {
        l.load->imported(hit.index, executor_->write_kv_block_async(id, hit.bytes));
      } catch (...) {
        l.load->stop();
        throw;
      }
    }
  }
  // Ended loads: every copy finished, so the blocks join the prefix cache (the sequence's hit
  // when it is scheduled) and the sequence the steps.
  for (auto it = loads_.begin(); it != loads_.end();) {
    if (!it->load->done()) {
      ++it;
      continue;
    }
    const std::span<const KvStoreBlockRef> refs = it->load->blocks();
    std::vector<int32_t> kept;
    for (size_t i = 0; i < it->blocks.size(); ++i) {
      const int32_t id = it->blocks[i];
      // A block computed or imported meanwhile under the same hash serves as well.
      if (it->seq != nullptr && blocks_.cache_pinned(id, refs[i].parent, refs[i].tokens))
        kept.push_back(id);
      else
        blocks_.unpin(id);
    }
    if (it->seq != nullptr) {
      scheduler_.release(it->seq);
      if (!kept.empty()) loaded_[it->seq_id] = std::move(kept);
    }
    // Looked up again below: their prefix now hits these blocks locally.
    for (uint64_t f : it->followers) {
      const auto seq = live_.find(f);
      if (seq != live_.end()) scheduler_.release(seq->second.get());
    }
    it = loads_.erase(it);
  }
  // New lookups, of the waiting sequences not looked up yet. A sequence whose first missing
  // block a load already reads follows that load (held) rather than reading the same blocks.
  if (scheduler_.num_waiting() > scheduler_.num_held()) {
    std::vector<uint64_t> hashes;
    std::vector<KvStoreBlockRef> refs;
    for (Sequence* seq : scheduler_.all()) {
      if (seq->store_checked || seq->status != SequenceStatus::kWaiting || scheduler_.held(seq))
        continue;
      // Blocks before the last prompt token (that one is always computed, for its logits).
      const auto prompt = std::span<const int32_t>(seq->tokens)
                              .first(static_cast<size_t>(seq->num_prompt_tokens - 1));
      const int64_t cached = blocks_.cached_prefix(prompt, &hashes);
      const int64_t end =
          std::min(static_cast<int64_t>(hashes.size()), cached + std::max<int64_t>(spare(), 0));
      refs.clear();
      for (int64_t i = cached; i < end; ++i)
        refs.push_back({hashes[i], i == 0 ? 0 : hashes[i - 1],
                        prompt.subspan(i * bs, static_cast<size_t>(bs))});
      if (refs.empty()) {
        seq->store_checked = true;
        continue;
      }
      scheduler_.hold(seq);
      const auto leader = std::find_if(loads_.begin(), loads_.end(), [&](const StoreLoad& l) {
        return l.seq != nullptr && l.load->blocks().front().hash == refs[0].hash;
      });
      if (leader != loads_.end()) {
        leader->followers.push_back(seq->id);
        continue;
      }
      seq->store_checked = true;
      loads_.push_back({seq->id, seq, kv_store_->start_load(refs), {}, {}});
    }
  }
}

void EngineCore::unpin_loaded_blocks() {
  for (auto it = loaded_.begin(); it != loaded_.end();) {
    const auto seq = live_.find(it->first);
    if (seq != live_.end() && seq->second->status == SequenceStatus::kWaiting) {
      ++it;
      continue;
    }
    for (int32_t id : it->second) blocks_.unpin(id);
    it = loaded_.erase(it);
  }
}

void EngineCore::drop_store_loads(uint64_t id) {
  for (StoreLoad& l : loads_) {
    if (l.seq_id != id || l.seq == nullptr) continue;
    l.seq = nullptr;
    l.load->stop();  // its blocks are freed when it ends (a copy into them may still run)
  }
  if (auto it = loaded_.find(id); it != loaded_.end()) {
    for (int32_t b : it->second) blocks_.unpin(b);
    loaded_.erase(it);
  }
}

void EngineCore::flush_kv_store() {
  if (kv_store_ == nullptr) return;
  // Each pass frees every staging buffer, so each starts at least one waiting export.
  do {
    start_kv_exports();
    kv_store_->flush();
  } while (kv_store_->num_waiting_exports() > 0);
}

}  // namespace longctx
