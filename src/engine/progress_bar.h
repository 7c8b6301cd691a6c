// A one-line progress display on stderr, like the tqdm bar of vLLM / nano-vllm: requests done,
// elapsed time, and prefill / decode throughput. Draws nothing when stderr is not a terminal
// (logs and pipes stay clean).
#pragma once

#include <cstdint>

namespace longctx {

class ProgressBar {
 public:
  ProgressBar(int64_t total, bool enabled);
  ~ProgressBar();  // ends the line
  void add_tokens(int64_t prefill_tokens, double prefill_s, int64_t decode_tokens, double decode_s);
  void add_done(int64_t n);

 private:
  void draw(bool force);

  bool enabled_;
  int64_t total_;
  int64_t done_ = 0;
  int64_t prefill_tokens_ = 0;
  int64_t decode_tokens_ = 0;
  double prefill_s_ = 0;
  double decode_s_ = 0;
  double start_ = 0;
  double last_draw_ = -1;
};

}  // namespace longctx
