#include "longctx/engine/executor_session.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/engine_core.h"
#include "kv/block_manager.h"
#include "longctx/core/error.h"

namespace longctx {

struct ExecutorSession::Impl {
  // One step's part of an input: tokens [begin, begin + n) of its sequence.
  struct Piece {
    size_t input = 0;
    uint64_t seq_id = 0;
    std::span<const int32_t> tokens;  // the input's all_tokens
    int64_t begin = 0, n = 0;
    bool last = false;  // the input's last piece (its logits row)
  };
  // A step's logits on the host, and the input each row belongs to.
  struct StepRows {
    std::vector<size_t> inputs;
    Tensor logits;  // [rows, vocab] f32
  };

  Impl(std::unique_ptr<Executor> x, const ExecutorSessionOptions& o)
      : executor(std::move(x)),
        options(o),
        blocks(make_block_manager(executor.get(), /*prefix_caching=*/false)) {}

  std::unique_ptr<Executor> executor;
  ExecutorSessionOptions options;
  BlockManager blocks;
  std::unordered_map<uint64_t, int64_t> num_tokens;  // per held sequence: K/V computed
  uint64_t next_scratch_id = ~uint64_t(0);           // prompt_logits' sequences, from the top

  int64_t held(uint64_t seq) const {
    auto it = num_tokens.find(seq);
    return it == num_tokens.end() ? 0 : it->second;
  }

  void drop(uint64_t seq) {
    blocks.free(seq);
    num_tokens.erase(seq);
  }

  // The inputs' new tokens cut into steps of the options' limits (a sequence's pieces in order,
  // one per step).
  std::vector<std::vector<Piece>> plan_steps(std::span<const SessionInput> inputs) const {
    std::vector<std::vector<Piece>> steps(1);
    int64_t room = options.max_num_batched_tokens;
    auto next_step = [&] {
      if (!steps.back().empty()) steps.emplace_back();
      room = options.max_num_batched_tokens;
    };
    std::unordered_set<uint64_t> seen;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const SessionInput& in = inputs[i];
      LONGCTX_CHECK(seen.insert(in.seq_id).second, ErrorCode::kInvalidArgument,
                    "executor session: sequence {} named twice in one run", in.seq_id);
      const int64_t total = static_cast<int64_t>(in.all_tokens.size());
      const int64_t begin = held(in.seq_id);
      const int64_t end = in.num_new > 0 ? begin + in.num_new : total;
      LONGCTX_CHECK(in.num_new >= 0 && begin < end && end <= total, ErrorCode::kInvalidArgument,
                    "executor session: sequence {} holds {} tokens and is asked to run [{}, {}) "
                    "of its {} tokens",
                    in.seq_id, begin, begin, end, total);
      LONGCTX_CHECK(options.max_model_len == 0 || end <= options.max_model_len,
                    ErrorCode::kOutOfRange,
                    "executor session: sequence {} reaches {} tokens, past max_model_len {}",
                    in.seq_id, end, options.max_model_len);
      for (int64_t b = begin; b < end;) {
        if (room == 0 || static_cast<int64_t>(steps.back().size()) == options.max_num_seqs)
          next_step();
        const int64_t n = std::min(end - b, room);
        steps.back().push_back({i, in.seq_id, in.all_tokens, b, n, b + n == end});
        b += n;
        room -= n;
        if (b < end) next_step();  // the sequence's next piece needs this one's K/V
      }
    }
    if (steps.back().empty()) steps.pop_back();
    return steps;
  }

  // Takes the blocks of one step's pieces; throws Error(kOutOfMemory) when they do not suffice.
  void allocate(std::span<const Piece> pieces, std::vector<KVBlockCopy>& copies) {
    for (const Piece& p : pieces) {
      if (!blocks.holds(p.seq_id)) {
        const BlockManager::Start r =
            blocks.start(p.seq_id, p.tokens.first(static_cast<size_t>(p.n)), p.n, &copies);
        LONGCTX_CHECK(r.num_cached >= 0, ErrorCode::kOutOfMemory,
                      "executor session: no KV blocks or state slot left to start sequence {} "
                      "({} tokens; {} blocks free of {}); release sequences or give the executor "
                      "more blocks",
                      p.seq_id, p.n, blocks.num_free_blocks(), blocks.num_blocks());
        LONGCTX_CHECK(r.num_cached == 0 && r.num_new == p.n, ErrorCode::kInternal,
                      "executor session: sequence {} started with {} cached and {} new tokens, "
                      "not 0 and {}",
                      p.seq_id, r.num_cached, r.num_new, p.n);
        num_tokens[p.seq_id] = 0;
      } else {
        LONGCTX_CHECK(blocks.append(p.seq_id, p.begin, p.n, &copies), ErrorCode::kOutOfMemory,
                      "executor session: no KV blocks left for tokens [{}, {}) of sequence {} ({} "
                      "blocks free of {}); release sequences or give the executor more blocks",
                      p.begin, p.begin + p.n, p.seq_id, blocks.num_free_blocks(),
                      blocks.num_blocks());
      }
    }
  }

