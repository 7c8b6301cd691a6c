#include "server/http_types.h"

#include <chrono>

namespace longctx::server {

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return {};
}

void ResponseStream::notify_locked(std::unique_lock<std::mutex>& lk) {
  cv_.notify_all();
  // Called without the lock: the transport's take() locks it again.
  std::function<void()> fn = notify_;
  lk.unlock();
  if (fn) fn();
}

void ResponseStream::start(Head head) {
  std::unique_lock lk(mu_);
  if (head_) return;
  head_ = std::move(head);
  notify_locked(lk);
}

void ResponseStream::write(std::string_view data) {
  if (data.empty()) return;
  std::unique_lock lk(mu_);
  if (finished_ || cancelled_) return;
  data_.append(data);
  notify_locked(lk);
}

void ResponseStream::finish() {
  std::unique_lock lk(mu_);
  if (finished_) return;
  finished_ = true;
  on_cancel_ = nullptr;
  notify_locked(lk);
}

void ResponseStream::set_notify(std::function<void()> fn) {
  std::unique_lock lk(mu_);
  notify_ = std::move(fn);
  if ((head_ && !head_taken_) || !data_.empty() || (finished_ && !finished_taken_)) {
    notify_locked(lk);
  }
}

ResponseStream::Taken ResponseStream::take() {
  std::lock_guard lk(mu_);
  Taken t;
  if (head_ && !head_taken_) {
    t.head = head_;
    head_taken_ = true;
  }
  // Data and the end are handed out only after the head.
  if (head_taken_) {
    t.data.swap(data_);
    if (finished_) {
      t.finished = true;
      finished_taken_ = true;
      notify_ = nullptr;  // nothing more comes; drops the transport's session reference
    }
  }
  return t;
}

ResponseStream::Taken ResponseStream::wait_take(double timeout_s) {
  {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] {
      return (head_ && !head_taken_) || !data_.empty() || (finished_ && !finished_taken_) ||
             cancelled_;
    });
  }
  return take();
}

void ResponseStream::set_on_cancel(std::function<void()> fn) {
  std::unique_lock lk(mu_);
  if (finished_) return;
  if (cancelled_) {
    lk.unlock();
    fn();
    return;
  }
  on_cancel_ = std::move(fn);
}

void ResponseStream::cancel() {
  std::function<void()> fn;
  {
    std::lock_guard lk(mu_);
    if (cancelled_) return;
    cancelled_ = true;
    notify_ = nullptr;
    if (!finished_) fn = std::move(on_cancel_);
    on_cancel_ = nullptr;
    cv_.notify_all();
  }
  if (fn) fn();
}

bool ResponseStream::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

bool ResponseStream::finished() const {
  std::lock_guard lk(mu_);
  return finished_;
}

}  // namespace longctx::server
