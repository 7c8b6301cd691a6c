// Progress of a generate() call on stderr, like the tqdm bar of vLLM / nano-vllm: requests done,
// prompt tokens prefilled of the total, elapsed time, prefill / decode throughput, redrawn as each
// engine step (a prefill chunk) ends. On a terminal it is one line redrawn in place; otherwise
// nothing is drawn while it runs and one summary line is written at the end (logs stay clean).
// In prefill-only mode (a streamed request, whose text shows the decode) the line shows the
// prefill alone and is erased before the first token's text is printed.
#pragma once

#include <cstdint>

namespace longctx {

class ProgressBar {
 public:
  enum class Mode { kFull, kPrefillOnly };
  // total: requests; prompt_tokens: their prompt tokens, the prefill to do.
  ProgressBar(int64_t total, int64_t prompt_tokens, bool enabled, Mode mode = Mode::kFull);
  ~ProgressBar();  // ends the line, or writes the summary line
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void add_tokens(int64_t prefill_tokens, double prefill_s, int64_t decode_tokens, double decode_s);
  // A request finished, having generated `generated_tokens`.
  void add_done(int64_t generated_tokens);
  // Erases the line and draws no more (prefill-only mode, before the first token's text).
  void stop();

 private:
  void draw(bool force);

  bool live_;     // redrawn in place (stderr is a terminal)
  bool summary_;  // one line at the end (stderr is not a terminal, full mode)
  Mode mode_;
  int64_t total_;
  int64_t prompt_tokens_;
  int64_t done_ = 0;
  int64_t prefill_tokens_ = 0;
  int64_t decode_tokens_ = 0;     // tokens of decode steps (for the decode rate)
  int64_t generated_tokens_ = 0;  // of the finished requests, first tokens included
  double prefill_s_ = 0;
  double decode_s_ = 0;
  double start_ = 0;
  double last_draw_ = -1;
};

}  // namespace longctx
