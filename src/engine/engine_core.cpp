#include "engine/engine_core.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "engine/kv_event_publisher.h"
#include "engine/kv_store.h"
#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"
#include "longctx/core/logging.h"
#include "longctx/core/parallel.h"
#include "longctx/tokenizer/tokenizer.h"
#include "ops/gather_rows.h"
#include "structured/json_schema.h"
#include "structured/regex.h"

namespace longctx {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

namespace {

KVBlockLayout layout_of(const Executor* executor) {
  LONGCTX_CHECK(executor != nullptr, ErrorCode::kInvalidArgument, "null executor");
  const KVBlockLayout l = executor->kv_layout();
  LONGCTX_CHECK(l.num_blocks > 0 && l.block_size > 0, ErrorCode::kInvalidArgument,
                "executor offers {} KV blocks of {} tokens", l.num_blocks, l.block_size);
  return l;
}

// The tokens `seq`'s grammar allows next, within what its request may still generate. Throws
// Error when the grammar fails (past its bounds).
void fill_grammar_mask(Sequence& seq) {
  std::vector<uint32_t>& mask = seq.sampler.token_mask();
  mask.resize(static_cast<size_t>(seq.grammar->grammar().vocab().mask_words()));
  seq.grammar->fill_mask(seq.max_total_tokens - static_cast<int64_t>(seq.tokens.size()), mask);
}

// A grammar that failed ends its own request: logged, and its row samples without a mask.
void drop_grammar_mask(Sequence& seq, std::string_view why) {
  LONGCTX_LOG_ERROR("structured output of request {} aborted: {}", seq.output.index, why);
  seq.sampler.token_mask().clear();
}

// fill_grammar_mask for each constrained row. Each row first walks the bytes of the token its last
// step took (GrammarMatcher::settle), then fills its mask: independent CPU work per row, done over
// the thread pool while the device runs the step, so neither the walk nor the mask sits between a
// step's sampled tokens and the next step's launch. The masks of states met for the first time
// (whole-vocabulary walks) are computed in between, each split over the pool (prepare_masks),
// rather than each on the one thread its row landed on. A row whose grammar fails ends its own
// request (abort), not the batch: its entry of the result is 1.
std::vector<uint8_t> fill_grammar_masks(std::span<Sequence* const> rows,
                                        std::span<const size_t> constrained) {
  std::vector<uint8_t> dropped(rows.size(), 0);
  std::vector<std::string> errors(constrained.size());
  std::vector<std::exception_ptr> fatal(constrained.size());
  auto over_rows = [&](const std::function<void(Sequence&)>& work) {
    parallel_for(static_cast<int64_t>(constrained.size()), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (!errors[i].empty() || fatal[i]) continue;
        try {
          work(*rows[constrained[i]]);
        } catch (const Error& e) {
          errors[i] = e.what();
        } catch (...) {
          fatal[i] = std::current_exception();
        }
      }
    });
  };
  over_rows([](Sequence& seq) { seq.grammar->settle(); });
  std::vector<structured::GrammarMatcher*> matchers;
  for (size_t i = 0; i < constrained.size(); ++i) {
    if (errors[i].empty() && !fatal[i]) matchers.push_back(rows[constrained[i]]->grammar.get());
  }
  structured::prepare_masks(matchers);
  over_rows(fill_grammar_mask);
  for (size_t i = 0; i < constrained.size(); ++i) {
    if (fatal[i]) std::rethrow_exception(fatal[i]);
    if (errors[i].empty()) continue;
    drop_grammar_mask(*rows[constrained[i]], errors[i]);
    dropped[constrained[i]] = 1;
  }
  return dropped;
}

}  // namespace

BlockManager make_block_manager(const Executor* executor, bool prefix_caching) {
  KVBlockLayout l = layout_of(executor);
  if (l.groups.empty()) l.groups.push_back(KvGroupAlloc{});
  return BlockManager(l.num_blocks, l.block_size, prefix_caching, std::move(l.groups),
                      l.num_state_slots, l.num_state_snapshots, l.num_window_blocks);
}

