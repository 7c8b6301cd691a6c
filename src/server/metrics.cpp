#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "server/openai_protocol.h"

namespace longctx::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  if (!std::isfinite(value)) return;
  std::lock_guard lk(mu_);
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[i];
  sum_ += value;
  ++count_;
}

int64_t Histogram::count() const {
  std::lock_guard lk(mu_);
  return count_;
}

double Histogram::quantile_upper_bound(double q) const {
  std::lock_guard lk(mu_);
  if (count_ == 0) return 0;
  const double target = q * static_cast<double>(count_);
  int64_t seen = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    seen += counts_[i];
    if (static_cast<double>(seen) >= target) return bounds_[i];
  }
  return INFINITY;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard lk(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

// vLLM's buckets, so dashboards made for vLLM read these the same way.
ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
             1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      tpot_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}),
      queue_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
              30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

void ServerMetrics::record_finished(const RequestOutput& out) {
  const RequestMetrics& m = out.metrics;
  if (m.first_token > 0) {
    ttft_.observe(m.ttft());
    if (out.token_ids.size() > 1)
      tpot_.observe((m.finished - m.first_token) / static_cast<double>(out.token_ids.size() - 1));
  }
  if (m.scheduled > 0) queue_.observe(m.scheduled - m.arrival);
  if (m.arrival > 0 && m.finished > 0) e2e_.observe(m.finished - m.arrival);
  std::lock_guard lk(mu_);
  ++finished_[openai_finish_reason(out.finish_reason)];
}

void ServerMetrics::record_http_status(int status) {
  std::lock_guard lk(mu_);
  ++http_status_[status];
}

namespace {

// A Prometheus label value: backslash, quote and newline escaped.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string ServerMetrics::render(const LoopStats& s, const std::string& model_name) const {
  std::string out;
  const std::string label = fmt::format("model_name=\"{}\"", label_value(model_name));
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP longctx:{} {}\n# TYPE longctx:{} gauge\nlongctx:{}{{{}}} {}\n", name,
                       help, name, name, label, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    out +=
        fmt::format("# HELP longctx:{} {}\n# TYPE longctx:{} counter\nlongctx:{}_total{{{}}} {}\n",
                    name, help, name, name, label, v);
  };
  const EngineStats& e = s.engine;
  gauge("num_requests_running", "Requests holding KV blocks (in the running batch).",
        static_cast<double>(e.num_running));
  gauge("num_requests_waiting", "Requests queued (in the engine, or submitted to it).",
        static_cast<double>(e.num_waiting + s.num_pending));
  gauge("kv_blocks_total", "KV cache blocks of the executor's pool.",
        static_cast<double>(e.kv_blocks_total));
  gauge("kv_blocks_used", "KV cache blocks held by requests.",
        static_cast<double>(e.kv_blocks_used));
  gauge("kv_blocks_free", "KV cache blocks free.",
        static_cast<double>(e.kv_blocks_total - e.kv_blocks_used));
  gauge("kv_cache_usage_perc", "Fraction of the KV cache blocks in use (0 to 1).",
        e.kv_blocks_total > 0
            ? static_cast<double>(e.kv_blocks_used) / static_cast<double>(e.kv_blocks_total)
            : 0.0);
  counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
          static_cast<double>(e.prefix_cache_queries));
  counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.",
          static_cast<double>(e.prefix_cache_hits));
  gauge("prefix_cache_hit_rate", "prefix_cache_hits / prefix_cache_queries since the start.",
        e.prefix_cache_queries > 0
            ? static_cast<double>(e.prefix_cache_hits) / static_cast<double>(e.prefix_cache_queries)
            : 0.0);
  counter("num_preemptions", "Requests preempted (KV blocks ran out).",
          static_cast<double>(e.num_preemptions));
  counter("prompt_tokens", "Prompt tokens computed (prefix-cache hits excluded).",
          static_cast<double>(e.prompt_tokens));
  counter("generation_tokens", "Tokens generated.", static_cast<double>(e.generation_tokens));
  counter("engine_errors", "Engine steps that failed (their requests got an error).",
          static_cast<double>(s.num_engine_errors));
  ttft_.render(out, "longctx:time_to_first_token_seconds",
               "Seconds from a request's arrival to its first token.");
  tpot_.render(out, "longctx:time_per_output_token_seconds",
               "Mean seconds per output token after the first, per request.");
  e2e_.render(out, "longctx:e2e_request_latency_seconds",
              "Seconds from a request's arrival to its end.");
  queue_.render(out, "longctx:request_queue_time_seconds",
                "Seconds from a request's arrival to the start of its prefill.");
  std::lock_guard lk(mu_);
  out +=
      "# HELP longctx:request_success Finished requests by finish reason.\n"
      "# TYPE longctx:request_success counter\n";
  for (const char* reason : {"stop", "length", "abort"}) {
    auto it = finished_.find(reason);
    out += fmt::format("longctx:request_success_total{{{},finished_reason=\"{}\"}} {}\n", label,
                       reason, it == finished_.end() ? 0 : it->second);
  }
  out +=
      "# HELP longctx:http_responses HTTP responses by status code.\n"
      "# TYPE longctx:http_responses counter\n";
  for (const auto& [status, n] : http_status_)
    out += fmt::format("longctx:http_responses_total{{status=\"{}\"}} {}\n", status, n);
  return out;
}

}  // namespace longctx::server
