#include "engine/kv_store.h"

#include <hiredis/hiredis.h>

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
    if (!ready()) return nullptr;
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (std::string_view a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        hiredis().command(ctx, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) {
      fail(ctx->errstr[0] != '\0' ? ctx->errstr : "no reply");
      return nullptr;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      LONGCTX_LOG_WARN("KV store {}: {}", store.url_, std::string(r->str, r->len));
      hiredis().free_reply(r);
      return nullptr;
    }
    return r;
  }
};

KvStore::KvStore(const std::string& url, std::string ns, int64_t block_size, int64_t block_bytes,
                 int timeout_ms, size_t max_queued_writes)
    : url_(url),
      ns_(std::move(ns)),
      block_size_(block_size),
      block_bytes_(block_bytes),
      timeout_ms_(timeout_ms),
      max_queued_(max_queued_writes) {
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
  reader_ = std::make_unique<Connection>(*this);
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

std::string KvStore::encode(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                            const std::string& bytes) const {
  std::string v;
  v.reserve(kHeaderBytes + tokens.size_bytes() + bytes.size());
  v.append(kMagic, 4);
  put_le<uint32_t>(v, kFormat);
  put_le<uint32_t>(v, static_cast<uint32_t>(block_size_));
  put_le<uint64_t>(v, parent);
  put_le<uint64_t>(v, hash);
  put_le<uint64_t>(v, bytes.size());
  const size_t checksum_at = v.size();
  put_le<uint64_t>(v, 0);
  for (int32_t t : tokens) put_le<uint32_t>(v, static_cast<uint32_t>(t));
  v += bytes;
  const uint64_t sum =
      XXH64(v.data() + kHeaderBytes, v.size() - kHeaderBytes, XXH64(v.data(), checksum_at, 0));
  for (size_t i = 0; i < 8; ++i) v[checksum_at + i] = static_cast<char>((sum >> (8 * i)) & 0xff);
  return v;
}

void KvStore::put(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                  std::string bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= max_queued_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back(
        {hash, parent, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(bytes)});
  }
  cv_.notify_all();
}

void KvStore::run_writer() {
  for (;;) {
    Write w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      busy_ = false;
      cv_.notify_all();  // flush() waits for an idle writer
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      w = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    const std::string k = key(w.hash);
    const std::string value = encode(w.hash, w.parent, w.tokens, w.bytes);
    w.bytes = std::string();  // the block's bytes are in `value` now
    const std::string_view args[] = {"SET", k, value};
    if (redisReply* r = writer_->run(args)) {
      hiredis().free_reply(r);
      bytes_written_.fetch_add(static_cast<int64_t>(value.size()), std::memory_order_relaxed);
    } else {
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void KvStore::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

std::optional<std::string> KvStore::get(uint64_t hash, uint64_t parent,
                                        std::span<const int32_t> tokens) {
  const std::string k = key(hash);
  const std::string_view args[] = {"GET", k};
  redisReply* r = reader_->run(args);
  if (r == nullptr) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  std::optional<std::string> out;
  const char* problem = nullptr;
  if (r->type == REDIS_REPLY_NIL) {
    misses_.fetch_add(1, std::memory_order_relaxed);
  } else if (r->type != REDIS_REPLY_STRING) {
    problem = "not a string";
  } else {
    const size_t want = kHeaderBytes + tokens.size_bytes() + static_cast<size_t>(block_bytes_);
    const char* p = r->str;
    if (r->len != want) {
      problem = "wrong size";
    } else if (std::memcmp(p, kMagic, 4) != 0 || get_le<uint32_t>(p + 4) != kFormat ||
               get_le<uint32_t>(p + 8) != block_size_) {
      problem = "wrong format";
    } else if (get_le<uint64_t>(p + 12) != parent || get_le<uint64_t>(p + 20) != hash ||
               get_le<uint64_t>(p + 28) != static_cast<uint64_t>(block_bytes_)) {
      problem = "another block";
    } else if (XXH64(p + kHeaderBytes, r->len - kHeaderBytes, XXH64(p, 36, 0)) !=
               get_le<uint64_t>(p + 36)) {
      problem = "checksum mismatch";
    } else {
      for (size_t i = 0; i < tokens.size() && problem == nullptr; ++i)
        if (get_le<uint32_t>(p + kHeaderBytes + 4 * i) != static_cast<uint32_t>(tokens[i]))
          problem = "another prefix (hash collision)";
      if (problem == nullptr) {
        out.emplace(p + kHeaderBytes + tokens.size_bytes(), static_cast<size_t>(block_bytes_));
        hits_.fetch_add(1, std::memory_order_relaxed);
        bytes_read_.fetch_add(block_bytes_, std::memory_order_relaxed);
      }
    }
  }
  if (problem != nullptr) {
    LONGCTX_LOG_WARN("KV store {}: the value of {} is malformed ({}); recomputing the block", url_,
                     k, problem);
    errors_.fetch_add(1, std::memory_order_relaxed);
  }
  hiredis().free_reply(r);
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
