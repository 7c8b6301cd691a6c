#include "engine/tensor_parallel_executor.h"

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "longctx/core/error.h"
#include "longctx/core/stream.h"

namespace longctx {

namespace {

// One thread that runs one job at a time for the caller and hands back its exception.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void start(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
      done_ = false;
      error_ = nullptr;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || job_ != nullptr; });
      if (job_ == nullptr) return;  // stop with nothing queued
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = true, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after the state above exists
};

class TensorParallelExecutor final : public Executor {
 public:
  TensorParallelExecutor(std::vector<std::unique_ptr<Executor>> ranks, std::vector<Device> devices)
      : ranks_(std::move(ranks)), devices_(std::move(devices)) {
    LONGCTX_CHECK(!ranks_.empty() && devices_.size() == ranks_.size(), ErrorCode::kInvalidArgument,
                  "tensor parallel: {} ranks on {} devices", ranks_.size(), devices_.size());
    const KVBlockLayout l = ranks_[0]->kv_layout();
    for (size_t r = 1; r < ranks_.size(); ++r) {
      const KVBlockLayout o = ranks_[r]->kv_layout();
      LONGCTX_CHECK(o.num_blocks == l.num_blocks && o.block_size == l.block_size,
                    ErrorCode::kInvalidArgument,
                    "tensor parallel: rank {} has {} KV blocks of {} tokens, rank 0 {} of {}", r,
                    o.num_blocks, o.block_size, l.num_blocks, l.block_size);
    }
    workers_.resize(ranks_.size() - 1);
    for (auto& w : workers_) w = std::make_unique<Worker>();
  }

  int64_t vocab_size() const override { return ranks_[0]->vocab_size(); }
  KVBlockLayout kv_layout() const override { return ranks_[0]->kv_layout(); }

  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) override {
    for (size_t r = 1; r < ranks_.size(); ++r)
      workers_[r - 1]->start([&, r] { run(r, inputs, copies); });
    std::exception_ptr error;
    Tensor logits;
    try {
      logits = run(0, inputs, copies);
    } catch (...) {
      error = std::current_exception();
    }
    for (auto& w : workers_) {  // every rank has finished before the step returns
      try {
        w->wait();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return logits;
  }

  std::vector<SampleResult> sample(const Tensor& logits,
                                   std::span<const SamplingParams* const> params,
                                   std::span<SamplerState* const> states) override {
    return ranks_[0]->sample(logits, params, states);
  }

 private:
  Tensor run(size_t r, std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) {
    if (!devices_[r].is_cuda()) return ranks_[r]->execute(inputs, copies);
    DeviceGuard guard(devices_[r].index);
    return ranks_[r]->execute(inputs, copies);
  }

  std::vector<std::unique_ptr<Executor>> ranks_;
  std::vector<Device> devices_;
  std::vector<std::unique_ptr<Worker>> workers_;  // ranks 1..N-1
};

}  // namespace

std::unique_ptr<Executor> make_tensor_parallel_executor(
    std::vector<std::unique_ptr<Executor>> ranks, std::vector<Device> devices) {
  return std::make_unique<TensorParallelExecutor>(std::move(ranks), std::move(devices));
}

}  // namespace longctx
