// A small blocking HTTP/1.1 client on Boost.Beast (the server's own library) for the server
// tests: one request and its whole response, or a stream read event by event that the test may
// close half-way.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace longctx::testing {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpResult {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names lower-cased
  nlohmann::json json() const { return nlohmann::json::parse(body); }
};

inline http::request<http::string_body> make_request(int port, const std::string& method,
                                                     const std::string& target,
                                                     const std::string& body,
                                                     const Headers& headers) {
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, "127.0.0.1:" + std::to_string(port));
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  for (const auto& [k, v] : headers) req.set(k, v);
  req.body() = body;
  req.prepare_payload();
  return req;
}

inline HttpResult http_request(int port, const std::string& method, const std::string& target,
                               const std::string& body = "", const Headers& headers = {}) {
  net::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect({net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)});
  auto req = make_request(port, method, target, body, headers);
  beast::error_code ec;
  http::write(socket, req, ec);  // a server that answers early (413) may stop reading
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1ull << 30);
  http::read(socket, buffer, parser, ec);
  HttpResult r;
  if (ec && !parser.is_header_done()) throw beast::system_error(ec);
  r.status = static_cast<int>(parser.get().result_int());
  r.body = parser.get().body();
  for (const auto& f : parser.get()) {
    std::string name(f.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = std::string(f.value());
  }
  socket.shutdown(tcp::socket::shutdown_both, ec);
  return r;
}

inline HttpResult post_json(int port, const std::string& target, const nlohmann::json& body,
                            const Headers& headers = {}) {
  return http_request(port, "POST", target, body.dump(), headers);
}

// An SSE response read one event at a time.
class SseStream {
 public:
  SseStream(int port, const std::string& target, const nlohmann::json& body,
            const Headers& headers = {})
      : socket_(ioc_) {
    socket_.connect({net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)});
    auto req = make_request(port, "POST", target, body.dump(), headers);
    http::write(socket_, req);
    parser_.body_limit(1ull << 30);
    http::read_header(socket_, buffer_, parser_);
  }
  int status() const { return static_cast<int>(parser_.get().result_int()); }
  std::string header(const std::string& name) const { return std::string(parser_.get()[name]); }
  // The next event's data ("[DONE]" included), or nullopt at the end of the response.
  std::optional<std::string> next() {
    while (true) {
      std::string& body = parser_.get().body();
      const size_t end = body.find("\n\n", pos_);
      if (end != std::string::npos) {
        std::string ev = body.substr(pos_, end - pos_);
        pos_ = end + 2;
        if (ev.starts_with("data: ")) ev.erase(0, 6);
        return ev;
      }
      if (parser_.is_done()) return std::nullopt;
      beast::error_code ec;
      http::read_some(socket_, buffer_, parser_, ec);
      if (ec) return std::nullopt;
    }
  }
  // Every remaining event.
  std::vector<std::string> rest() {
    std::vector<std::string> out;
    while (auto ev = next()) out.push_back(*ev);
    return out;
  }
  // Reads to the end: whether the server ended the response properly (final chunk).
  bool complete() {
    rest();
    return parser_.is_done();
  }
  void close() {
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

 private:
  net::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
  size_t pos_ = 0;
};

}  // namespace longctx::testing
