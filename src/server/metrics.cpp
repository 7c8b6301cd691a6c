#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "server/openai_protocol.h"

namespace longctx::server {

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

// A number as Python's prometheus_client writes it ("1.0", "0.25", "2560.0"), so bucket
// labels read the same as vLLM's.
std::string py_float(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.1f}", v);
  return fmt::format("{}", v);
}

// vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value.
std::vector<double> buckets_1_2_5(int64_t max_value) {
  std::vector<double> out;
  for (double scale = 1;; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale > static_cast<double>(max_value)) return out;
      out.push_back(m * scale);
    }
  }
}

// vLLM's buckets (vllm/v1/metrics/loggers.py), so its dashboards read these the same way.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTpotBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                             5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value, int64_t times) {
  if (!std::isfinite(value) || times <= 0) return;
  std::lock_guard lk(mu_);
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[i] += times;
  sum_ += value * static_cast<double>(times);
  count_ += times;
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

void Histogram::render(std::string& out, const std::string& name, const std::string& help,
                       const std::string& labels) const {
  std::lock_guard lk(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, py_float(bounds_[i]),
                       cumulative);
  }
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, count_);
  out +=
      fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, sum_, name, labels, count_);
}

ServerMetrics::ServerMetrics(MetricsConfig config)
    : config_(std::move(config)),
      labels_(fmt::format("model_name=\"{}\",engine=\"0\"", label_value(config_.model_name))),
      ttft_(kTtftBuckets),
      tpot_(kTpotBuckets),
      itl_(kTpotBuckets),
      e2e_(kLatencyBuckets),
      queue_(kLatencyBuckets),
      inference_(kLatencyBuckets),
      prefill_(kLatencyBuckets),
      decode_(kLatencyBuckets),
      prompt_len_(buckets_1_2_5(config_.max_model_len)),
      generation_len_(buckets_1_2_5(config_.max_model_len)) {}

void ServerMetrics::record_prompt(int64_t prompt_tokens) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += prompt_tokens;
}

void ServerMetrics::record_output_tokens(int64_t n) {
  std::lock_guard lk(mu_);
  generation_tokens_ += n;
}

void ServerMetrics::record_inter_token(double seconds_each, int64_t n) {
  tpot_.observe(seconds_each, n);
  itl_.observe(seconds_each, n);
}

void ServerMetrics::record_finished(const RequestOutput& out) {
  const RequestMetrics& m = out.metrics;
  // As vLLM, every finished request (aborted ones included) is observed; the phases it never
  // reached count as 0 s.
  const double scheduled = m.scheduled > 0 ? m.scheduled : m.finished;
  const double first = m.first_token > 0 ? m.first_token : m.finished;
  if (m.first_token > 0) ttft_.observe(m.ttft());
  if (m.arrival > 0 && m.finished > 0) {
    e2e_.observe(m.finished - m.arrival);
    queue_.observe(scheduled - m.arrival);
    inference_.observe(m.finished - scheduled);
    prefill_.observe(first - scheduled);
    decode_.observe(m.finished - first);
  }
  prompt_len_.observe(static_cast<double>(m.num_prompt_tokens));
  generation_len_.observe(static_cast<double>(out.token_ids.size()));
  std::lock_guard lk(mu_);
  ++finished_[openai_finish_reason(out.finish_reason)];
}

void ServerMetrics::record_http_status(int status) {
  std::lock_guard lk(mu_);
  ++http_status_[status];
}

