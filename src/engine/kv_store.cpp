#include "engine/kv_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/shared_library.h"
#include "longctx/core/error.h"
#include "longctx/core/logging.h"

namespace longctx {

namespace {

// hiredis 0.14's API (Debian's libhiredis0.14), opened at run time as libzmq is: binaries that
// use no store do not need the library.
struct Hiredis {
  decltype(&::redisConnectWithTimeout) connect;
  decltype(&::redisSetTimeout) set_timeout;
  decltype(&::redisCommandArgv) command;
  decltype(&::redisAppendCommandArgv) append;
  decltype(&::redisGetReply) get_reply;
  decltype(&::freeReplyObject) free_reply;
  decltype(&::redisFree) free;
};

const Hiredis& hiredis() {
  static const Hiredis lib = [] {
    const SharedLibrary h("libhiredis.so.0.14", "--kv-store needs hiredis", "libhiredis0.14");
    Hiredis r{};
    h.load("redisConnectWithTimeout", r.connect);
    h.load("redisSetTimeout", r.set_timeout);
    h.load("redisCommandArgv", r.command);
    h.load("redisAppendCommandArgv", r.append);
    h.load("redisGetReply", r.get_reply);
    h.load("freeReplyObject", r.free_reply);
    h.load("redisFree", r.free);
    return r;
  }();
  return lib;
}

constexpr char kMagic[4] = {'L', 'C', 'K', 'V'};
constexpr uint32_t kFormat = 1;
// magic, format, block size, parent, hash, payload bytes, checksum
constexpr size_t kHeaderBytes = 4 + 4 + 4 + 8 + 8 + 8 + 8;
constexpr auto kRetryAfter = std::chrono::seconds(1);
// Sent values the writer keeps for the next ones (memory: this many blocks).
constexpr size_t kSpareValues = 4;

template <typename T>
void put_le(std::string& s, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

template <typename T>
T get_le(const char* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

timeval to_timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

}  // namespace

// One blocking hiredis connection, reconnected on demand, with a pause after a failure.
struct KvStore::Connection {
  const KvStore& store;
  redisContext* ctx = nullptr;
  std::chrono::steady_clock::time_point retry_at{};

  explicit Connection(const KvStore& s) : store(s) {}
  ~Connection() { drop(); }
  void drop() {
    if (ctx != nullptr) hiredis().free(ctx);
    ctx = nullptr;
  }
  bool ready() {
    if (ctx != nullptr) return true;
    if (std::chrono::steady_clock::now() < retry_at) return false;
    ctx = hiredis().connect(store.host_.c_str(), store.port_, to_timeval(store.timeout_ms_));
    if (ctx == nullptr || ctx->err != 0) {
      fail(ctx != nullptr ? ctx->errstr : "out of memory");
      return false;
    }
    hiredis().set_timeout(ctx, to_timeval(store.timeout_ms_));
    return true;
  }
  void fail(const char* what) {
    LONGCTX_LOG_WARN("KV store {}: {}; recomputing, retrying in 1 s", store.url_, what);
    drop();
    retry_at = std::chrono::steady_clock::now() + kRetryAfter;
  }
  // A command's reply, or null after an error (logged; the connection is dropped).
  redisReply* run(std::span<const std::string_view> args) {
    if (!append(args)) return nullptr;
    return next_reply();
  }
  // Queues a command (Redis pipelining: sent with the next reply's read). False after an error
  // (logged; the connection is dropped).
  bool append(std::span<const std::string_view> args) {
    if (!ready()) return false;
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (std::string_view a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (hiredis().append(ctx, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
        REDIS_OK) {
      fail(ctx->errstr[0] != '\0' ? ctx->errstr : "out of memory");
      return false;
    }
    return true;
  }
  // The reply of the oldest command appended and not answered yet, or null after an error
  // (logged; a failed connection is dropped, an error reply leaves it usable).
  redisReply* next_reply() {
    if (ctx == nullptr) return nullptr;
    void* reply = nullptr;
    if (hiredis().get_reply(ctx, &reply) != REDIS_OK || reply == nullptr) {
      fail(ctx->errstr[0] != '\0' ? ctx->errstr : "no reply");
      return nullptr;
    }
    auto* r = static_cast<redisReply*>(reply);
    if (r->type == REDIS_REPLY_ERROR) {
      LONGCTX_LOG_WARN("KV store {}: {}", store.url_, std::string(r->str, r->len));
      hiredis().free_reply(r);
      return nullptr;
    }
    return r;
  }
};

KvStore::KvStore(const std::string& url, std::string ns, int64_t block_size, int64_t block_bytes,
                 int timeout_ms, size_t max_queued_writes, bool pinned_staging,
                 int64_t staging_bytes)
    : url_(url),
      ns_(std::move(ns)),
      block_size_(block_size),
      block_bytes_(block_bytes),
      timeout_ms_(timeout_ms),
      max_queued_(max_queued_writes),
      staging_(KvBlockBuffers::count_for(staging_bytes, std::max<int64_t>(block_bytes, 1), 4,
                                         static_cast<int64_t>(max_queued_writes)),
               std::max<int64_t>(block_bytes, 1), pinned_staging) {
  constexpr std::string_view kScheme = "redis://";
  const auto colon = url.rfind(':');
  LONGCTX_CHECK(url.starts_with(kScheme) && colon != std::string::npos && colon > kScheme.size() &&
                    colon + 1 < url.size(),
                ErrorCode::kInvalidArgument, "--kv-store {}: expected redis://HOST:PORT", url);
  host_ = url.substr(kScheme.size(), colon - kScheme.size());
  const std::string port = url.substr(colon + 1);
  LONGCTX_CHECK(port.find_first_not_of("0123456789") == std::string::npos && port.size() <= 5 &&
                    std::stoi(port) > 0 && std::stoi(port) < 65536,
                ErrorCode::kInvalidArgument, "--kv-store {}: port \"{}\" is not in [1, 65535]", url,
                port);
  port_ = std::stoi(port);
  LONGCTX_CHECK(block_size > 0 && block_bytes > 0, ErrorCode::kInvalidArgument,
                "KV store: blocks of {} tokens, {} bytes", block_size, block_bytes);
  hiredis();  // a missing library is a start-up error
  for (size_t i = 0; i < kReaders; ++i) readers_.push_back(std::make_unique<Connection>(*this));
  writer_ = std::make_unique<Connection>(*this);
  thread_ = std::thread([this] { run_writer(); });
}

KvStore::~KvStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string KvStore::key(uint64_t hash) const {
  return fmt::format("longctx:kv:{}:{:016x}", ns_, hash);
}

std::string KvStore::frame(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                           std::span<const std::byte> payload) {
  std::string v;
  if (!spare_.empty()) {
    v = std::move(spare_.back());
    spare_.pop_back();
    v.clear();
  }
  v.reserve(kHeaderBytes + tokens.size_bytes() + payload.size());
  v.append(kMagic, 4);
  put_le<uint32_t>(v, kFormat);
  put_le<uint32_t>(v, static_cast<uint32_t>(block_size_));
  put_le<uint64_t>(v, parent);
  put_le<uint64_t>(v, hash);
  put_le<uint64_t>(v, payload.size());
  put_le<uint64_t>(v, 0);  // the checksum (seal())
  for (int32_t t : tokens) put_le<uint32_t>(v, static_cast<uint32_t>(t));
  v.append(reinterpret_cast<const char*>(payload.data()), payload.size());
  return v;
}

void KvStore::seal(std::string& v) {
  constexpr size_t kChecksumAt = kHeaderBytes - 8;
  const uint64_t sum =
      XXH64(v.data() + kHeaderBytes, v.size() - kHeaderBytes, XXH64(v.data(), kChecksumAt, 0));
  for (size_t i = 0; i < 8; ++i) v[kChecksumAt + i] = static_cast<char>((sum >> (8 * i)) & 0xff);
}

size_t KvStore::num_unstaged() const {
  size_t n = 0;
  for (const Write& q : queue_) n += q.buffer < 0 ? 1 : 0;
  return n;
}

void KvStore::put(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                  std::string bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (num_unstaged() >= max_queued_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    Write w;
    w.hash = hash;
    w.parent = parent;
    w.tokens.assign(tokens.begin(), tokens.end());
    w.bytes = std::move(bytes);
    queue_.push_back(std::move(w));
  }
  cv_.notify_all();
}

int32_t KvStore::take_staging() {
  const int32_t b = staging_.try_take();
  if (b < 0) dropped_.fetch_add(1, std::memory_order_relaxed);
  return b;
}

void KvStore::put_staged(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                         int32_t buffer, std::function<void()> wait) {
  Write w;
  w.hash = hash;
  w.parent = parent;
  w.tokens.assign(tokens.begin(), tokens.end());
  w.buffer = buffer;
  w.wait = std::move(wait);
  {
    // No bound to check: the staging buffers bound the staged blocks.
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(w));
  }
  cv_.notify_all();
}

void KvStore::run_writer() {
  for (;;) {
    Write* staged = nullptr;
    Write w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      busy_ = false;
      cv_.notify_all();  // flush() waits for an idle writer
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      busy_ = true;
      // Staged blocks first, out of their buffers into the queue's own memory: the staging
      // buffers are few (pinned memory), the queue is longer, but bounded too: with
      // max_queued_ blocks out of their buffers, the oldest is sent first (the staging buffers
      // then fill and later blocks are dropped). Only this thread removes entries, and a
      // deque's push_back keeps references to them valid.
      if (num_unstaged() < max_queued_) {
        for (Write& q : queue_) {
          if (q.buffer >= 0) {
            staged = &q;
            break;
          }
        }
      }
      if (staged == nullptr) {
        w = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (staged != nullptr) {
      if (staged->wait) staged->wait();
      std::string value =
          frame(staged->hash, staged->parent, staged->tokens, staging_.bytes(staged->buffer));
      staging_.give_back(staged->buffer);
      std::lock_guard<std::mutex> lock(mu_);
      staged->bytes = std::move(value);
      staged->framed = true;
      staged->buffer = -1;
      staged->wait = nullptr;
      continue;
    }
    if (w.buffer >= 0) {  // sent straight from its staging buffer
      if (w.wait) w.wait();
      w.bytes = frame(w.hash, w.parent, w.tokens, staging_.bytes(w.buffer));
      w.framed = true;
      staging_.give_back(w.buffer);
    }
    const std::string k = key(w.hash);
    std::string value = w.framed
                            ? std::move(w.bytes)
                            : frame(w.hash, w.parent, w.tokens, std::as_bytes(std::span(w.bytes)));
    w.bytes = std::string();  // the block's bytes are in `value` now
    seal(value);
    const std::string_view args[] = {"SET", k, value};
    if (redisReply* r = writer_->run(args)) {
      hiredis().free_reply(r);
      bytes_written_.fetch_add(static_cast<int64_t>(value.size()), std::memory_order_relaxed);
    } else {
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
    if (spare_.size() < kSpareValues) spare_.push_back(std::move(value));
  }
}

void KvStore::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

const char* KvStore::check(const char* p, size_t len, const KvStoreBlockRef& b) const {
  const size_t want = kHeaderBytes + b.tokens.size_bytes() + static_cast<size_t>(block_bytes_);
  if (len != want) return "wrong size";
  if (std::memcmp(p, kMagic, 4) != 0 || get_le<uint32_t>(p + 4) != kFormat ||
      get_le<uint32_t>(p + 8) != block_size_)
    return "wrong format";
  if (get_le<uint64_t>(p + 12) != b.parent || get_le<uint64_t>(p + 20) != b.hash ||
      get_le<uint64_t>(p + 28) != static_cast<uint64_t>(block_bytes_))
    return "another block";
  if (XXH64(p + kHeaderBytes, len - kHeaderBytes, XXH64(p, 36, 0)) != get_le<uint64_t>(p + 36))
    return "checksum mismatch";
  for (size_t i = 0; i < b.tokens.size(); ++i)
    if (get_le<uint32_t>(p + kHeaderBytes + 4 * i) != static_cast<uint32_t>(b.tokens[i]))
      return "another prefix (hash collision)";
  return nullptr;
}

int64_t KvStore::get_prefix(std::span<const KvStoreBlockRef> blocks,
                            const std::function<bool(size_t, std::span<const std::byte>)>& on_hit) {
  if (blocks.empty()) return 0;
  // kReaders threads, each with a connection of its own, GET and check the blocks (in order of
  // index, at most kReadAhead past the one this thread hands on); this thread hands them to
  // on_hit in order. A 16 MiB value costs milliseconds to read off the socket and to checksum,
  // which one thread alone would pay for every block.
  enum class State { kPending, kValue, kMiss, kFailed };
  struct Result {
    State state = State::kPending;
    redisReply* reply = nullptr;  // kValue: the checked value
    const char* problem = nullptr;
  };
  std::vector<Result> results(blocks.size());
  std::mutex mu;
  std::condition_variable cv;
  size_t next = 0;             // the next block a reader takes
  size_t consumed = 0;         // blocks handed on (or that ended the lookup)
  size_t end = blocks.size();  // no block at or past a miss is read
  bool stop = false;
  auto read = [&](Connection& conn) {
    for (;;) {
      size_t i = 0;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || next >= end || next < consumed + kReadAhead; });
        if (stop || next >= end) return;
        i = next++;
      }
      Result r;
      const std::string k = key(blocks[i].hash);
      const std::string_view args[] = {"GET", k};
      redisReply* reply = conn.run(args);
      if (reply == nullptr) {
        r.state = State::kFailed;  // logged by the connection
      } else if (reply->type == REDIS_REPLY_NIL) {
        r.state = State::kMiss;
      } else if (reply->type != REDIS_REPLY_STRING) {
        r.state = State::kFailed;
        r.problem = "not a string";
      } else if ((r.problem = check(reply->str, reply->len, blocks[i])) != nullptr) {
        r.state = State::kFailed;
      } else {
        r.state = State::kValue;
        r.reply = reply;
        reply = nullptr;
      }
      if (reply != nullptr) hiredis().free_reply(reply);
      {
        std::lock_guard<std::mutex> lock(mu);
        results[i] = r;
        if (r.state != State::kValue) end = std::min(end, i + 1);
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> threads;
  // Stops and joins the readers however this function leaves (on_hit may throw).
  struct Joiner {
    std::vector<std::thread>& threads;
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    std::vector<Result>& results;
    ~Joiner() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      for (std::thread& t : threads) t.join();
      for (Result& r : results)
        if (r.reply != nullptr) hiredis().free_reply(r.reply);
    }
  } joiner{threads, mu, cv, stop, results};
  for (auto& conn : readers_) threads.emplace_back(read, std::ref(*conn));

  int64_t taken = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    Result r;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return results[i].state != State::kPending; });
      r = results[i];
      results[i].reply = nullptr;  // this thread frees it
    }
    bool more = false;
    if (r.state == State::kValue) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      bytes_read_.fetch_add(block_bytes_, std::memory_order_relaxed);
      const auto* payload = reinterpret_cast<const std::byte*>(r.reply->str + kHeaderBytes +
                                                               blocks[i].tokens.size_bytes());
      struct Free {
        redisReply* r;
        ~Free() { hiredis().free_reply(r); }
      } free_reply{r.reply};
      more = on_hit(i, {payload, static_cast<size_t>(block_bytes_)});
      if (more) ++taken;
    } else if (r.state == State::kMiss) {
      misses_.fetch_add(1, std::memory_order_relaxed);
    } else {
      if (r.problem != nullptr)
        LONGCTX_LOG_WARN("KV store {}: the value of {} is malformed ({}); recomputing the block",
                         url_, key(blocks[i].hash), r.problem);
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ++consumed;
      if (!more) stop = true;
    }
    cv.notify_all();
    if (!more) break;
  }
  return taken;
}

std::optional<std::string> KvStore::get(uint64_t hash, uint64_t parent,
                                        std::span<const int32_t> tokens) {
  std::optional<std::string> out;
  const KvStoreBlockRef b{hash, parent, tokens};
  get_prefix(std::span(&b, 1), [&](size_t, std::span<const std::byte> bytes) {
    out.emplace(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return true;
  });
  return out;
}

KvStoreStats KvStore::stats() const {
  KvStoreStats s;
  s.hits = hits_.load();
  s.misses = misses_.load();
  s.errors = errors_.load();
  s.bytes_read = bytes_read_.load();
  s.bytes_written = bytes_written_.load();
  s.writes_dropped = dropped_.load();
  return s;
}

}  // namespace longctx
