// The HTTP layer of the server over scripted logits: persistent connections (several requests,
// streamed and not, over one socket; Connection: close and HTTP/1.0 honoured; the keep-alive
// timeout), the connection limit, CORS (off by default; simple responses, streams and
// preflights with the flags), and host names for --host.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "http_client.h"
#include "scripted_server.h"

namespace longctx {
namespace {

using nlohmann::json;
using testing::Headers;
using testing::http_request;
namespace http = testing::http;
namespace net = testing::net;
using testing::tcp;

// One client connection that sends requests one after another and reads each response whole.
class Connection {
 public:
  explicit Connection(int port) : port_(port), socket_(ioc_) {
    socket_.connect({net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)});
  }
  http::response<http::string_body> send(const std::string& method, const std::string& target,
                                         const std::string& body = "", const Headers& h = {},
                                         int version = 11) {
    auto req = testing::make_request(port_, method, target, body, h);
    req.version(version);
    http::write(socket_, req);
    http::response_parser<http::string_body> parser;
    parser.body_limit(1 << 26);
    http::read(socket_, buffer_, parser);
    return parser.release();
  }
  // Whether the server closed the connection (a read ends with EOF within `seconds`).
  bool closed_by_server(double seconds) {
    socket_.non_blocking(false);
    timeval tv{static_cast<time_t>(seconds),
               static_cast<suseconds_t>((seconds - int(seconds)) * 1e6)};
    setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    const ssize_t n = ::recv(socket_.native_handle(), &c, 1, 0);
    return n == 0;
  }

