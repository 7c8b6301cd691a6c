#include "server/http_transport.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/core/logging.h"
#include "server/cors.h"

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

  void run(bool over_limit) {
    net::dispatch(stream_.get_executor(), [self = shared_from_this(), over_limit] {
      if (over_limit) {
        self->write_immediate(
            self->shared_.on_error(503, fmt::format("the server holds its limit of {} open "
                                                    "connections; retry later",
                                                    self->shared_.options.max_connections)),
            false);
      } else {
        self->read_request();
      }
    });
  }

 private:
  static std::chrono::steady_clock::duration seconds(double s) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(s));
  }

  void read_request() {
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(shared_.options.max_body_bytes));
    parser_->header_limit(static_cast<uint32_t>(shared_.options.max_header_bytes));
    // A fresh connection gets the request timeout; one kept alive after a response waits for
    // its next request only the keep-alive timeout.
    stream_.expires_after(seconds(num_requests_ == 0 ? shared_.options.idle_timeout_s
                                                     : shared_.options.keep_alive_timeout_s));
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
    ++num_requests_;
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
    keep_alive_ = msg.keep_alive();
    http11_ = msg.version() >= 11;
    cors_ = cors_headers(shared_.options.cors, req);
    if (const std::optional<HttpResponse> pre = cors_preflight(shared_.options.cors, req)) {
      write_immediate(*pre, keep_alive_);
      return;
    }
    HandlerResult result;
    try {
      result = shared_.handler(req);
    } catch (const std::exception& e) {
      result.response = shared_.on_error(500, std::string("internal error: ") + e.what());
    }
    if (result.stream == nullptr) {
      write_immediate(std::move(result.response), keep_alive_);
    } else {
      start_deferred(std::move(result.stream));
    }
  }

  void write_immediate(HttpResponse r, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(r.status), http11_ ? 11 : 10);
    res->set(http::field::server, "longctx");
    res->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res->set(k, v);
    for (auto& [k, v] : cors_) res->set(k, v);
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
    head_ = {};
    body_.clear();
    response_done_ = false;
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
  // Bytes it reads go to the request buffer: a client may send its next request on this
  // connection as soon as it has the last bytes of this response.
  void probe() {
    probing_ = true;
    stream_.socket().async_read_some(
        buffer_.prepare(16384), [self = shared_from_this()](beast::error_code ec, size_t n) {
          self->probing_ = false;
          if (!ec) {
            self->buffer_.commit(n);
            // The next request (pipelined): kept for the parser; the response goes on without
            // a probe.
            if (self->response_done_) self->after_deferred();
            return;
          }
          if (self->response_done_) {
            // Cancelled by after_deferred(), or the client closed after the whole response.
            if (ec == net::error::operation_aborted && self->keep_alive_) {
              self->read_request();
            } else {
              self->close();
            }
            return;
          }
          self->client_gone();
        });
  }

  void client_gone() {
    if (pending_) pending_->cancel();
    pending_.reset();
    response_done_ = true;
    keep_alive_ = false;
    close();
  }

  std::string head_text(const std::string& length_or_chunked) const {
    std::string h = fmt::format(
        "HTTP/1.{} {} {}\r\nServer: longctx\r\nContent-Type: {}\r\n", http11_ ? 1 : 0, head_.status,
        std_view(http::obsolete_reason(static_cast<http::status>(head_.status))),
        head_.content_type);
    if (head_.chunked) h += "Cache-Control: no-cache\r\n";
    for (const auto& [k, v] : cors_) h += k + ": " + v + "\r\n";
    h += length_or_chunked;
    // HTTP/1.1 is persistent unless told otherwise; HTTP/1.0 only when it asked.
    if (!keep_alive_) {
      h += "Connection: close\r\n";
    } else if (!http11_) {
      h += "Connection: keep-alive\r\n";
    }
    return h + "\r\n";
  }

  void pump() {
    if (writing_ || response_done_ || !pending_) return;
    ResponseStream::Taken t = pending_->take();
    out_.clear();
    if (t.head) {
      head_ = *t.head;
      // An HTTP/1.0 client cannot read chunks: its stream is the bytes up to the close.
      if (head_.chunked && !http11_) keep_alive_ = false;
      if (head_.chunked) {
        out_ = head_text(http11_ ? "Transfer-Encoding: chunked\r\n" : "");
      }
    }
    if (head_.chunked) {
      if (http11_) {
        if (!t.data.empty()) out_ += fmt::format("{:x}\r\n{}\r\n", t.data.size(), t.data);
        if (t.finished) out_ += "0\r\n\r\n";
      } else {
        out_ += t.data;
      }
    } else {
      body_ += t.data;
      if (t.finished) {
        out_ = head_text(fmt::format("Content-Length: {}\r\n", body_.size()));
        out_ += body_;
        body_.clear();
      }
    }
    const bool last = t.finished;
    if (out_.empty()) {
      // The end of a stream sent as bytes up to the close (HTTP/1.0) has nothing to write.
      if (last) {
        response_done_ = true;
        pending_.reset();
        after_deferred();
      }
      return;
    }
    writing_ = true;
    net::async_write(stream_.socket(), net::buffer(out_),
                     [self = shared_from_this(), last](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       if (ec) {
                         self->client_gone();
                       } else if (last) {
                         self->response_done_ = true;
                         self->pending_.reset();
                         self->after_deferred();
                       } else {
                         self->pump();
                       }
                     });
  }

  // After the last byte of a deferred response: the next request on a kept-alive connection
  // (once the probe's read is out of the way), else the end.
  void after_deferred() {
    if (!keep_alive_) {
      close();
      return;
    }
    if (probing_) {
      beast::error_code ec;
      stream_.socket().cancel(ec);  // the probe's handler goes on with read_request()
      return;
    }
    read_request();
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
    stream_.async_read_some(net::buffer(discard_buf_),
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
  int64_t num_requests_ = 0;
  bool keep_alive_ = false;  // the current request's (HTTP/1.1 default, Connection: close)
  bool http11_ = true;
  std::vector<std::pair<std::string, std::string>> cors_;  // the current request's
  // The deferred response in progress.
  std::shared_ptr<ResponseStream> pending_;
  ResponseStream::Head head_;
  std::string out_;
  std::string body_;
  bool writing_ = false;
  bool probing_ = false;
  bool response_done_ = true;
  std::array<char, 16384> discard_buf_{};
};

}  // namespace

