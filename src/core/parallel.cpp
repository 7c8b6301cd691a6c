#include "longctx/core/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace longctx {

namespace {

thread_local bool t_in_worker = false;

// Fork-join pool: parallel_for publishes one job, workers take chunk indices from an atomic-free
// counter under the mutex (chunks are coarse, so the lock is not hot), the caller works too.
class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int n) {
    stop();
    stopping_ = false;
    for (int i = 0; i + 1 < std::max(n, 1); ++i) workers_.emplace_back([this] { loop(); });
  }

  void run(int64_t chunks, const std::function<void(int64_t)>& body) {
    std::unique_lock<std::mutex> lock(mu_);
    body_ = &body;
    total_ = chunks;
    next_ = 0;
    done_ = 0;
    ++generation_;
    cv_.notify_all();
    lock.unlock();
    work();
    lock.lock();
    done_cv_.wait(lock, [&] { return done_ == total_; });
    body_ = nullptr;
  }

 private:
  void work() {
    for (;;) {
      int64_t i;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!body_ || next_ >= total_) return;
        i = next_++;
      }
      (*body_)(i);
      std::lock_guard<std::mutex> lock(mu_);
      if (++done_ == total_) done_cv_.notify_all();
    }
  }

  void loop() {
    t_in_worker = true;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      work();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* body_ = nullptr;
  int64_t total_ = 0, next_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

int default_threads() {
  if (const char* env = std::getenv("LONGCTX_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Pool& pool() {
  static Pool p(default_threads());
  return p;
}

std::mutex g_run_mu;  // one parallel_for at a time from outside the pool

}  // namespace

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(g_run_mu);
  pool().resize(n);
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  int threads = num_threads();
  if (t_in_worker || threads == 1 || n <= std::max<int64_t>(grain, 1)) {
    fn(0, n);
    return;
  }
  // A few chunks per thread balance uneven work without much locking.
  int64_t chunks = std::min<int64_t>(n / std::max<int64_t>(grain, 1), int64_t(threads) * 4);
  chunks = std::max<int64_t>(chunks, 1);
  std::function<void(int64_t)> body = [&](int64_t c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    if (b < e) fn(b, e);
  };
  std::lock_guard<std::mutex> lock(g_run_mu);
  pool().run(chunks, body);
}

}  // namespace longctx
