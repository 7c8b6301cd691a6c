// The engine's executor over a GpuRunner: steps, sampling and the KV store's block I/O go to the
// runner, which from construction on leaves its KV blocks to the engine's BlockManager.
#include <memory>
#include <string>

#include "longctx/core/error.h"
#include "longctx/engine/gpu_runner.h"

namespace longctx {

namespace {

class GpuExecutor final : public Executor {
 public:
  explicit GpuExecutor(std::shared_ptr<GpuRunner> runner) : runner_(std::move(runner)) {
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
  std::vector<SampleResult> sample(const Tensor& logits,
                                   std::span<const SamplingParams* const> params,
                                   std::span<SamplerState* const> states) override {
    return runner_->sample(logits, params, states);
  }

 private:
  std::shared_ptr<GpuRunner> runner_;
};

}  // namespace

std::unique_ptr<Executor> make_gpu_executor(std::shared_ptr<GpuRunner> runner) {
  LONGCTX_CHECK(runner != nullptr, ErrorCode::kInvalidArgument, "null GPU runner");
  return std::make_unique<GpuExecutor>(std::move(runner));
}

}  // namespace longctx
