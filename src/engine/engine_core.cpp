#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>

#include "longctx/core/error.h"

namespace longctx {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

EngineCore::EngineCore(std::unique_ptr<Executor> executor, const Tokenizer* tokenizer,
                       EngineCoreOptions options)
    : executor_(std::move(executor)),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      seed_rng_(options_.seed) {
  LONGCTX_CHECK(executor_ != nullptr, ErrorCode::kInvalidArgument, "null executor");
  LONGCTX_CHECK(options_.max_model_len > 0, ErrorCode::kInvalidArgument,
                "max_model_len must be > 0, got {}", options_.max_model_len);
}

EngineCore::~EngineCore() = default;

void EngineCore::check_request(std::span<const int32_t> prompt,
                               const SamplingParams& params) const {
  params.validate();
  // As vLLM: a request needs at least one prompt token to predict from.
  LONGCTX_CHECK(!prompt.empty(), ErrorCode::kInvalidArgument,
                "the prompt is empty: a request needs at least one prompt token");
  const auto n = static_cast<int64_t>(prompt.size());
  LONGCTX_CHECK(n <= options_.max_model_len, ErrorCode::kOutOfRange,
                "the prompt has {} tokens, longer than the maximum model length of {} tokens "
                "(max_model_len)",
                n, options_.max_model_len);
  const int64_t vocab = vocab_size();
  for (size_t i = 0; i < prompt.size(); ++i) {
    LONGCTX_CHECK(prompt[i] >= 0 && prompt[i] < vocab, ErrorCode::kInvalidArgument,
                  "prompt token {} (at position {}) is outside the vocabulary [0, {})", prompt[i],
                  i, vocab);
  }
  for (int32_t t : params.stop_token_ids) {
    LONGCTX_CHECK(t < vocab, ErrorCode::kInvalidArgument,
                  "stop token id {} is outside the vocabulary [0, {})", t, vocab);
  }
  LONGCTX_CHECK(params.stop.empty() || tokenizer_ != nullptr, ErrorCode::kInvalidArgument,
                "stop strings need a tokenizer (this engine has none: use stop_token_ids)");
}

uint64_t EngineCore::add_request(size_t index, std::vector<int32_t> prompt,
                                 const SamplingParams& params, double arrival_time) {
  check_request(prompt, params);
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->params = params;
  seq->num_prompt_tokens = static_cast<int64_t>(prompt.size());
  // Compared as a difference: prompt + max_tokens overflows for max_tokens near INT64_MAX.
  seq->max_total_tokens = params.max_tokens >= options_.max_model_len - seq->num_prompt_tokens
                              ? options_.max_model_len
                              : seq->num_prompt_tokens + params.max_tokens;
  const uint64_t seed = params.seed ? *params.seed : seed_rng_();
  seq->sampler = SamplerState(params, seed, prompt);
  seq->stop_matcher = StopStringMatcher(params.stop);
  if (tokenizer_ != nullptr) {
    seq->text_stream = make_text_stream(*tokenizer_, prompt, params.skip_special_tokens);
  }
  seq->output.index = index;
  seq->output.prompt_token_ids = prompt;
  seq->output.metrics.arrival = arrival_time;
  seq->output.metrics.num_prompt_tokens = seq->num_prompt_tokens;
  seq->tokens = std::move(prompt);
  const uint64_t id = seq->id;
  waiting_.push_back(std::move(seq));
  return id;
}

std::vector<StepUpdate> EngineCore::step(StepStats* stats) {
  std::vector<StepUpdate> updates;
  const double t0 = now_seconds();
  if (running_ == nullptr) {
    if (waiting_.empty()) return updates;
    running_ = std::move(waiting_.front());
    waiting_.pop_front();
    running_->status = SequenceStatus::kRunning;
    running_->output.metrics.scheduled = t0;
  }
  Sequence& seq = *running_;
  StepInput input{seq.id, seq.tokens, seq.num_computed, seq.max_total_tokens};
  const int64_t fed = static_cast<int64_t>(seq.tokens.size()) - seq.num_computed;
  Tensor logits = executor_->execute(std::span<const StepInput>(&input, 1));
  seq.num_computed = static_cast<int64_t>(seq.tokens.size());
  const int64_t vocab = vocab_size();
  SampleResult sample =
      sample_token(std::span<const float>(logits.data<float>(), vocab), seq.params, seq.sampler);
  const double t1 = now_seconds();
  if (stats != nullptr) {
    const bool prefill = seq.num_generated() == 0;
    stats->prefill_tokens += prefill ? fed : 0;
    stats->decode_tokens += prefill ? 0 : 1;
    stats->seconds += t1 - t0;
  }
  updates.push_back(postprocess(seq, sample, t1));
  if (updates.back().finished) {
    executor_->release(seq.id);
    finished_.push_back(std::move(running_));
  }
  return updates;
}

StepUpdate EngineCore::postprocess(Sequence& seq, const SampleResult& sample, double now) {
  const int32_t token = sample.token;
  RequestOutput& out = seq.output;
  StepUpdate update;
  update.seq = &seq;
  update.num_new_tokens = 1;
  seq.tokens.push_back(token);
  seq.sampler.append_output(token);
  out.token_ids.push_back(token);
  if (seq.params.logprobs) out.logprobs.push_back(sample.logprobs);
  if (out.token_ids.size() == 1) out.metrics.first_token = now;

  // Precedence: a stop token (the model ended), then a stop string, then the length limits.
  const auto& eos = options_.eos_token_ids;
  const auto& stop_ids = seq.params.stop_token_ids;
  if (!seq.params.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
    out.stop_reason = {StopReason::Kind::kEos, token, {}};
  } else if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
    out.stop_reason = {StopReason::Kind::kStopToken, token, {}};
  }
  const bool token_stop = out.stop_reason.kind != StopReason::Kind::kNone;
  // As vLLM, a stop token's own text is not part of the output.
  if (seq.text_stream != nullptr && !token_stop) {
    auto u = seq.stop_matcher.append(seq.text_stream->push(token));
    update.text = std::move(u.emit);
    if (u.stop_index) {
      out.stop_reason = {StopReason::Kind::kStopString, -1,
                         seq.stop_matcher.stops()[*u.stop_index]};
    }
  }
  FinishReason reason = FinishReason::kNone;
  if (out.stop_reason.kind != StopReason::Kind::kNone) {
    reason = FinishReason::kStop;
  } else if (seq.num_generated() >= seq.params.max_tokens ||
             static_cast<int64_t>(seq.tokens.size()) >= options_.max_model_len) {
    reason = FinishReason::kLength;
  }
  if (reason != FinishReason::kNone) {
    if (seq.text_stream != nullptr && !seq.stop_matcher.stopped()) {
      // Release what was held back: bytes of an unfinished character, a partial stop string.
      auto u = seq.stop_matcher.append(seq.text_stream->finish());
      update.text += u.emit;
      if (u.stop_index && !token_stop) {
        out.stop_reason = {StopReason::Kind::kStopString, -1,
                           seq.stop_matcher.stops()[*u.stop_index]};
        reason = FinishReason::kStop;
      }
      if (!seq.stop_matcher.stopped()) update.text += seq.stop_matcher.flush();
    }
    out.text = seq.stop_matcher.text();
    finish(seq, reason, now);
    update.finished = true;
  }
  return update;
}

