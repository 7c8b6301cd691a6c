#include "server/http_transport.h"

#include <fmt/format.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/core/logging.h"

namespace longctx::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

struct Shared {
  HttpHandler handler;
  ErrorResponder on_error;
  TransportOptions options;
  std::atomic<int64_t> open{0};
};

std::string_view std_view(beast::string_view s) { return {s.data(), s.size()}; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Shared& shared) : stream_(std::move(socket)), shared_(shared) {
    ++shared_.open;
  }
  ~Session() { --shared_.open; }

  void run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

 private:
  void read_request() {
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(shared_.options.max_body_bytes));
    parser_->header_limit(static_cast<uint32_t>(shared_.options.max_header_bytes));
    stream_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(shared_.options.idle_timeout_s)));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_request(ec); });
  }

  void on_request(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      close();
      return;
    }
    if (ec == http::error::body_limit) {
      write_immediate(shared_.on_error(413, fmt::format("the request body is larger than the "
                                                        "limit of {} bytes",
                                                        shared_.options.max_body_bytes)),
                      false);
      return;
    }
    if (ec) {
      write_immediate(shared_.on_error(400, "malformed HTTP request: " + ec.message()), false);
      return;
    }
    auto& msg = parser_->get();
    HttpRequest req;
    req.method = std::string(std_view(msg.method_string()));
    const std::string_view target = std_view(msg.target());
    const size_t q = target.find('?');
    req.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
    for (const auto& f : msg)
      req.headers.emplace_back(lower(std_view(f.name_string())), std::string(std_view(f.value())));
    req.body = std::move(msg.body());
    const bool keep_alive = msg.keep_alive();
    HandlerResult result;
    try {
      result = shared_.handler(req);
    } catch (const std::exception& e) {
      result.response = shared_.on_error(500, std::string("internal error: ") + e.what());
    }
    if (result.stream == nullptr) {
      write_immediate(std::move(result.response), keep_alive);
    } else {
      start_deferred(std::move(result.stream));
    }
  }

  void write_immediate(HttpResponse r, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(r.status), 11);
    res->set(http::field::server, "longctx");
    res->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res->set(k, v);
    res->body() = std::move(r.body);
    res->keep_alive(keep_alive);
    res->prepare_payload();
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res, keep_alive](beast::error_code ec, size_t) {
                        if (ec) {
                          self->close();
                        } else if (!keep_alive) {
                          self->linger_close();
                        } else {
                          self->read_request();
                        }
                      });
  }

  void start_deferred(std::shared_ptr<ResponseStream> s) {
    pending_ = std::move(s);
    stream_.expires_never();
    probe();
    std::weak_ptr<Session> weak = weak_from_this();
    pending_->set_notify([weak] {
      if (auto self = weak.lock())
        net::post(self->stream_.get_executor(), [self] { self->pump(); });
    });
  }

  // A read that completes only when the client closes (or sends more): the only way to see a
  // client go away while nothing is being written (a long prefill, a non-streamed request).
  void probe() {
    stream_.socket().async_read_some(
        net::buffer(probe_buf_), [self = shared_from_this()](beast::error_code ec, size_t) {
          if (self->done_) return;
          if (ec) {
            self->client_gone();
          } else {
            self->probe();  // bytes of a pipelined request: ignored, the connection closes
          }
        });
  }

  void client_gone() {
    if (pending_) pending_->cancel();
    done_ = true;
    close();
  }

  void pump() {
    if (writing_ || done_ || !pending_) return;
    ResponseStream::Taken t = pending_->take();
    out_.clear();
    if (t.head) {
      head_ = *t.head;
      if (head_.chunked) {
        out_ = fmt::format(
            "HTTP/1.1 {} {}\r\nServer: longctx\r\nContent-Type: {}\r\nCache-Control: "
            "no-cache\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
            head_.status, std_view(http::obsolete_reason(static_cast<http::status>(head_.status))),
            head_.content_type);
      }
    }
    if (head_.chunked) {
      if (!t.data.empty()) out_ += fmt::format("{:x}\r\n{}\r\n", t.data.size(), t.data);
      if (t.finished) out_ += "0\r\n\r\n";
    } else {
      body_ += t.data;
      if (t.finished) {
        out_ = fmt::format(
            "HTTP/1.1 {} {}\r\nServer: longctx\r\nContent-Type: {}\r\nContent-Length: "
            "{}\r\nConnection: close\r\n\r\n",
            head_.status, std_view(http::obsolete_reason(static_cast<http::status>(head_.status))),
            head_.content_type, body_.size());
        out_ += body_;
      }
    }
    const bool last = t.finished;
    if (out_.empty()) return;
    writing_ = true;
    net::async_write(stream_.socket(), net::buffer(out_),
                     [self = shared_from_this(), last](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       if (ec) {
                         self->client_gone();
                       } else if (last) {
                         self->done_ = true;
                         self->close();
                       } else {
                         self->pump();
                       }
                     });
  }

  // Ends the connection after an error answered before the body was read (413): stop sending,
  // then read and drop what the client still sends, so closing with unread bytes does not reset
  // the connection before the client read the answer.
  void linger_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(2));
    discard();
  }

  void discard() {
    stream_.async_read_some(net::buffer(probe_buf_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) {
                                self->close();
                              } else {
                                self->discard();
                              }
                            });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  Shared& shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<ResponseStream> pending_;
  ResponseStream::Head head_;
  std::string out_;
  std::string body_;
  std::array<char, 16384> probe_buf_{};  // probe reads and discarded bytes
  bool writing_ = false;
  bool done_ = false;
};

}  // namespace

