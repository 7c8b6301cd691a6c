#include "httplib_transport.h"

#include <httplib.h>

#include <thread>

namespace longctx::bench {

struct HttplibTransport::Impl {
  httplib::Server svr;
  std::thread thread;
  int port = 0;
};

HttplibTransport::HttplibTransport(server::HttpHandler handler, int threads, int64_t max_body_bytes)
    : impl_(std::make_unique<Impl>()) {
  auto& svr = impl_->svr;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(static_cast<size_t>(max_body_bytes));
  auto handle = [handler](const httplib::Request& req, httplib::Response& res) {
    server::HttpRequest r;
    r.method = req.method;
    r.path = req.path;
    for (const auto& [k, v] : req.headers) {
      std::string name = k;
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers.emplace_back(name, v);
    }
    r.body = req.body;
    server::HandlerResult h = handler(r);
    if (!h.stream) {
      res.status = h.response.status;
      res.set_content(h.response.body, h.response.content_type.c_str());
      return;
    }
    std::shared_ptr<server::ResponseStream> s = h.stream;
    server::ResponseStream::Taken t;
    while (!t.head) {
      t = s->wait_take(1.0);
      if (s->cancelled()) return;
    }
    res.status = t.head->status;
    if (!t.head->chunked) {
      std::string body = t.data;
      while (!t.finished) {
        t = s->wait_take(1.0);
        body += t.data;
      }
      res.set_content(body, t.head ? t.head->content_type.c_str() : "application/json");
      return;
    }
    auto first = std::make_shared<server::ResponseStream::Taken>(std::move(t));
    res.set_chunked_content_provider(
        first->head->content_type,
        [s, first](size_t, httplib::DataSink& sink) {
          server::ResponseStream::Taken next;
          if (first->head) {
            next = std::move(*first);
            first->head.reset();
          } else {
            next = s->wait_take(1.0);
          }
          if (!next.data.empty() && !sink.write(next.data.data(), next.data.size())) {
            s->cancel();
            return false;
          }
          if (next.finished) sink.done();
          return true;
        },
        [s](bool success) {
          if (!success) s->cancel();
        });
  };
  svr.Get(".*", handle);
  svr.Post(".*", handle);
  impl_->port = svr.bind_to_any_port("127.0.0.1");
  impl_->thread = std::thread([this] { impl_->svr.listen_after_bind(); });
  while (!svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

HttplibTransport::~HttplibTransport() {
  impl_->svr.stop();
  impl_->thread.join();
}

int HttplibTransport::port() const { return impl_->port; }

}  // namespace longctx::bench
