// The server's Prometheus metrics (text exposition format 0.0.4, vLLM's metric meanings under a
// "longctx:" prefix): engine gauges and token counters from EngineLoop's stats, request latency
// histograms recorded as requests finish.
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
  void observe(double value);
  // "# HELP/# TYPE" then name_bucket{le=...}, name_sum, name_count.
  void render(std::string& out, const std::string& name, const std::string& help) const;
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

class ServerMetrics {
 public:
  ServerMetrics();
  // A finished request's timings (RequestMetrics), counted under its finish reason.
  void record_finished(const RequestOutput& out);
  void record_http_status(int status);
  std::string render(const LoopStats& stats, const std::string& model_name) const;

  const Histogram& ttft() const { return ttft_; }

 private:
  Histogram ttft_;   // seconds from arrival to the first token
  Histogram tpot_;   // seconds per output token after the first (per request mean)
  Histogram e2e_;    // seconds from arrival to the end
  Histogram queue_;  // seconds from arrival to the start of the prefill
  mutable std::mutex mu_;
  std::map<std::string, int64_t> finished_;  // finish reason -> requests
  std::map<int, int64_t> http_status_;       // status -> responses
};

}  // namespace longctx::server