  // Runs one step. `all_rows`: logits of every new token, else of each input's last.
  StepRows run_step(std::span<const Piece> pieces, bool all_rows) {
    std::vector<KVBlockCopy> copies;
    const int64_t extra = blocks.num_groups() - 1;
    std::vector<std::span<const int32_t>> group_tables(pieces.size() * extra);
    std::vector<StepInput> inputs;
    StepRows out;
    try {
      allocate(pieces, copies);
      // The tables are views of the block manager's: taken once every allocation is done.
      for (size_t i = 0; i < pieces.size(); ++i) {
        const Piece& p = pieces[i];
        const int64_t nb = blocks.blocks_for(p.begin + p.n);
        const std::span<std::span<const int32_t>> extra_tables(group_tables.data() + i * extra,
                                                               static_cast<size_t>(extra));
        blocks.step_tables(p.seq_id, p.begin + p.n, extra_tables);
        const bool want = all_rows || p.last;
        inputs.push_back({p.seq_id, p.tokens, p.begin, p.n, blocks.table(p.seq_id).first(nb), want,
                          extra_tables, -1, -1, all_rows ? p.n : 1});
        if (want) out.inputs.insert(out.inputs.end(), all_rows ? p.n : 1, p.input);
      }
      const Tensor logits = executor->execute(inputs, copies);
      out.logits = logits.device().is_cpu() ? logits : logits.to(Device::cpu());
    } catch (...) {
      blocks.end_step();
      for (const Piece& p : pieces) drop(p.seq_id);
      throw;
    }
    for (const Piece& p : pieces) {
      num_tokens[p.seq_id] = p.begin + p.n;
      blocks.commit(p.seq_id, p.tokens, p.begin + p.n);
    }
    blocks.end_step();
    const int64_t rows = static_cast<int64_t>(out.inputs.size());
    LONGCTX_CHECK(out.logits.rank() == 2 && out.logits.size(0) == rows &&
                      out.logits.size(1) == executor->vocab_size() &&
                      out.logits.dtype() == DType::kF32,
                  ErrorCode::kInternal, "executor session: a step of {} logits rows returned {}",
                  rows, out.logits.str());
    return out;
  }
};

ExecutorSession::ExecutorSession(std::unique_ptr<Executor> executor,
                                 const ExecutorSessionOptions& options) {
  LONGCTX_CHECK(executor != nullptr, ErrorCode::kInvalidArgument, "executor session: no executor");
  LONGCTX_CHECK(
      options.max_num_batched_tokens > 0 && options.max_num_seqs > 0 && options.max_model_len >= 0,
      ErrorCode::kInvalidArgument,
      "executor session: max_num_batched_tokens ({}) and max_num_seqs ({}) must be "
      "positive, max_model_len ({}) not negative",
      options.max_num_batched_tokens, options.max_num_seqs, options.max_model_len);
  impl_ = std::make_unique<Impl>(std::move(executor), options);
}

ExecutorSession::~ExecutorSession() = default;
ExecutorSession::ExecutorSession(ExecutorSession&&) noexcept = default;
ExecutorSession& ExecutorSession::operator=(ExecutorSession&&) noexcept = default;

Executor& ExecutorSession::executor() { return *impl_->executor; }

int64_t ExecutorSession::vocab_size() const { return impl_->executor->vocab_size(); }

const ExecutorSessionOptions& ExecutorSession::options() const { return impl_->options; }

Tensor ExecutorSession::run(std::span<const SessionInput> inputs) {
  Impl& m = *impl_;
  const int64_t vocab = vocab_size();
  Tensor out = Tensor::empty({static_cast<int64_t>(inputs.size()), vocab}, DType::kF32);
  for (const std::vector<Impl::Piece>& step : m.plan_steps(inputs)) {
    const Impl::StepRows r = m.run_step(step, /*all_rows=*/false);
    for (size_t row = 0; row < r.inputs.size(); ++row)
      std::memcpy(out.data<float>() + r.inputs[row] * vocab, r.logits.data<float>() + row * vocab,
                  vocab * sizeof(float));
  }
  return out;
}

Tensor ExecutorSession::prompt_logits(std::span<const int32_t> ids) {
  Impl& m = *impl_;
  const int64_t n = static_cast<int64_t>(ids.size()), vocab = vocab_size();
  LONGCTX_CHECK(n > 0, ErrorCode::kInvalidArgument, "executor session: no prompt tokens");
  const SessionInput in{m.next_scratch_id--, ids, n};
  Tensor out = Tensor::empty({n, vocab}, DType::kF32);
  int64_t row = 0;
  for (const std::vector<Impl::Piece>& step : m.plan_steps({&in, 1})) {
    const Impl::StepRows r = m.run_step(step, /*all_rows=*/true);
    const int64_t rows = r.logits.size(0);
    std::memcpy(out.data<float>() + row * vocab, r.logits.data<float>(),
                rows * vocab * sizeof(float));
    row += rows;
  }
  m.drop(in.seq_id);
  return out;
}

void ExecutorSession::release(uint64_t seq_id) { impl_->drop(seq_id); }

int64_t ExecutorSession::num_tokens(uint64_t seq_id) const { return impl_->held(seq_id); }

int64_t ExecutorSession::num_free_blocks() const { return impl_->blocks.num_free_blocks(); }

}  // namespace longctx
