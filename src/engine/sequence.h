// A request inside the engine: its tokens, where it stands with the model (tokens computed), its
// sampler and stop state, and the output built so far. EngineCore owns it; the Scheduler moves
// it between its waiting and running queues (its KV blocks are the BlockManager's, by id).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/ngram_drafter.h"
#include "engine/text_stream.h"
#include "longctx/engine/request_output.h"
#include "longctx/engine/sampler.h"
#include "longctx/engine/sampling_params.h"
#include "longctx/engine/stop_strings.h"
#include "structured/token_mask.h"

namespace longctx {

enum class SequenceStatus { kWaiting, kRunning, kFinished };

struct Sequence {
  uint64_t id = 0;
  SequenceStatus status = SequenceStatus::kWaiting;
  SamplingParams params;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t num_prompt_tokens = 0;
  int64_t num_computed = 0;      // tokens whose K/V the executor holds
  int64_t max_total_tokens = 0;  // cap on tokens: min(prompt + max_tokens, max_model_len)
  bool store_checked = false;    // its prompt was looked up in the KV store
  SamplerState sampler;
  StopStringMatcher stop_matcher;
  std::unique_ptr<TextStream> text_stream;  // null without a tokenizer
  // Where a structured output stands in its grammar; null without one.
  std::unique_ptr<structured::GrammarMatcher> grammar;
  RequestOutput output;
  // Speculative decoding: the prompt-lookup index of its tokens, and the draft of the next step
  // (proposed before scheduling, trimmed by the scheduler, verified after the step).
  NgramDrafter drafter;
  std::vector<int32_t> draft;

  int64_t num_generated() const { return static_cast<int64_t>(tokens.size()) - num_prompt_tokens; }
};

}  // namespace longctx