EngineCore::EngineCore(std::unique_ptr<Executor> executor, const Tokenizer* tokenizer,
                       EngineCoreOptions options)
    : executor_(std::move(executor)),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      blocks_(make_block_manager(executor_.get(), options_.enable_prefix_caching)),
      scheduler_(options_.scheduler, blocks_),
      seed_rng_(options_.seed) {
  LONGCTX_CHECK(options_.max_model_len > 0, ErrorCode::kInvalidArgument,
                "max_model_len must be > 0, got {}", options_.max_model_len);
  if (options_.kv_events.enabled()) {
    LONGCTX_CHECK(options_.enable_prefix_caching, ErrorCode::kInvalidArgument,
                  "--kv-events-config enables KV-cache events, but prefix caching is off "
                  "(--no-enable-prefix-caching): no block would ever be stored");
    kv_events_ = std::make_unique<KvEventPublisher>(options_.kv_events, blocks_.block_size(),
                                                    options_.kv_medium);
    blocks_.record_events(true);
  }
  if (!options_.kv_store.empty()) {
    LONGCTX_CHECK(options_.enable_prefix_caching, ErrorCode::kInvalidArgument,
                  "--kv-store needs prefix caching (it shares the prefix cache's blocks), which "
                  "--no-enable-prefix-caching turns off");
    LONGCTX_CHECK(
        executor_->kv_block_bytes() > 0 && blocks_.num_groups() == 1, ErrorCode::kUnsupported,
        "--kv-store: this engine cannot export its KV blocks (the store needs a resident KV "
        "cache of one full-attention group and no sparse policy: no offload)");
    // A prefill step's full blocks (128 of 16 MiB for a 16K-token chunk) wait in the store's
    // export queue for staging buffers, which the store's writer pins when it starts.
    KvStoreOptions store;
    store.pinned = executor_->kv_block_io_pinned();
    kv_store_ =
        std::make_unique<KvStore>(options_.kv_store,
                                  fmt::format("{}:{}:{}", options_.kv_store_namespace,
                                              executor_->kv_block_format(), blocks_.block_size()),
                                  blocks_.block_size(), executor_->kv_block_bytes(), store);
    blocks_.record_events(true);
  }
  if (options_.speculative.enabled()) {
    options_.speculative = options_.speculative.resolved();
    for (int64_t g = 0; g < blocks_.num_groups(); ++g) {
      LONGCTX_CHECK(blocks_.group(g).kind != KvGroupKind::kState, ErrorCode::kUnsupported,
                    "speculative decoding: this model has linear-attention layers, whose "
                    "recurrent state cannot be rolled back past rejected draft tokens");
    }
    spec_ = std::make_unique<SpeculativeDecoder>(options_.speculative);
  } else {
    options_.speculative.resolved();  // lookup sizes or K without a method are refused
  }
}

void EngineCore::publish_kv_events() {
  if (kv_events_ == nullptr && kv_store_ == nullptr) return;
  std::vector<KvCacheEvent> events = blocks_.take_events();
  if (kv_store_ != nullptr) {
    const int64_t bs = blocks_.block_size();
    for (const KvCacheEvent& e : events) {
      if (e.kind != KvCacheEvent::Kind::kStored || e.imported) continue;
      uint64_t parent = e.parent_block_hash.value_or(0);
      for (size_t i = 0; i < e.block_ids.size(); ++i) {
        kv_store_->queue_export(e.block_ids[i], e.block_hashes[i], parent,
                                std::span(e.token_ids).subspan(i * bs, static_cast<size_t>(bs)));
        parent = e.block_hashes[i];
      }
    }
    // Started during the next step, while the device runs it (a GPU export enqueues a copy per
    // layer tensor: host time a decode step would otherwise wait for); now when none follows.
    if (scheduler_.empty()) start_kv_exports();
  }
  if (kv_events_ != nullptr && !events.empty()) kv_events_->publish(std::move(events));
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
  if (params.structured.enabled()) grammar_for(params.structured);
  // Every sequence must fit the pool alone, or the scheduler could never finish it.
  const int64_t most = max_total_tokens(n, params);
  const int64_t step = options_.scheduler.max_num_batched_tokens;
  const int64_t window_held = blocks_.max_blocks_held(most, step, BlockPool::kWindow);
  LONGCTX_CHECK(window_held <= blocks_.pool_blocks(BlockPool::kWindow), ErrorCode::kOutOfMemory,
                "the request's sliding windows need {} blocks of the GPU-resident window pool, "
                "which holds {} (KV offload keeps the windows resident: give it more GPU memory)",
                window_held, blocks_.pool_blocks(BlockPool::kWindow));
  const int64_t held = blocks_.max_blocks_held(most, step);
  LONGCTX_CHECK(held <= blocks_.pool_blocks(BlockPool::kMain), ErrorCode::kOutOfMemory,
                "the request may need KV for {} tokens (a {}-token prompt + max_tokens {}, capped "
                "by max_model_len {}: {} blocks of its KV groups), more than the whole KV cache "
                "holds ({} blocks of {} tokens = {} tokens): lower max_tokens or give the KV "
                "cache more memory",
                most, n, params.max_tokens, options_.max_model_len, held,
                blocks_.pool_blocks(BlockPool::kMain), blocks_.block_size(),
                blocks_.pool_blocks(BlockPool::kMain) * blocks_.block_size());
}

