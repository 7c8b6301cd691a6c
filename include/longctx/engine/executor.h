// What the engine asks of a model backend: feed each scheduled sequence its new tokens and give
// back the next-token logits. The CPU reference model sits behind it now; the GPU runner (paged
// KV, continuous batching) and test scripts implement the same interface.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "longctx/core/tensor.h"

namespace longctx {

class Model;

struct StepInput {
  uint64_t seq_id = 0;
  std::span<const int32_t> all_tokens;  // prompt + generated so far
  int64_t num_computed =
      0;  // tokens already in this sequence's cache; feed all_tokens[num_computed:]
  int64_t max_tokens = 0;  // the most tokens this sequence will ever hold (sizes its cache)
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual int64_t vocab_size() const = 0;
  // Runs every input and returns f32 logits [inputs.size(), vocab] of each one's last token.
  virtual Tensor execute(std::span<const StepInput> inputs) = 0;
  // The sequence finished or was dropped: free what it holds.
  virtual void release(uint64_t seq_id) = 0;
};

// The CPU reference model; one KVCache per live sequence.
std::unique_ptr<Executor> make_cpu_executor(std::shared_ptr<Model> model);

// Logits from a function (tests, tools): fn(input) -> [vocab] f32.
using LogitsFn = std::function<std::vector<float>(const StepInput& input)>;
std::unique_ptr<Executor> make_function_executor(int64_t vocab_size, LogitsFn fn);

}  // namespace longctx
