// A load generator for the server's streaming endpoints: one thread, non-blocking sockets and
// epoll, so hundreds of concurrent SSE streams cost the client no thread each. It checks every
// stream it completes (HTTP 200, chunked framing, every event JSON with "choices", one finish
// reason, "[DONE]" last) and can close some streams mid-way on purpose (a client that goes
// away). Plain POSIX sockets, independent of the server's HTTP library, so it measures any
// server the same way (bench/server, the load tests).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace longctx::server {

struct LoadOptions {
  std::string host = "127.0.0.1";  // an IPv4 address on this machine
  int port = 0;
  std::string path = "/v1/completions";
  std::function<std::string(int index)> body;  // request `index`'s JSON body (stream: true)
  std::string api_key;                         // sent as a bearer token when set
  int concurrency = 16;                        // streams open at once
  int total = 100;                             // requests in all
  // Each request is, with this probability, closed by the client after 0-3 events.
  double cancel_fraction = 0;
  uint64_t seed = 1;
  double timeout_s = 120;  // the whole run; what is open then counts as failed
};

struct LoadResult {
  int completed = 0;                  // well-formed streams that ended with [DONE]
  int cancelled = 0;                  // closed by the client on purpose
  int failed = 0;                     // anything else: refused, non-200, malformed, cut short
  std::vector<std::string> failures;  // the first reasons
  std::vector<double> ttft_s;         // completed: request sent -> first generated text
  std::vector<double> e2e_s;          // completed: request sent -> [DONE]
  int64_t events = 0;                 // SSE events read
  int64_t text_bytes = 0;             // generated text bytes read
  double wall_s = 0;
  bool timed_out = false;

  double requests_per_s() const { return wall_s > 0 ? completed / wall_s : 0; }
  // The q-quantile (0..1) of `v` (nearest rank), 0 for an empty vector.
  static double percentile(std::vector<double> v, double q);
};

LoadResult run_sse_load(const LoadOptions& options);

}  // namespace longctx::server
