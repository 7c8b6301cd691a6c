#include "engine/progress_bar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
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

double rate(int64_t tokens, double seconds) { return seconds > 0 ? tokens / seconds : 0.0; }

}  // namespace

ProgressBar::ProgressBar(int64_t total, int64_t prompt_tokens, bool enabled, Mode mode)
    : live_(enabled && isatty(STDERR_FILENO) != 0),
      summary_(enabled && !live_ && mode == Mode::kFull),
      mode_(mode),
      total_(total),
      prompt_tokens_(prompt_tokens),
      start_(now_seconds()) {
  draw(true);
}

ProgressBar::~ProgressBar() {
  if (live_) {
    draw(true);
    std::fputc('\n', stderr);
  } else if (summary_) {
    std::fprintf(stderr,
                 "Generated %lld/%lld requests in %.1f s: %lld prompt tokens (prefill %.0f tok/s), "
                 "%lld generated tokens (decode %.0f tok/s)\n",
                 static_cast<long long>(done_), static_cast<long long>(total_),
                 now_seconds() - start_, static_cast<long long>(prefill_tokens_),
                 rate(prefill_tokens_, prefill_s_), static_cast<long long>(generated_tokens_),
                 rate(decode_tokens_, decode_s_));
  }
}

void ProgressBar::add_tokens(int64_t prefill_tokens, double prefill_s, int64_t decode_tokens,
                             double decode_s) {
  prefill_tokens_ += prefill_tokens;
  prefill_s_ += prefill_s;
  decode_tokens_ += decode_tokens;
  decode_s_ += decode_s;
  draw(false);
}

void ProgressBar::stop() {
  if (!live_) return;
  std::fputs("\r\x1b[K", stderr);
  std::fflush(stderr);
  live_ = false;
}

void ProgressBar::add_done(int64_t generated_tokens) {
  ++done_;
  generated_tokens_ += generated_tokens;
  draw(true);
}

void ProgressBar::draw(bool force) {
  if (!live_) return;
  const double now = now_seconds();
  if (!force && now - last_draw_ < 0.1) return;  // at most 10 redraws a second
  last_draw_ = now;
  const double elapsed = now - start_;
  const int64_t prefilled = std::min(prefill_tokens_, prompt_tokens_);
  const int64_t prefill_pct = prompt_tokens_ > 0 ? 100 * prefilled / prompt_tokens_ : 100;
  std::string line;
  if (mode_ == Mode::kPrefillOnly) {
    line =
        fmt::format("\rPrefill: {:3}% {}/{} tokens [{}] {:.0f} tok/s\x1b[K", prefill_pct, prefilled,
                    prompt_tokens_, clock_str(elapsed), rate(prefill_tokens_, prefill_s_));
  } else {
    constexpr int kWidth = 20;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done_ / total_) : kWidth;
    const double eta = done_ > 0 ? elapsed / done_ * (total_ - done_) : 0.0;
    line = fmt::format(
        "\rGenerating: {:3}% |{}{}| {}/{} [{}<{}] Prefill: {}/{} tokens, {:.0f} tok/s, Decode: "
        "{:.0f} tok/s\x1b[K",
        total_ > 0 ? 100 * done_ / total_ : 100, std::string(filled, '#'),
        std::string(kWidth - filled, ' '), done_, total_, clock_str(elapsed), clock_str(eta),
        prefilled, prompt_tokens_, rate(prefill_tokens_, prefill_s_),
        rate(decode_tokens_, decode_s_));
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace longctx
