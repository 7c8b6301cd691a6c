#include "engine/progress_bar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "engine/engine_core.h"

namespace longctx {

namespace {

std::string clock_str(double s) {
  const auto t = static_cast<int64_t>(s);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

}  // namespace

ProgressBar::ProgressBar(int64_t total, bool enabled)
    : enabled_(enabled && isatty(STDERR_FILENO) != 0), total_(total), start_(now_seconds()) {
  draw(true);
}

ProgressBar::~ProgressBar() {
  if (!enabled_) return;
  draw(true);
  std::fputc('\n', stderr);
}

void ProgressBar::add_tokens(int64_t prefill_tokens, double prefill_s, int64_t decode_tokens,
                             double decode_s) {
  prefill_tokens_ += prefill_tokens;
  prefill_s_ += prefill_s;
  decode_tokens_ += decode_tokens;
  decode_s_ += decode_s;
  draw(false);
}

void ProgressBar::add_done(int64_t n) {
  done_ += n;
  draw(true);
}

void ProgressBar::draw(bool force) {
  if (!enabled_) return;
  const double now = now_seconds();
  if (!force && now - last_draw_ < 0.1) return;  // at most 10 redraws a second
  last_draw_ = now;
  constexpr int kWidth = 20;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done_ / total_) : kWidth;
  const double elapsed = now - start_;
  const double eta = done_ > 0 ? elapsed / done_ * (total_ - done_) : 0.0;
  const double prefill_rate = prefill_s_ > 0 ? prefill_tokens_ / prefill_s_ : 0.0;
  const double decode_rate = decode_s_ > 0 ? decode_tokens_ / decode_s_ : 0.0;
  std::string line = fmt::format(
      "\rGenerating: {:3}% |{}{}| {}/{} [{}<{}] Prefill: {:.0f} tok/s, Decode: {:.0f} tok/s\x1b[K",
      total_ > 0 ? 100 * done_ / total_ : 100, std::string(filled, '#'),
      std::string(kWidth - filled, ' '), done_, total_, clock_str(elapsed), clock_str(eta),
      prefill_rate, decode_rate);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace longctx
