// A redis-server child process on a free loopback port, without persistence (Debian's
// redis-server on the PATH; a test that needs it fails, not skips, when it is missing). Ready
// once it answers PING over a plain socket, so tests that only need a store link no client.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace longctx::testing {

// A loopback port nothing listens on (the kernel's pick, then closed).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// True when a server on `port` answers PING with +PONG.
inline bool redis_answers_ping(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const char ping[] = "PING\r\n";
    char reply[8] = {};
    ok = ::send(fd, ping, sizeof ping - 1, 0) == sizeof ping - 1 &&
         ::recv(fd, reply, 7, MSG_WAITALL) == 7 && std::strncmp(reply, "+PONG\r\n", 7) == 0;
  }
  ::close(fd);
  return ok;
}

// redis-server on a free port; killed by stop() or the destructor.
class RedisProcess {
 public:
  // `extra`: more redis-server options ("--io-threads", "4", ...).
  explicit RedisProcess(const std::vector<std::string>& extra = {}) : port_(free_port()) {
    const std::string port = std::to_string(port_);
    std::vector<std::string> args = {"redis-server", "--port",     port,     "--bind",
                                     "127.0.0.1",    "--save",     "",       "--appendonly",
                                     "no",           "--loglevel", "warning"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(stdout);  // the child would print what stdout holds again
    pid_ = ::fork();
    if (pid_ == 0) {
      if (std::freopen("/dev/null", "w", stdout) == nullptr) ::_exit(126);
      ::execvp("redis-server", argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 100 && !up_; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "redis-server did not start (exit " << WEXITSTATUS(status)
                      << "): install it (Debian: redis-server, tools/install_deps.sh)";
        return;
      }
      up_ = redis_answers_ping(port_);
    }
  }
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;
  virtual ~RedisProcess() { stop_process(); }
  void stop_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
    up_ = false;
  }
  bool up() const { return up_; }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  int port_;
  pid_t pid_ = -1;
  bool up_ = false;
};

}  // namespace longctx::testing
