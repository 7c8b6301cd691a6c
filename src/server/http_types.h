// What the HTTP transport and the API handler exchange: a parsed request, a response that is
// ready at once, or a ResponseStream that the engine fills later (SSE streams, and completions
// whose body exists only when generation ended). The handler never sees a socket.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace longctx::server {

struct HttpRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string path;                                          // the target without its query
  std::string query;                                         // after '?', or empty
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  // The first header named `name` (lower case), or empty.
  std::string_view header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// A response produced on another thread. The producer calls start() once, then write() any
// number of times, then finish(); the transport takes what is there whenever notified and
// reports a client that went away with cancel(), which runs the on-cancel action once (the
// engine abort) unless the stream already finished.
class ResponseStream {
 public:
  struct Head {
    int status = 200;
    std::string content_type;
    bool chunked = false;  // chunked transfer encoding (SSE); else one body of known length
  };
  struct Taken {
    std::optional<Head> head;  // the first take() after start()
    std::string data;
    bool finished = false;
  };

  void start(Head head);
  void write(std::string_view data);
  void finish();

  // `fn` runs (on the producer's thread, or here when there is already something to take)
  // whenever start/write/finish added something; it must only schedule a take().
  void set_notify(std::function<void()> fn);
  Taken take();
  // Blocks until there is something to take (or `timeout_s` passed); for blocking transports.
  Taken wait_take(double timeout_s);

  void set_on_cancel(std::function<void()> fn);
  void cancel();
  bool cancelled() const;
  bool finished() const;

 private:
  void notify_locked(std::unique_lock<std::mutex>& lk);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Head> head_;
  bool head_taken_ = false;
  std::string data_;
  bool finished_ = false;
  bool finished_taken_ = false;
  bool cancelled_ = false;
  std::function<void()> notify_;
  std::function<void()> on_cancel_;
};

struct HandlerResult {
  HttpResponse response;                   // when stream is null
  std::shared_ptr<ResponseStream> stream;  // a response that comes later
};

using HttpHandler = std::function<HandlerResult(const HttpRequest&)>;

}  // namespace longctx::server