struct HttpTransport::Impl {
  Shared shared;
  net::io_context ioc;
  // On a strand: accepts, their retry timer and stop_accepting() never run at once.
  tcp::acceptor acceptor{net::make_strand(ioc)};
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
  std::mutex stop_mu;

  void accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) {
        backoff = kFirstBackoff;
        beast::error_code ignore;
        s.set_option(tcp::no_delay(true), ignore);
        const bool over = shared.open.load() >= shared.options.max_connections;
        std::make_shared<Session>(std::move(s), shared)->run(over);
        accept();
        return;
      }
      // Out of descriptors and the like: keep listening, but neither spin nor flood the log.
      // Retries back off from 10 ms to 1 s (a connection that closes frees a descriptor);
      // the log gets one line a second at most, with the count of those it left out.
      const double now =
          std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
              .count();
      if (now - last_accept_log >= 1.0) {
        if (accept_errors_unlogged > 0) {
          LONGCTX_LOG_WARN("server: accept failed: {} ({} more failures not logged)", ec.message(),
                           accept_errors_unlogged);
        } else {
          LONGCTX_LOG_WARN("server: accept failed: {}", ec.message());
        }
        last_accept_log = now;
        accept_errors_unlogged = 0;
      } else {
        ++accept_errors_unlogged;
      }
      accept_timer.expires_after(backoff);
      backoff = std::min(backoff * 2, kMaxBackoff);
      accept_timer.async_wait([this](beast::error_code wait_ec) {
        if (!wait_ec && acceptor.is_open()) accept();
      });
    });
  }

  static constexpr std::chrono::milliseconds kFirstBackoff{10};
  static constexpr std::chrono::milliseconds kMaxBackoff{1000};
  std::chrono::milliseconds backoff = kFirstBackoff;
  net::steady_timer accept_timer{acceptor.get_executor()};
  double last_accept_log = -1e300;
  int64_t accept_errors_unlogged = 0;
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
  LONGCTX_CHECK(o.max_connections > 0, ErrorCode::kInvalidArgument,
                "--max-connections must be > 0, got {}", o.max_connections);
  LONGCTX_CHECK(o.keep_alive_timeout_s > 0 && o.idle_timeout_s > 0, ErrorCode::kInvalidArgument,
                "the connection timeouts must be > 0 s");
  o.cors.validate();
  LONGCTX_CHECK(o.max_body_bytes > 0, ErrorCode::kInvalidArgument,
                "the body limit must be > 0 bytes, got {}", o.max_body_bytes);
  beast::error_code ec;
  LONGCTX_CHECK(!o.host.empty(), ErrorCode::kInvalidArgument,
                "--host is empty (give an address such as 127.0.0.1 or a host name)");
  // An address as it is; a host name through getaddrinfo (the resolver), its first IPv4
  // address if it has one (as uvicorn, so vLLM, binds "localhost" to 127.0.0.1), else its first.
  auto address = net::ip::make_address(o.host, ec);
  if (ec) {
    tcp::resolver resolver(impl_->ioc);
    const auto results = resolver.resolve(o.host, "", tcp::resolver::passive, ec);
    LONGCTX_CHECK(!ec && !results.empty(), ErrorCode::kInvalidArgument,
                  "--host '{}' is neither an IP address nor a host name that resolves: {}", o.host,
                  ec ? ec.message() : std::string("no address"));
    address = results.begin()->endpoint().address();
    for (const auto& r : results) {
      if (r.endpoint().address().is_v4()) {
        address = r.endpoint().address();
        break;
      }
    }
  }
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(o.port));
  auto& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  LONGCTX_CHECK(!ec, ErrorCode::kIo, "cannot listen on {}:{} ({}): {}", o.host, o.port,
                address.to_string(), ec.message());
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
    impl_->accept_timer.cancel();
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
