// Ranks as threads of one process: each collective posts the rank's tensor, waits for every
// rank, reads all of them, and waits again before anyone may change its tensor.
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "longctx/core/communicator.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

struct Group {
  explicit Group(int n) : size(n), posted(static_cast<size_t>(n), nullptr) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<const Tensor*> posted;  // [size] this collective's tensors

  void barrier() {
    std::unique_lock<std::mutex> lock(mu);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen; });
  }
};

void check_cpu_f32(const Tensor& x, const char* what) {
  LONGCTX_CHECK(x.defined() && x.device().is_cpu() && x.dtype() == DType::kF32 && x.is_contiguous(),
                ErrorCode::kInvalidArgument,
                "thread communicator: {} must be a contiguous f32 CPU tensor, got {}", what,
                x.defined() ? x.str() : std::string("undefined"));
}

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  void all_reduce_sum(const Tensor& x) override {
    check_cpu_f32(x, "all_reduce_sum's tensor");
    g_->posted[rank_] = &x;
    g_->barrier();
    const int64_t n = x.numel();
    std::vector<float> sum(static_cast<size_t>(n), 0.f);
    for (int r = 0; r < g_->size; ++r) {
      const Tensor& y = *g_->posted[r];
      LONGCTX_CHECK(y.shape() == x.shape(), ErrorCode::kInvalidArgument,
                    "all_reduce_sum: rank {} has {}, rank {} has {}", rank_, x.str(), r, y.str());
      const float* p = y.data<float>();
      for (int64_t i = 0; i < n; ++i) sum[i] += p[i];
    }
    g_->barrier();  // every rank has read every tensor
    std::memcpy(x.data<float>(), sum.data(), static_cast<size_t>(n) * sizeof(float));
  }

  void all_gather_columns(const Tensor& local, const Tensor& out) override {
    check_cpu_f32(local, "all_gather_columns' local tensor");
    check_cpu_f32(out, "all_gather_columns' output");
    g_->posted[rank_] = &local;
    g_->barrier();
    const int64_t rows = out.size(0), cols = out.size(1);
    int64_t at = 0;
    for (int r = 0; r < g_->size; ++r) {
      const Tensor& y = *g_->posted[r];
      LONGCTX_CHECK(y.rank() == 2 && y.size(0) == rows && at + y.size(1) <= cols,
                    ErrorCode::kInvalidArgument,
                    "all_gather_columns: rank {}'s {} does not fit out {} at column {}", r, y.str(),
                    out.str(), at);
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(out.data<float>() + i * cols + at, y.data<float>() + i * y.size(1),
                    static_cast<size_t>(y.size(1)) * sizeof(float));
      at += y.size(1);
    }
    LONGCTX_CHECK(at == cols, ErrorCode::kInvalidArgument,
                  "all_gather_columns: the ranks hold {} columns, out has {}", at, cols);
    g_->barrier();
  }

 private:
  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_thread_communicators(int size) {
  LONGCTX_CHECK(size >= 1, ErrorCode::kInvalidArgument, "communicator group of {} ranks", size);
  auto g = std::make_shared<Group>(size);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_shared<ThreadCommunicator>(g, r));
  return out;
}

}  // namespace longctx