std::shared_ptr<const structured::CompiledGrammar> EngineCore::grammar_for(
    const StructuredOutput& output) const {
  // Schemas kept compiled; past it the cache starts over.
  constexpr size_t kMaxCachedGrammars = 256;
  LONGCTX_CHECK(tokenizer_ != nullptr, ErrorCode::kInvalidArgument,
                "structured outputs need a tokenizer (this engine has none)");
  std::string key;
  switch (output.kind) {
    case StructuredOutput::Kind::kJsonSchema:
      key = "schema:" + output.json_schema;
      break;
    case StructuredOutput::Kind::kRegex:
      key = "regex:" + output.regex;
      break;
    case StructuredOutput::Kind::kChoice:
      // Length-prefixed, so no choice text can fake a boundary.
      key = "choice:";
      for (const std::string& c : output.choices) key += std::to_string(c.size()) + ":" + c;
      break;
    default:
      key = "json_object";
  }
  if (auto it = grammars_.find(key); it != grammars_.end()) return it->second;
  structured::Grammar g = [&] {
    switch (output.kind) {
      case StructuredOutput::Kind::kJsonSchema:
        return structured::json_schema_grammar(
            parse_ordered_json(output.json_schema, "JSON schema"));
      case StructuredOutput::Kind::kRegex:
        return structured::regex_grammar(output.regex);
      case StructuredOutput::Kind::kChoice:
        return structured::choice_grammar(output.choices);
      default:
        return structured::any_json_object_grammar();
    }
  }();
  if (grammar_vocab_ == nullptr) {
    const int64_t logits = vocab_size();
    const auto n = std::min<int64_t>(static_cast<int64_t>(tokenizer_->vocab_size()), logits);
    std::vector<std::string> bytes(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      const auto id = static_cast<TokenId>(t);
      if (tokenizer_->is_valid_id(id) && !tokenizer_->is_special(id)) {
        bytes[t] = std::string(tokenizer_->token_bytes(id));
      }
    }
    std::vector<int32_t> eos;
    for (int64_t e : options_.eos_token_ids) {
      if (e >= 0 && e < logits) eos.push_back(static_cast<int32_t>(e));
    }
    grammar_vocab_ =
        std::make_shared<structured::TokenVocabulary>(std::move(bytes), std::move(eos), logits);
  }
  auto compiled = std::make_shared<const structured::CompiledGrammar>(std::move(g), grammar_vocab_);
  if (grammars_.size() >= kMaxCachedGrammars) grammars_.clear();
  grammars_.emplace(key, compiled);
  return compiled;
}

int64_t EngineCore::max_total_tokens(int64_t prompt_len, const SamplingParams& params) const {
  // Compared as a difference: prompt + max_tokens overflows for max_tokens near INT64_MAX.
  return params.max_tokens >= options_.max_model_len - prompt_len ? options_.max_model_len
                                                                  : prompt_len + params.max_tokens;
}

uint64_t EngineCore::add_request(size_t index, std::vector<int32_t> prompt,
                                 const SamplingParams& params, double arrival_time) {
  check_request(prompt, params);
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->params = params;
  seq->num_prompt_tokens = static_cast<int64_t>(prompt.size());
  seq->max_total_tokens = max_total_tokens(seq->num_prompt_tokens, params);
  const uint64_t seed = params.seed ? *params.seed : seed_rng_();
  seq->sampler = SamplerState(params, seed, prompt);
  seq->stop_matcher = StopStringMatcher(params.stop);
  if (params.structured.enabled()) {
    seq->grammar = std::make_unique<structured::GrammarMatcher>(grammar_for(params.structured));
  }
  if (tokenizer_ != nullptr) {
    seq->text_stream = make_text_stream(*tokenizer_, prompt, params.skip_special_tokens);
  }
  if (spec_ != nullptr) seq->drafter = spec_->make_drafter();
  seq->output.index = index;
  seq->output.prompt_token_ids = prompt;
  seq->output.metrics.arrival = arrival_time;
  seq->output.metrics.num_prompt_tokens = seq->num_prompt_tokens;
  seq->tokens = std::move(prompt);
  const uint64_t id = seq->id;
  scheduler_.add(seq.get());
  live_.emplace(id, std::move(seq));
  return id;
}

