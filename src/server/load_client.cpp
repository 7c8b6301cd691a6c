#include "server/load_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_map>

#include "longctx/core/error.h"

namespace longctx::server {

double LoadResult::percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct Conn {
  int fd = -1;
  std::string out;  // request bytes not yet sent
  size_t sent = 0;
  double start = 0;
  double first_text = 0;
  int cancel_after = -1;  // events; -1: read to the end
  // Response parsing.
  std::string raw;  // bytes before the end of the headers, then undecoded chunk bytes
  bool headers_done = false;
  int status = 0;
  bool chunked = false;
  bool body_done = false;  // the terminating zero-length chunk arrived
  std::string sse;         // decoded body not yet split into events
  int events = 0;
  int finish_reasons = 0;
  bool done_seen = false;
  std::string error;  // the first problem found
};

void fail(Conn& c, std::string why) {
  if (c.error.empty()) c.error = std::move(why);
}

// One "data: ..." payload.
void on_event(Conn& c, std::string_view data, LoadResult& r, double now) {
  ++c.events;
  ++r.events;
  if (c.done_seen) return fail(c, "an event after [DONE]");
  if (data == "[DONE]") {
    c.done_seen = true;
    return;
  }
  nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail(c, "an event that is not a JSON object");
  if (j.contains("error")) return fail(c, "an error event: " + j["error"].dump());
  if (!j.contains("choices") || !j["choices"].is_array())
    return fail(c, "an event without choices");
  for (const auto& ch : j["choices"]) {
    std::string text;
    if (ch.contains("text") && ch["text"].is_string()) text = ch["text"];
    if (ch.contains("delta") && ch["delta"].contains("content") &&
        ch["delta"]["content"].is_string())
      text = ch["delta"]["content"];
    if (!text.empty() && c.first_text == 0) c.first_text = now;
    r.text_bytes += static_cast<int64_t>(text.size());
    if (ch.contains("finish_reason") && !ch["finish_reason"].is_null()) ++c.finish_reasons;
  }
}

void split_events(Conn& c, LoadResult& r, double now) {
  size_t end;
  while ((end = c.sse.find("\n\n")) != std::string::npos) {
    std::string_view ev(c.sse.data(), end);
    size_t pos = 0;
    while (pos <= ev.size()) {
      size_t nl = ev.find('\n', pos);
      if (nl == std::string_view::npos) nl = ev.size();
      std::string_view line = ev.substr(pos, nl - pos);
      if (line.starts_with("data: ")) on_event(c, line.substr(6), r, now);
      pos = nl + 1;
    }
    c.sse.erase(0, end + 2);
  }
}

// Decodes what arrived; returns false when the response is complete.
void parse(Conn& c, LoadResult& r, double now) {
  if (!c.headers_done) {
    const size_t end = c.raw.find("\r\n\r\n");
    if (end == std::string::npos) return;
    const std::string head = c.raw.substr(0, end);
    c.raw.erase(0, end + 4);
    c.headers_done = true;
    if (head.size() < 12 || !head.starts_with("HTTP/1.1 ")) return fail(c, "not an HTTP response");
    c.status = std::atoi(head.c_str() + 9);
    std::string lower = head;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    c.chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
    if (c.status != 200) return fail(c, "HTTP " + std::to_string(c.status));
    if (!c.chunked) return fail(c, "a 200 response that is not chunked (not a stream)");
  }
  if (!c.chunked) return;
  while (!c.body_done) {
    const size_t eol = c.raw.find("\r\n");
    if (eol == std::string::npos) return;
    const size_t size = std::strtoul(c.raw.substr(0, eol).c_str(), nullptr, 16);
    if (c.raw.size() < eol + 2 + size + 2) return;
    if (c.raw.compare(eol + 2 + size, 2, "\r\n") != 0) return fail(c, "bad chunk framing");
    if (size == 0) {
      c.body_done = true;
    } else {
      c.sse.append(c.raw, eol + 2, size);
    }
    c.raw.erase(0, eol + 2 + size + 2);
  }
  split_events(c, r, now);
}

}  // namespace

