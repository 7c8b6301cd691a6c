// The server over scripted logits (the needle model's tokenizer, a function executor that emits
// a fixed text), in process on an ephemeral port: shared by the server tests that need an
// engine but not a model.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/test_data.h"
#include "longctx/llm.h"
#include "longctx/tokenizer/tokenizer.h"
#include "server/server.h"

namespace longctx {

constexpr int64_t kMaxModelLen = 256;

inline std::string needle_dir() { return testing::test_data_dir() + "/../../models/needle"; }

// The tokens the script emits, cycling with the sequence length: all_tokens.size() % n.
inline std::vector<int32_t> script_tokens(const Tokenizer& tok) {
  return tok.encode(" the quick brown fox jumps over the lazy dog.");
}

struct ScriptedServer {
  std::shared_ptr<const Tokenizer> tok;
  std::vector<int32_t> script;
  std::unique_ptr<LLM> llm;
  std::unique_ptr<server::Server> srv;
  std::atomic<int64_t> steps{0};

  // `tweak` adjusts the options before the server starts.
  explicit ScriptedServer(std::chrono::microseconds step_sleep = {},
                          const std::string& api_key = "", int64_t max_body = 1 << 20,
                          const std::function<void(server::ServeOptions&)>& tweak = {},
                          const SpeculativeConfig& speculative = {}) {
    tok = load_tokenizer_for_engine(needle_dir());
    script = script_tokens(*tok);
    const int64_t vocab = static_cast<int64_t>(tok->vocab_size());
    auto fn = [this, vocab, step_sleep](const StepInput& in) {
      ++steps;
      if (step_sleep.count() > 0) std::this_thread::sleep_for(step_sleep);
      std::vector<float> l(vocab, 0.0f);
      l[script[in.all_tokens.size() % script.size()]] = 20.0f;
      return l;
    };
    llm = std::make_unique<LLM>(make_function_executor(vocab, fn), tok, kMaxModelLen,
                                std::vector<int64_t>{}, 0, speculative);
    server::ServeOptions o;
    o.transport.port = 0;
    o.transport.max_body_bytes = max_body;
    o.api.served_model_names = {"scripted", "alias"};
    o.api.model_root = "scripted-root";
    o.api.api_key = api_key;
    o.close_grace_s = 0.5;
    if (tweak) tweak(o);
    srv = std::make_unique<server::Server>(*llm, o);
  }
  int port() const { return srv->port(); }
  // The text the script produces after a prompt of `prompt_len` tokens, `n` tokens long.
  std::string expected_text(size_t prompt_len, int n) const {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(script[(prompt_len + i) % script.size()]);
    return tok->decode(ids);
  }
  // Waits until the engine holds nothing: no request in flight, no KV block used.
  bool wait_idle(double seconds = 10) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      LoopStats s = srv->loop().stats();
      if (s.num_in_flight == 0 && s.engine.num_running == 0 && s.engine.num_waiting == 0 &&
          s.engine.kv_blocks_used == 0)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
};

// The value of a metric line "name{labels} value" (the first with that name and label part).
inline double metric(const std::string& text, const std::string& name_and_labels) {
  const size_t p = text.find("\n" + name_and_labels + " ");
  if (p == std::string::npos) return -1;
  return std::stod(text.substr(p + name_and_labels.size() + 2));
}

}  // namespace longctx