void EngineCore::finish(Sequence& seq, FinishReason reason, double now) {
  seq.status = SequenceStatus::kFinished;
  seq.output.finish_reason = reason;
  seq.output.metrics.finished = now;
  seq.output.metrics.num_generated_tokens = seq.num_generated();
}

bool EngineCore::abort(uint64_t id) {
  const double now = now_seconds();
  if (running_ != nullptr && running_->id == id) {
    executor_->release(id);
    finish(*running_, FinishReason::kAbort, now);
    finished_.push_back(std::move(running_));
    return true;
  }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id != id) continue;
    finish(**it, FinishReason::kAbort, now);
    finished_.push_back(std::move(*it));
    waiting_.erase(it);
    return true;
  }
  return false;
}

EngineStats EngineCore::stats() const {
  EngineStats s;
  s.num_running = running_ != nullptr ? 1 : 0;
  s.num_waiting = static_cast<int64_t>(waiting_.size());
  return s;
}

void EngineCore::abort_all() {
  if (running_ != nullptr) executor_->release(running_->id);
  running_.reset();
  waiting_.clear();
  finished_.clear();
}

std::vector<RequestOutput> EngineCore::take_finished() {
  std::vector<RequestOutput> outs;
  for (auto& seq : finished_) outs.push_back(std::move(seq->output));
  finished_.clear();
  return outs;
}

}  // namespace longctx
