// The server's Prometheus metrics (text exposition format 0.0.4). The series vLLM exports carry
// vLLM's names, types, labels (model_name, engine) and buckets, so routers (llm-d's scheduler,
// the Gateway API Inference Extension, Dynamo, SGLang's gateway), KEDA and vLLM's dashboards
// read a longctx server as a vLLM one; what only longctx has is under "longctx:". Gauges come
// from EngineLoop's stats at scrape time; counters and histograms are recorded as requests
// produce tokens and finish.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_loop.h"

namespace longctx::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds, ascending; +Inf is implied
  void observe(double value, int64_t times = 1);
  // "# HELP/# TYPE" then name_bucket{labels,le=...}, name_sum{labels}, name_count{labels}.
  void render(std::string& out, const std::string& name, const std::string& help,
              const std::string& labels) const;
  int64_t count() const;
  // The value at quantile q from the buckets (upper bound of the bucket that holds it).
  double quantile_upper_bound(double q) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds + 1]: per bucket, the last one +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// What the metrics say about the deployment (fixed at start-up).
struct MetricsConfig {
  std::string model_name;     // the served model name: every series' model_name label
  int64_t max_model_len = 0;  // the token-count histograms' top bucket (vLLM's 1-2-5 buckets)
  int64_t block_size = 0;     // vllm:cache_config_info
  bool enable_prefix_caching = true;
  int64_t num_speculative_tokens = 0;  // > 0: the spec-decode counters, one per draft position
};

class ServerMetrics {
 public:
  explicit ServerMetrics(MetricsConfig config);
  // A request's first tokens were generated: its prompt counts (vLLM counts the whole prompt,
  // prefix-cache hits included).
  void record_prompt(int64_t prompt_tokens);
  // `n` tokens generated `seconds_each` after the previous one (one inter-token interval each).
  void record_output_tokens(int64_t n);
  void record_inter_token(double seconds_each, int64_t n);
  // A finished request's timings (RequestMetrics), counted under its finish reason.
  void record_finished(const RequestOutput& out);
  void record_http_status(int status);
  std::string render(const LoopStats& stats) const;

  const Histogram& ttft() const { return ttft_; }

 private:
  MetricsConfig config_;
  std::string labels_;        // model_name="...",engine="0"
  Histogram ttft_;            // seconds from arrival to the first token
  Histogram tpot_;            // seconds between consecutive output tokens (vLLM's per-token TPOT)
  Histogram itl_;             // the same intervals under vLLM's newer name
  Histogram e2e_;             // seconds from arrival to the end
  Histogram queue_;           // seconds from arrival to the start of the prefill
  Histogram inference_;       // seconds from the start of the prefill to the end
  Histogram prefill_;         // seconds from the start of the prefill to the first token
  Histogram decode_;          // seconds from the first token to the end
  Histogram prompt_len_;      // prompt tokens per finished request
  Histogram generation_len_;  // generated tokens per finished request
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  std::map<std::string, int64_t> finished_;  // finish reason -> requests
  std::map<int, int64_t> http_status_;       // status -> responses
};

}  // namespace longctx::server