std::vector<StepUpdate> EngineCore::step(StepStats* stats,
                                         const std::function<void()>& on_scheduled) {
  std::vector<StepUpdate> updates;
  const double t0 = now_seconds();
  // Decode steps (nothing waiting, nothing loading) skip the lookup's walk over the sequences.
  if (kv_store_ != nullptr) {
    if (options_.kv_store_sync_reads) {
      if (scheduler_.num_waiting() > 0) import_from_store();
    } else if (scheduler_.num_waiting() > 0 || !loads_.empty()) {
      advance_store_loads();
    }
  }
  if (spec_ != nullptr) {
    for (Sequence* seq : scheduler_.all()) spec_->propose(*seq);
  }
  SchedulerOutput out = scheduler_.schedule();
  if (!loaded_.empty()) unpin_loaded_blocks();
  if (out.empty()) {
    if (!loads_.empty()) {
      // Only requests whose blocks load are left: wait a little for the store, then hand back
      // to the caller (EngineLoop admits requests and aborts between steps).
      loads_.front().load->wait(std::chrono::milliseconds(20));
      return updates;
    }
    // Every live sequence fits the pool alone, so an empty step with work left is a bug.
    LONGCTX_CHECK(scheduler_.empty(), ErrorCode::kInternal,
                  "scheduler: nothing runnable with {} running and {} waiting sequences",
                  scheduler_.num_running(), scheduler_.num_waiting());
    return updates;
  }
  std::vector<StepInput> inputs;
  inputs.reserve(out.seqs.size());
  // Groups 1..G-1's tables of every input (none with one group), [inputs][G - 1].
  const int64_t extra = blocks_.num_groups() - 1;
  std::vector<std::span<const int32_t>> group_tables(out.seqs.size() * extra);
  int64_t prefill = 0, decode = 0;
  bool speculative = false;
  for (const ScheduledSeq& s : out.seqs) {
    Sequence& seq = *s.seq;
    if (seq.output.metrics.scheduled == 0) seq.output.metrics.scheduled = t0;
    const int64_t end = seq.num_computed + s.num_new;
    const int64_t nb = blocks_.blocks_for(end);
    const std::span<std::span<const int32_t>> extra_tables(
        group_tables.data() + inputs.size() * extra, static_cast<size_t>(extra));
    blocks_.step_tables(seq.id, end, extra_tables);
    const bool is_decode = s.num_new - s.num_draft == 1 && seq.num_generated() > 0 &&
                           seq.num_computed == static_cast<int64_t>(seq.tokens.size()) - 1;
    (is_decode ? decode : prefill) += s.num_new - s.num_draft;
    // The draft rides in the sequence's tokens for the step only (verify_draft takes it out).
    if (s.num_draft > 0) {
      seq.tokens.insert(seq.tokens.end(), seq.draft.begin(), seq.draft.end());
      speculative = true;
    }
    inputs.push_back({seq.id, seq.tokens, seq.num_computed, s.num_new,
                      blocks_.table(seq.id).first(nb), s.sample, extra_tables, s.state_restore,
                      s.state_save, s.num_draft + 1});
  }
  auto drop_drafts = [&] {
    for (const ScheduledSeq& s : out.seqs)
      if (s.num_draft > 0) s.seq->tokens.resize(s.seq->tokens.size() - s.seq->draft.size());
  };
  if (on_scheduled) on_scheduled();
  Tensor logits;
  try {
    forget_overwritten_exports(inputs, out.copies);
    logits = executor_->execute(inputs, out.copies);
    // The copies of blocks waiting for export are enqueued while the device runs the step
    // (ordered after it), into staging buffers freed since the last step; on a device (pinned
    // block I/O) not in a step of decodes alone, unless the export queue is half full. Measured
    // on the H100's 8B decode: +8.6 % TPOT with copies in decode steps, but that run also grew
    // the pinned pool while decoding, which alone cost +9.7 % (kv_store.cpp, run_writer); with
    // the pool pinned at start and copies kept to prefill steps, +0.0 %. Whether copies in
    // decode steps cost anything by themselves is not measured.
    if (kv_store_ != nullptr &&
        (prefill > 0 || !executor_->kv_block_io_pinned() ||
         2 * kv_store_->num_waiting_exports() > kv_store_->max_waiting_exports()))
      start_kv_exports();
  } catch (...) {
    drop_drafts();
    scheduler_.fail(out);
    publish_kv_events();  // the evictions of the schedule happened
    throw;
  }
  drop_drafts();
  scheduler_.complete(out);
  prompt_tokens_ += prefill;

  // Rows of logits: one per sampling sequence, 1 + k per verifying one. The plain rows go to the
  // executor's sampler (gathered when drafts sit between them); drafts are verified on the host.
  std::vector<Sequence*> rows;
  std::vector<const SamplingParams*> params;
  std::vector<SamplerState*> states;
  std::vector<size_t> constrained;  // rows with a grammar
  std::vector<int32_t> plain_rows;
  std::vector<std::pair<Sequence*, int64_t>> verify;  // sequence, its first logits row
  int64_t row = 0;
  for (const ScheduledSeq& s : out.seqs) {
    if (!s.sample) continue;
    if (s.num_draft > 0) {
      verify.emplace_back(s.seq, row);
      row += s.num_draft + 1;
      continue;
    }
    plain_rows.push_back(static_cast<int32_t>(row++));
    if (s.seq->grammar != nullptr) constrained.push_back(rows.size());
    rows.push_back(s.seq);
    params.push_back(&s.seq->params);
    states.push_back(&s.seq->sampler);
  }
  // a grammar past its bounds: the row is sampled, then discarded
  const std::vector<uint8_t> dropped = fill_grammar_masks(rows, constrained);
  Tensor plain_logits = logits, host_logits;
  if (speculative) {
    // Only the verifying rows come to the host; the plain rows stay where the sampler wants them.
    host_logits = logits.device().is_cpu() ? logits : logits.to(Device::cpu());
    if (!plain_rows.empty()) {
      const auto n = static_cast<int64_t>(plain_rows.size());
      Tensor idx = Tensor::empty({n}, DType::kI32);
      std::copy(plain_rows.begin(), plain_rows.end(), idx.data<int32_t>());
      plain_logits = Tensor::empty({n, logits.size(1)}, DType::kF32, logits.device());
      ops::gather_rows(logits, idx.to(logits.device()), plain_logits);
    }
  }
  std::vector<SampleResult> samples;
  if (!rows.empty()) samples = executor_->sample(plain_logits, params, states);
  LONGCTX_CHECK(samples.size() == rows.size(), ErrorCode::kInternal,
                "executor sampled {} tokens for {} rows", samples.size(), rows.size());
  const double t1 = now_seconds();
  auto retire_if_finished = [&](Sequence* seq) {
    if (!updates.back().finished) return;
    scheduler_.remove(seq);
    retire(seq->id);
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    if (dropped[i]) {
      abort_structured(*rows[i], t1);
      StepUpdate u;
      u.seq = rows[i];
      u.finished = true;
      updates.push_back(std::move(u));
    } else {
      ++generation_tokens_;
      updates.push_back(postprocess(*rows[i], samples[i], t1));
    }
    retire_if_finished(rows[i]);
  }
  const int64_t vocab = vocab_size();
  for (const auto& [seq, first] : verify) {
    updates.push_back(verify_draft(*seq, host_logits.data<float>() + first * vocab, t1));
    retire_if_finished(seq);
  }
  publish_kv_events();
  if (stats != nullptr) {
    stats->prefill_tokens += prefill;
    stats->decode_tokens += decode;
    stats->seconds += t1 - t0;
  }
  return updates;
}

