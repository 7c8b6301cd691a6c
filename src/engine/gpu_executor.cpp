// The engine's executor over a GpuRunner: steps, sampling and the KV store's block I/O go to the
// runner, which from construction on leaves its KV blocks to the engine's BlockManager.
//
// The KV store's block copies run on a copy stream of their own, between pinned host buffers and
// the pool, with no host wait on the engine thread. An export's copy waits (on the GPU) for the
// steps enqueued before it, which computed the block. A later step or import must not overwrite
// the block before that copy read it: the block is then free or evicted from the prefix cache
// and taken again, rare right after it was stored (it is the most recently used), so the
// executor keeps the blocks whose export copy may still run and waits on the host for that copy
// before a step or an import that writes one of them. An import's copy waits (on the GPU) for
// the steps enqueued before it, which may still read the block it overwrites (one a finished
// sequence held); the thread that waits for the import (the store's loader) enqueues its copies,
// and the block joins a step only after that wait returned.
// Under KV offload the blocks are the host pool's: the offload backend imports into the host
// copy and exports from the GPU cache or the host copy, ordered with the steps by its planner's
// tickets (offload_backend.h).
#include <memory>
#include <string>
#include <unordered_map>

#include "longctx/core/error.h"
#include "longctx/core/stream.h"
#include "longctx/engine/gpu_runner.h"

namespace longctx {

namespace {

class GpuExecutor final : public Executor {
 public:
  explicit GpuExecutor(std::shared_ptr<GpuRunner> runner)
      : runner_(std::move(runner)),
        device_(runner_->device()),
        block_size_(runner_->kv_layout().block_size) {
    runner_->attach_engine();
  }
  int64_t vocab_size() const override { return runner_->vocab_size(); }
  KVBlockLayout kv_layout() const override { return runner_->kv_layout(); }
  ExecutorCounters counters() const override {
    const GpuRunner::OffloadCounters o = runner_->offload_counters();
    const GpuRunner::SparseCounters sp = runner_->sparse_counters();
    ExecutorCounters c = runner_->state_counters();
    c.offload_host_bytes_loaded = o.host_bytes_loaded;
    c.offload_host_bytes_written = o.host_bytes_written;
    c.sparse_prefill_blocks_kept = sp.prefill_blocks_kept;
    c.sparse_prefill_blocks_causal = sp.prefill_blocks_causal;
    return c;
  }
  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) override {
    if (!exporting_.empty()) wait_for_exports(inputs, copies);
    step_recorded_ = false;
    return runner_->execute(inputs, copies);
  }
  int64_t kv_block_bytes() const override { return runner_->kv_block_bytes(); }
  std::string kv_block_format() const override { return runner_->kv_block_format(); }
  void read_kv_block(int32_t block, std::span<std::byte> out) const override {
    runner_->read_kv_block(block, out);
  }
  void write_kv_block(int32_t block, std::span<const std::byte> in) override {
    runner_->write_kv_block(block, in);
  }
  bool kv_block_io_pinned() const override { return true; }
  std::function<void()> read_kv_block_async(int32_t block, std::span<std::byte> out) override {
    const DeviceGuard guard(device_.index);
    if (runner_->kv_offloaded()) return runner_->export_offloaded_kv_block(block, out);
    after_steps();
    runner_->read_kv_block_async(block, out, copy_stream().handle());
    auto done = std::make_shared<Event>(device_);
    done->record(copy_stream());
    exporting_[block] = done;
    return [done] { done->synchronize(); };
  }
  // The copies are enqueued by the wait, on the thread that calls it (the store's loader), not
  // here: a block is a copy per layer tensor (64 for an 8B model), host time that a decode step
  // beside a load waited for on the engine thread (+6.4 % TPOT on the H100 beside a 32K hit).
  // The copy stream already waits for the steps enqueued before this call (after_steps), and the
  // block stays out of every step until the wait returned.
  std::function<void()> write_kv_block_async(int32_t block,
                                             std::span<const std::byte> in) override {
    const DeviceGuard guard(device_.index);
    if (runner_->kv_offloaded()) return runner_->import_offloaded_kv_block(block, in);
    wait_for_export(block);
    after_steps();
    if (imports_by_caller_) {
      runner_->write_kv_block_async(block, in, copy_stream().handle());
      auto done = std::make_shared<Event>(device_);
      done->record(copy_stream());
      return [done] { done->synchronize(); };
    }
    return [this, block, in, stream = copy_stream().handle()] {
      const DeviceGuard loader_guard(device_.index);
      runner_->write_kv_block_async(block, in, stream);
      Event done(device_);
      done.record_on(stream);
      done.synchronize();
    };
  }
  void set_kv_imports_enqueued_by_caller(bool on) override { imports_by_caller_ = on; }
  std::vector<SampleResult> sample(const Tensor& logits,
                                   std::span<const SamplingParams* const> params,
                                   std::span<SamplerState* const> states) override {
    return runner_->sample(logits, params, states);
  }

 private:
  const Stream& copy_stream() {
    if (copy_ == nullptr) copy_ = std::make_unique<Stream>(device_);
    return *copy_;
  }
  // Orders the copy stream's next copies after the steps enqueued so far (one event a step).
  void after_steps() {
    if (step_done_ == nullptr) step_done_ = std::make_unique<Event>(device_);
    if (!step_recorded_) {
      step_done_->record_on(current_stream(device_.index));
      copy_stream().wait(*step_done_);
      step_recorded_ = true;
    }
  }
  void wait_for_export(int32_t block) {
    const auto it = exporting_.find(block);
    if (it == exporting_.end()) return;
    it->second->synchronize();
    exporting_.erase(it);
  }
  // Forgets the finished exports, then waits for those of blocks this step writes: the blocks of
  // its new tokens and its copies' destinations.
  void wait_for_exports(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) {
    std::erase_if(exporting_, [](const auto& e) { return e.second->query(); });
    const int64_t bs = block_size_;
    for (const StepInput& in : inputs) {
      const int64_t first = in.num_computed / bs;
      const int64_t last = (in.num_computed + in.num_new - 1) / bs;
      for (int64_t b = first; b <= last && b < static_cast<int64_t>(in.block_table.size()); ++b)
        wait_for_export(in.block_table[b]);
    }
    for (const KVBlockCopy& c : copies) wait_for_export(c.dst);
  }

  std::shared_ptr<GpuRunner> runner_;
  Device device_;
  int64_t block_size_;
  std::unique_ptr<Stream> copy_;      // the KV store's block copies
  std::unique_ptr<Event> step_done_;  // recorded after the last step, before a copy
  bool step_recorded_ = false;        // step_done_ marks the last step already
  bool imports_by_caller_ = false;    // set_kv_imports_enqueued_by_caller (measurements)
  // Blocks whose export copy was enqueued and was not seen finished, and its event.
  std::unordered_map<int32_t, std::shared_ptr<Event>> exporting_;
};

}  // namespace

std::unique_ptr<Executor> make_gpu_executor(std::shared_ptr<GpuRunner> runner) {
  LONGCTX_CHECK(runner != nullptr, ErrorCode::kInvalidArgument, "null GPU runner");
  return std::make_unique<GpuExecutor>(std::move(runner));
}

}  // namespace longctx