 private:
  int port_;
  net::io_context ioc_;
  tcp::socket socket_;
  testing::beast::flat_buffer buffer_;
};

const std::string kCompletion = json{{"prompt", "x"}, {"max_tokens", 3}}.dump();
const std::string kStreamed = json{{"prompt", "x"}, {"max_tokens", 3}, {"stream", true}}.dump();

TEST(ServerHttp, SeveralRequestsOverOneConnection) {
  ScriptedServer s;
  Connection c(s.port());
  for (int i = 0; i < 3; ++i) {
    auto r = c.send("POST", "/v1/completions", kCompletion);
    ASSERT_EQ(r.result_int(), 200) << r.body();
    EXPECT_TRUE(r.keep_alive());
    EXPECT_EQ(json::parse(r.body())["choices"][0]["text"], s.expected_text(2, 3));
    // A streamed response on the same connection: chunked, ends with [DONE], and the
    // connection stays usable.
    auto st = c.send("POST", "/v1/completions", kStreamed);
    ASSERT_EQ(st.result_int(), 200);
    EXPECT_TRUE(st.chunked());
    EXPECT_TRUE(st.keep_alive());
    EXPECT_NE(st.body().find("data: [DONE]"), std::string::npos) << st.body();
    auto m = c.send("GET", "/v1/models");
    EXPECT_EQ(m.result_int(), 200);
    // An error response keeps the connection too.
    auto e = c.send("POST", "/v1/completions", json{{"prompt", ""}}.dump());
    EXPECT_EQ(e.result_int(), 400);
    EXPECT_TRUE(e.keep_alive());
  }
  EXPECT_EQ(s.srv->transport().open_connections(), 1);
  // Connection: close is honoured after a deferred response.
  auto last = c.send("POST", "/v1/completions", kCompletion, {{"Connection", "close"}});
  EXPECT_EQ(last.result_int(), 200);
  EXPECT_FALSE(last.keep_alive());
  EXPECT_TRUE(c.closed_by_server(5));
  EXPECT_TRUE(s.wait_idle());
}

TEST(ServerHttp, Http10ClosesUnlessAskedAndStreamsWithoutChunks) {
  ScriptedServer s;
  {
    Connection c(s.port());
    auto r = c.send("POST", "/v1/completions", kCompletion, {}, 10);
    EXPECT_EQ(r.result_int(), 200);
    EXPECT_TRUE(c.closed_by_server(5));
  }
  {
    Connection c(s.port());
    auto r = c.send("POST", "/v1/completions", kCompletion, {{"Connection", "keep-alive"}}, 10);
    EXPECT_EQ(r.result_int(), 200);
    EXPECT_TRUE(r.keep_alive());
    // An HTTP/1.0 client cannot read chunks: its stream ends with the connection.
    auto st = c.send("POST", "/v1/completions", kStreamed, {{"Connection", "keep-alive"}}, 10);
    EXPECT_EQ(st.result_int(), 200);
    EXPECT_FALSE(st.chunked());
    EXPECT_NE(st.body().find("data: [DONE]"), std::string::npos);
    EXPECT_TRUE(c.closed_by_server(5));
  }
  EXPECT_TRUE(s.wait_idle());
}

TEST(ServerHttp, IdleKeptAliveConnectionsCloseAfterTheTimeout) {
  ScriptedServer s({}, "", 1 << 20,
                   [](server::ServeOptions& o) { o.transport.keep_alive_timeout_s = 0.3; });
  Connection c(s.port());
  EXPECT_EQ(c.send("POST", "/v1/completions", kCompletion).result_int(), 200);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(c.closed_by_server(5));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(waited, 0.2);
  EXPECT_LT(waited, 3.0);
}

TEST(ServerHttp, ConnectionsPastTheLimitGet503) {
  ScriptedServer s({}, "", 1 << 20,
                   [](server::ServeOptions& o) { o.transport.max_connections = 2; });
  Connection a(s.port()), b(s.port());
  EXPECT_EQ(a.send("GET", "/health").result_int(), 200);
  EXPECT_EQ(b.send("GET", "/health").result_int(), 200);
  const auto r = http_request(s.port(), "GET", "/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("connections"), std::string::npos) << r.body;
  EXPECT_EQ(a.send("GET", "/health").result_int(), 200);
}

TEST(ServerHttp, NoCorsHeadersWithoutTheFlag) {
  ScriptedServer s;
  const auto r =
      http_request(s.port(), "POST", "/v1/completions", kCompletion, {{"Origin", "http://a.b"}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
  const auto pre =
      http_request(s.port(), "OPTIONS", "/v1/completions", "",
                   {{"Origin", "http://a.b"}, {"Access-Control-Request-Method", "POST"}});
  EXPECT_EQ(pre.status, 405);
  EXPECT_EQ(pre.headers.count("access-control-allow-origin"), 0u);
}

TEST(ServerHttp, CorsWithAnyOrigin) {
  ScriptedServer s({}, "sekret", 1 << 20,
                   [](server::ServeOptions& o) { o.transport.cors.allowed_origins = {"*"}; });
  // A preflight needs no API key.
  const auto pre = http_request(s.port(), "OPTIONS", "/v1/chat/completions", "",
                                {{"Origin", "http://a.b"},
                                 {"Access-Control-Request-Method", "POST"},
                                 {"Access-Control-Request-Headers", "authorization,content-type"}});
  EXPECT_EQ(pre.status, 204);
  EXPECT_EQ(pre.headers.at("access-control-allow-origin"), "*");
  EXPECT_NE(pre.headers.at("access-control-allow-methods").find("POST"), std::string::npos);
  EXPECT_EQ(pre.headers.at("access-control-allow-headers"), "authorization,content-type");
  EXPECT_EQ(pre.headers.count("access-control-max-age"), 1u);
  const Headers auth = {{"Origin", "http://a.b"}, {"Authorization", "Bearer sekret"}};
  // Immediate, deferred and streamed responses, and errors, carry the header.
  for (const std::string& body : {kCompletion, kStreamed, std::string("{")}) {
    const auto r = http_request(s.port(), "POST", "/v1/completions", body, auth);
    EXPECT_EQ(r.headers.at("access-control-allow-origin"), "*") << body;
  }
  EXPECT_EQ(http_request(s.port(), "GET", "/v1/models", "", {{"Origin", "http://a.b"}})
                .headers.at("access-control-allow-origin"),
            "*");
}

TEST(ServerHttp, CorsWithListedOriginsMethodsAndHeaders) {
  ScriptedServer s({}, "", 1 << 20, [](server::ServeOptions& o) {
    o.transport.cors.allowed_origins = server::split_comma_list("http://a.b, https://c.d:8443");
    o.transport.cors.allowed_methods = {"GET", "POST"};
    o.transport.cors.allowed_headers = {"Content-Type"};
  });
  auto preflight = [&](const std::string& origin, const std::string& method,
                       const std::string& headers) {
    return http_request(s.port(), "OPTIONS", "/v1/completions", "",
                        {{"Origin", origin},
                         {"Access-Control-Request-Method", method},
                         {"Access-Control-Request-Headers", headers}});
  };
  auto ok = preflight("https://c.d:8443", "POST", "content-type");
  EXPECT_EQ(ok.status, 204);
  EXPECT_EQ(ok.headers.at("access-control-allow-origin"), "https://c.d:8443");
  EXPECT_EQ(ok.headers.at("access-control-allow-methods"), "GET, POST");
  EXPECT_EQ(ok.headers.at("access-control-allow-headers"), "Content-Type");
  EXPECT_EQ(preflight("http://evil.example", "POST", "").status, 400);
  EXPECT_EQ(preflight("http://a.b", "DELETE", "").status, 400);
  EXPECT_EQ(preflight("http://a.b", "POST", "x-secret").status, 400);
  // Actual responses: the origin echoed (with Vary: Origin) when listed, nothing when not.
  auto r =
      http_request(s.port(), "POST", "/v1/completions", kCompletion, {{"Origin", "http://a.b"}});
  EXPECT_EQ(r.headers.at("access-control-allow-origin"), "http://a.b");
  EXPECT_EQ(r.headers.at("vary"), "Origin");
  r = http_request(s.port(), "POST", "/v1/completions", kCompletion,
                   {{"Origin", "http://evil.example"}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
}

TEST(ServerHttp, CorsOptionsAreChecked) {
  server::CorsOptions o;
  o.allowed_origins = {"http://a.b/path"};
  EXPECT_THROW(o.validate(), Error);
  o.allowed_origins = {"a.b"};
  EXPECT_THROW(o.validate(), Error);
  o.allowed_origins = {"*"};
  o.allowed_methods = {"PO ST"};
  EXPECT_THROW(o.validate(), Error);
  o.allowed_methods = {"POST"};
  o.allowed_headers = {"a:b"};
  EXPECT_THROW(o.validate(), Error);
  o.allowed_headers = {"*"};
  EXPECT_NO_THROW(o.validate());
}

TEST(ServerHttp, HostNamesResolve) {
  ScriptedServer s({}, "", 1 << 20,
                   [](server::ServeOptions& o) { o.transport.host = "localhost"; });
  EXPECT_EQ(http_request(s.port(), "GET", "/health").status, 200);  // localhost: 127.0.0.1
  EXPECT_THROW(
      ScriptedServer({}, "", 1 << 20,
                     [](server::ServeOptions& o) { o.transport.host = "no-such-host.invalid"; }),
      Error);
}

}  // namespace
}  // namespace longctx