StepUpdate EngineCore::verify_draft(Sequence& seq, const float* rows, double now) {
  const int64_t vocab = vocab_size();
  const std::vector<int32_t> draft = std::move(seq.draft);
  const auto k = static_cast<int64_t>(draft.size());
  StepUpdate update;
  update.seq = &seq;
  int64_t accepted = 0;
  for (int64_t i = 0; i <= k; ++i) {
    // A constrained position's mask is its grammar's after the tokens accepted before it; a draft
    // token the grammar refuses has probability 0 under it, so it is rejected like any other.
    if (seq.grammar != nullptr && !fill_verify_mask(seq, now)) {
      update.finished = true;
      break;
    }
    bool ok = false;
    const SampleResult r =
        verify_position(std::span<const float>(rows + i * vocab, static_cast<size_t>(vocab)),
                        seq.params, seq.sampler, i < k ? draft[i] : -1, &ok);
    ++generation_tokens_;
    StepUpdate u = postprocess(seq, r, now);
    update.text += u.text;
    update.num_new_tokens += u.num_new_tokens;
    if (ok && i < k) ++accepted;
    if (u.finished) {
      update.finished = true;
      break;
    }
    if (!ok) break;
  }
  spec_->record(k, accepted);
  RequestMetrics& m = seq.output.metrics;
  ++m.num_drafts;
  m.num_draft_tokens += k;
  m.num_accepted_tokens += accepted;
  // The K/V holds the last sampled token and the accepted draft: every token but the new last.
  if (!update.finished)
    scheduler_.finish_speculative(&seq, static_cast<int64_t>(seq.tokens.size()) - 1);
  return update;
}