LoadResult run_sse_load(const LoadOptions& o) {
  LONGCTX_CHECK(o.body != nullptr && o.concurrency >= 1 && o.total >= 0,
                ErrorCode::kInvalidArgument, "load test: need a body function, concurrency >= 1");
  LoadResult r;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(o.port));
  LONGCTX_CHECK(inet_pton(AF_INET, o.host.c_str(), &addr.sin_addr) == 1,
                ErrorCode::kInvalidArgument, "load test: '{}' is not an IPv4 address", o.host);
  const int ep = epoll_create1(0);
  LONGCTX_CHECK(ep >= 0, ErrorCode::kIo, "epoll_create1: {}", std::strerror(errno));
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> unit(0, 1);
  std::unordered_map<int, std::unique_ptr<Conn>> open;
  int started = 0;
  const double t0 = now_s();

  auto finish = [&](Conn& c, bool eof) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    close(c.fd);
    const bool cancelled = c.cancel_after >= 0 && c.events >= c.cancel_after && c.error.empty();
    if (cancelled) {
      ++r.cancelled;
    } else if (c.error.empty() && c.body_done && c.done_seen && c.finish_reasons == 1 &&
               c.sse.empty()) {
      ++r.completed;
      const double end = now_s();
      r.e2e_s.push_back(end - c.start);
      r.ttft_s.push_back((c.first_text > 0 ? c.first_text : end) - c.start);
    } else {
      ++r.failed;
      if (c.error.empty()) {
        c.error = eof ? "the connection closed before the stream ended" : "cut short";
        if (c.finish_reasons != 1 && c.done_seen)
          c.error = std::to_string(c.finish_reasons) + " finish reasons";
      }
      if (r.failures.size() < 10) r.failures.push_back(c.error);
    }
    open.erase(c.fd);
  };

  while (started < o.total || !open.empty()) {
    while (static_cast<int>(open.size()) < o.concurrency && started < o.total) {
      auto c = std::make_unique<Conn>();
      const std::string body = o.body(started);
      c->out = "POST " + o.path + " HTTP/1.1\r\nHost: " + o.host +
               "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n";
      if (!o.api_key.empty()) c->out += "Authorization: Bearer " + o.api_key + "\r\n";
      c->out += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
      if (o.cancel_fraction > 0 && unit(rng) < o.cancel_fraction)
        c->cancel_after = static_cast<int>(rng() % 4);
      ++started;
      c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (c->fd < 0) {
        ++r.failed;
        if (r.failures.size() < 10) r.failures.push_back(std::string("socket: ") + strerror(errno));
        continue;
      }
      int one = 1;
      setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      c->start = now_s();
      if (connect(c->fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
          errno != EINPROGRESS) {
        ++r.failed;
        if (r.failures.size() < 10)
          r.failures.push_back(std::string("connect: ") + strerror(errno));
        close(c->fd);
        continue;
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
      ev.data.fd = c->fd;
      epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
      const int fd = c->fd;
      open.emplace(fd, std::move(c));
    }
    if (now_s() - t0 > o.timeout_s) {
      r.timed_out = true;
      while (!open.empty()) finish(*open.begin()->second, false);
      break;
    }
    epoll_event events[256];
    const int n = epoll_wait(ep, events, 256, 100);
    for (int i = 0; i < n; ++i) {
      auto it = open.find(events[i].data.fd);
      if (it == open.end()) continue;
      Conn& c = *it->second;
      if ((events[i].events & EPOLLOUT) && c.sent < c.out.size()) {
        const ssize_t w = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (w > 0) c.sent += static_cast<size_t>(w);
        if (w < 0 && errno != EAGAIN) {
          fail(c, std::string("send: ") + strerror(errno));
          finish(c, false);
          continue;
        }
        if (c.sent == c.out.size()) {
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.fd = c.fd;
          epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
        }
      }
      if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        char buf[16384];
        bool eof = false;
        while (true) {
          const ssize_t got = recv(c.fd, buf, sizeof buf, 0);
          if (got > 0) {
            c.raw.append(buf, static_cast<size_t>(got));
            continue;
          }
          if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) eof = true;
          break;
        }
        parse(c, r, now_s());
        if (c.cancel_after >= 0 && c.events >= c.cancel_after && c.error.empty()) {
          finish(c, false);  // the client goes away mid-stream
        } else if (!c.error.empty() || c.body_done || eof) {
          finish(c, eof && !c.body_done);
        }
      }
    }
  }
  close(ep);
  r.wall_s = now_s() - t0;
  return r;
}

}  // namespace longctx::server