std::string ServerMetrics::render(const LoopStats& s) const {
  std::string out;
  const std::string& l = labels_;
  auto series = [&](const std::string& name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, l,
                       v);
  };
  auto gauge = [&](const std::string& name, const char* help, double v) {
    series(name, "gauge", help, v);
  };
  // Text format 0.0.4 as prometheus_client writes it: the counter's family is named with its
  // _total suffix.
  auto counter = [&](const std::string& name, const char* help, double v) {
    series(name + "_total", "counter", help, v);
  };
  const EngineStats& e = s.engine;
  const double usage = e.kv_blocks_total > 0 ? static_cast<double>(e.kv_blocks_used) /
                                                   static_cast<double>(e.kv_blocks_total)
                                             : 0.0;
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
        static_cast<double>(e.num_running));
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
        static_cast<double>(e.num_waiting + s.num_pending));
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage);
  gauge("vllm:gpu_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc "
        "instead.",
        usage);
  out += fmt::format(
      "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
      "# TYPE vllm:cache_config_info gauge\n"
      "vllm:cache_config_info{{{},block_size=\"{}\",num_gpu_blocks=\"{}\","
      "enable_prefix_caching=\"{}\"}} 1.0\n",
      l, e.kv_block_size, e.kv_blocks_total, config_.enable_prefix_caching ? "True" : "False");
  counter("vllm:prefix_cache_queries",
          "Prefix cache queries, in terms of number of queried tokens.",
          static_cast<double>(e.prefix_cache_queries));
  counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
          static_cast<double>(e.prefix_cache_hits));
  counter("vllm:gpu_prefix_cache_queries",
          "GPU prefix cache queries, in terms of number of queried tokens. DEPRECATED: Use "
          "vllm:prefix_cache_queries instead.",
          static_cast<double>(e.prefix_cache_queries));
  counter("vllm:gpu_prefix_cache_hits",
          "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: Use "
          "vllm:prefix_cache_hits instead.",
          static_cast<double>(e.prefix_cache_hits));
  counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
          static_cast<double>(e.num_preemptions));
  if (config_.num_speculative_tokens > 0) {
    // vLLM's spec-decode counters (present only with speculative decoding, as there).
    const SpecDecodeStats& sd = e.spec_decode;
    counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
            static_cast<double>(sd.num_drafts));
    counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
            static_cast<double>(sd.num_draft_tokens));
    counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
            static_cast<double>(sd.num_accepted_tokens));
    out +=
        "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted draft tokens per "
        "draft position.\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n";
    for (int64_t pos = 0; pos < config_.num_speculative_tokens; ++pos) {
      const auto& per_pos = sd.num_accepted_tokens_per_pos;
      const int64_t v = pos < static_cast<int64_t>(per_pos.size()) ? per_pos[pos] : 0;
      out += fmt::format(
          "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", l, pos,
          v);
    }
  }
  {
    std::lock_guard lk(mu_);
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
            static_cast<double>(prompt_tokens_));
    counter("vllm:generation_tokens", "Number of generation tokens processed.",
            static_cast<double>(generation_tokens_));
    out +=
        "# HELP vllm:request_success_total Count of successfully processed requests.\n"
        "# TYPE vllm:request_success_total counter\n";
    for (const char* reason : {"stop", "length", "abort"}) {
      auto it = finished_.find(reason);
      out += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", l, reason,
                         it == finished_.end() ? 0 : it->second);
    }
  }
  ttft_.render(out, "vllm:time_to_first_token_seconds",
               "Histogram of time to first token in seconds.", l);
  tpot_.render(out, "vllm:time_per_output_token_seconds",
               "Histogram of time per output token in seconds.", l);
  itl_.render(out, "vllm:inter_token_latency_seconds",
              "Histogram of inter-token latency in seconds.", l);
  e2e_.render(out, "vllm:e2e_request_latency_seconds",
              "Histogram of e2e request latency in seconds.", l);
  queue_.render(out, "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.", l);
  inference_.render(out, "vllm:request_inference_time_seconds",
                    "Histogram of time spent in RUNNING phase for request.", l);
  prefill_.render(out, "vllm:request_prefill_time_seconds",
                  "Histogram of time spent in PREFILL phase for request.", l);
  decode_.render(out, "vllm:request_decode_time_seconds",
                 "Histogram of time spent in DECODE phase for request.", l);
  prompt_len_.render(out, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", l);
  generation_len_.render(out, "vllm:request_generation_tokens",
                         "Number of generation tokens processed.", l);

  // longctx's own series.
  gauge("longctx:kv_blocks_total", "KV cache blocks of the executor's pool.",
        static_cast<double>(e.kv_blocks_total));
  gauge("longctx:kv_blocks_used", "KV cache blocks held by requests.",
        static_cast<double>(e.kv_blocks_used));
  gauge("longctx:kv_blocks_free", "KV cache blocks free.",
        static_cast<double>(e.kv_blocks_total - e.kv_blocks_used));
  gauge("longctx:num_requests_pending",
        "Requests submitted to the engine loop, not yet handed to the engine (in "
        "vllm:num_requests_waiting too).",
        static_cast<double>(s.num_pending));
  counter("longctx:engine_errors", "Engine steps that failed (their requests got an error).",
          static_cast<double>(s.num_engine_errors));
  // KV offload (--kv-offload) and sparse prefill (--sparse-policy); zeros without them.
  counter("longctx:offload_host_loaded_bytes",
          "KV offload: bytes copied from the host KV pool to the GPU.",
          static_cast<double>(e.executor.offload_host_bytes_loaded));
  counter("longctx:offload_host_written_bytes",
          "KV offload: bytes written back from the GPU to the host KV pool.",
          static_cast<double>(e.executor.offload_host_bytes_written));
  counter("longctx:sparse_prefill_blocks_kept",
          "Sparse prefill: key blocks read (density: rate of this over "
          "longctx:sparse_prefill_blocks_causal_total).",
          static_cast<double>(e.executor.sparse_prefill_blocks_kept));
  counter("longctx:sparse_prefill_blocks_causal",
          "Sparse prefill: causal key blocks a dense prefill would have read.",
          static_cast<double>(e.executor.sparse_prefill_blocks_causal));
  // Linear-attention state snapshots (prefix caching of state models; zeros for other models).
  counter("longctx:state_snapshots_saved",
          "State snapshots taken at block boundaries (prefix caching of linear-attention state).",
          static_cast<double>(e.executor.state_snapshots_saved));
  counter("longctx:state_snapshots_restored",
          "State snapshots restored for prefix-cache hits of linear-attention models.",
          static_cast<double>(e.executor.state_snapshots_restored));
  counter("longctx:state_snapshot_bytes", "Bytes of linear-attention state snapshots copied.",
          static_cast<double>(e.executor.state_snapshot_bytes));
  // The shared KV store (--kv-store; zeros without one).
  counter("longctx:kv_store_hits", "KV blocks read from the shared KV store instead of computed.",
          static_cast<double>(e.kv_store_hits));
  counter("longctx:kv_store_misses", "KV blocks looked up in the shared KV store and not found.",
          static_cast<double>(e.kv_store_misses));
  counter("longctx:kv_store_errors",
          "Shared KV store failures (down, timeout, malformed value); each one a recompute.",
          static_cast<double>(e.kv_store_errors));
  counter("longctx:kv_store_read_bytes", "Bytes of KV blocks read from the shared KV store.",
          static_cast<double>(e.kv_store_bytes_read));
  counter("longctx:kv_store_written_bytes", "Bytes written to the shared KV store.",
          static_cast<double>(e.kv_store_bytes_written));
  counter("longctx:kv_store_dropped_writes",
          "KV blocks not written to the shared KV store because its write queue was full.",
          static_cast<double>(e.kv_store_writes_dropped));
  std::lock_guard lk(mu_);
  out +=
      "# HELP longctx:http_responses_total HTTP responses by status code.\n"
      "# TYPE longctx:http_responses_total counter\n";
  for (const auto& [status, n] : http_status_)
    out += fmt::format("longctx:http_responses_total{{{},status=\"{}\"}} {}\n", l, status, n);
  return out;
}

}  // namespace longctx::server