bool EngineCore::fill_verify_mask(Sequence& seq, double now) {
  try {
    fill_grammar_mask(seq);
    return true;
  } catch (const Error& e) {
    drop_grammar_mask(seq, e.what());
    abort_structured(seq, now);
    return false;
  }
}

void EngineCore::abort_structured(Sequence& seq, double now) {
  seq.output.text = seq.stop_matcher.text();
  finish(seq, FinishReason::kAbort, now);
}

void EngineCore::retire(uint64_t id) {
  auto it = live_.find(id);
  LONGCTX_CHECK(it != live_.end(), ErrorCode::kInternal, "engine: sequence {} is not live", id);
  finished_.push_back(std::move(it->second));
  live_.erase(it);
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
  bool grammar_end = false;
  if (seq.grammar != nullptr) {
    // The mask allowed only tokens the grammar takes. Whether the document ends with the token
    // is known from the mask; the walk over its bytes waits for the next step's mask fill.
    LONGCTX_CHECK(seq.grammar->take(token), ErrorCode::kInternal,
                  "structured output: sampled token {} is outside the grammar", token);
    grammar_end = seq.grammar->terminated();
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
  if (out.stop_reason.kind != StopReason::Kind::kNone || grammar_end) {
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
  auto it = live_.find(id);
  if (it == live_.end()) return false;
  Sequence& seq = *it->second;
  drop_store_loads(id);
  scheduler_.remove(&seq);
  seq.output.text = seq.stop_matcher.text();
  finish(seq, FinishReason::kAbort, now_seconds());
  retire(id);
  return true;
}

EngineStats EngineCore::stats() const {
  EngineStats s;
  s.num_running = scheduler_.num_running();
  s.num_waiting = scheduler_.num_waiting();
  const BlockManagerStats b = blocks_.stats();
  s.kv_blocks_total = b.num_blocks;
  s.kv_block_size = blocks_.block_size();
  s.kv_blocks_used = b.used_blocks;
  s.kv_group_blocks_used = b.group_used_blocks;
  s.prefix_cache_queries = b.queries;
  s.prefix_cache_hits = b.hits;
  s.state_snapshots_total = b.num_snapshots;
  s.state_snapshots_held = b.snapshots_held;
  s.state_snapshot_restores = b.snapshot_restores;
  s.num_preemptions = scheduler_.num_preemptions();
  s.prompt_tokens = prompt_tokens_;
  s.generation_tokens = generation_tokens_;
  s.executor = executor_->counters();
  if (spec_ != nullptr) s.spec_decode = spec_->stats();
  if (kv_store_ != nullptr) {
    const KvStoreStats k = kv_store_->stats();
    s.kv_store_hits = k.hits;
    s.kv_store_misses = k.misses;
    s.kv_store_errors = k.errors;
    s.kv_store_bytes_read = k.bytes_read;
    s.kv_store_bytes_written = k.bytes_written;
    s.kv_store_writes_dropped = k.writes_dropped;
  }
  return s;
}

void EngineCore::abort_all() {
  for (auto& [id, seq] : live_) {
    drop_store_loads(id);
    scheduler_.remove(seq.get());
  }
  live_.clear();
  finished_.clear();
}

std::vector<RequestOutput> EngineCore::take_finished() {
  std::vector<RequestOutput> outs;
  for (auto& seq : finished_) outs.push_back(std::move(seq->output));
  finished_.clear();
  return outs;
}

}  // namespace longctx