struct HttpTransport::Impl {
  Shared shared;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
  std::mutex stop_mu;

  void accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) {
        beast::error_code ignore;
        s.set_option(tcp::no_delay(true), ignore);
        std::make_shared<Session>(std::move(s), shared)->run();
      } else {
        // Out of descriptors and the like: keep listening, but do not spin on the error.
        LONGCTX_LOG_WARN("server: accept failed: {}", ec.message());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      accept();
    });
  }
};

HttpTransport::HttpTransport(HttpHandler handler, ErrorResponder on_error, TransportOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->shared.handler = std::move(handler);
  impl_->shared.on_error = std::move(on_error);
  impl_->shared.options = std::move(options);
  const TransportOptions& o = impl_->shared.options;
  LONGCTX_CHECK(o.port >= 0 && o.port <= 65535, ErrorCode::kInvalidArgument,
                "--port must be in [0, 65535], got {}", o.port);
  LONGCTX_CHECK(o.threads >= 1, ErrorCode::kInvalidArgument, "I/O threads must be >= 1, got {}",
                o.threads);
  LONGCTX_CHECK(o.max_body_bytes > 0, ErrorCode::kInvalidArgument,
                "the body limit must be > 0 bytes, got {}", o.max_body_bytes);
  beast::error_code ec;
  const auto address = net::ip::make_address(o.host, ec);
  LONGCTX_CHECK(!ec, ErrorCode::kInvalidArgument, "--host '{}' is not an IP address: {}", o.host,
                ec.message());
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(o.port));
  auto& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  LONGCTX_CHECK(!ec, ErrorCode::kIo, "cannot listen on {}:{}: {}", o.host, o.port, ec.message());
}

HttpTransport::~HttpTransport() { stop(0); }

int HttpTransport::port() const { return impl_->acceptor.local_endpoint().port(); }

void HttpTransport::start() {
  impl_->accept();
  for (int i = 0; i < impl_->shared.options.threads; ++i)
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
}

void HttpTransport::stop_accepting() {
  net::post(impl_->acceptor.get_executor(), [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
}

void HttpTransport::stop(double grace_s) {
  std::lock_guard lk(impl_->stop_mu);
  if (impl_->stopped) return;
  stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(grace_s));
  while (impl_->shared.open.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  impl_->stopped = true;
}

int64_t HttpTransport::open_connections() const { return impl_->shared.open.load(); }

}  // namespace longctx::server
