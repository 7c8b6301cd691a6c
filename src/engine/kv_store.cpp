#include "engine/kv_store.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <unordered_set>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/shared_library.h"
#include "longctx/core/error.h"
#include "longctx/core/logging.h"

namespace longctx {

namespace {

// hiredis 0.14's API (Debian's libhiredis0.14), opened at run time as libzmq is: binaries that
// use no store do not need the library. It connects and sets the socket's timeouts; the commands
// go over the socket directly (kv_store.h, "Wire").
struct Hiredis {
  decltype(&::redisConnectWithTimeout) connect;
  decltype(&::redisSetTimeout) set_timeout;
  decltype(&::redisFree) free;
};

const Hiredis& hiredis() {
  static const Hiredis lib = [] {
    const SharedLibrary h("libhiredis.so.0.14", "--kv-store needs hiredis", "libhiredis0.14");
    Hiredis r{};
    h.load("redisConnectWithTimeout", r.connect);
    h.load("redisSetTimeout", r.set_timeout);
    h.load("redisFree", r.free);
    return r;
  }();
  return lib;
}

constexpr char kMagic[4] = {'L', 'C', 'K', 'V'};
constexpr uint32_t kFormat = 2;  // chunked values
// magic, format, block size, chunk, chunks, parent, hash, block bytes, checksum
constexpr size_t kHeaderBytes = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + 8;
constexpr size_t kChecksumAt = kHeaderBytes - 8;
constexpr auto kRetryAfter = std::chrono::seconds(1);
constexpr size_t kInputBytes = 64 << 10;  // a connection's receive buffer (reply lines)

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

// The checksum of a chunk: its header up to the checksum, the tokens, its bytes.
uint64_t chunk_checksum(const char* head, size_t head_bytes, std::span<const std::byte> payload) {
  XXH64_state_t s;
  XXH64_reset(&s, 0);
  XXH64_update(&s, head, kChecksumAt);
  XXH64_update(&s, head + kHeaderBytes, head_bytes - kHeaderBytes);
  XXH64_update(&s, payload.data(), payload.size());
  return XXH64_digest(&s);
}

// A Redis command's bytes up to its last argument's data: "*N\r\n$len\r\narg\r\n..." and the
// last argument's "$len\r\n".
std::string command_head(std::span<const std::string_view> args, size_t last_bytes) {
  std::string s = fmt::format("*{}\r\n", args.size() + 1);
  for (std::string_view a : args) s += fmt::format("${}\r\n{}\r\n", a.size(), a);
  s += fmt::format("${}\r\n", last_bytes);
  return s;
}

}  // namespace

// One blocking connection (hiredis connects; the I/O is the socket's), reconnected on demand,
// with a pause after a failure.
struct KvStore::Connection {
  enum class Got { kValue, kNil, kBad, kFailed };

  const KvStore& store;
  redisContext* ctx = nullptr;
  std::chrono::steady_clock::time_point retry_at{};
  std::vector<char> in = std::vector<char>(kInputBytes);  // received, not consumed: [lo, hi)
  size_t lo = 0, hi = 0;

  explicit Connection(const KvStore& s) : store(s) {}
  ~Connection() { drop(); }
  void drop() {
    if (ctx != nullptr) hiredis().free(ctx);
    ctx = nullptr;
    lo = hi = 0;
  }
  bool ready() {
    if (ctx != nullptr) return true;
    if (std::chrono::steady_clock::now() < retry_at) return false;
    ctx =
        hiredis().connect(store.host_.c_str(), store.port_, to_timeval(store.options_.timeout_ms));
    if (ctx == nullptr || ctx->err != 0) {
      fail(ctx != nullptr ? ctx->errstr : "out of memory");
      return false;
    }
    hiredis().set_timeout(ctx, to_timeval(store.options_.timeout_ms));  // SO_RCVTIMEO, SNDTIMEO
    return true;
  }
  void fail(const char* what) {
    LONGCTX_LOG_WARN("KV store {}: {}; recomputing, retrying in 1 s", store.url_, what);
    drop();
    retry_at = std::chrono::steady_clock::now() + kRetryAfter;
  }
  bool fail_errno(const char* what) {
    const int e = errno;
    fail(e == EAGAIN || e == EWOULDBLOCK ? "timeout"
                                         : fmt::format("{}: {}", what, std::strerror(e)).c_str());
    return false;
  }
  // Sends every byte of `iov` (modified). False after a failure (logged, dropped).
  bool send(std::span<iovec> iov) {
    if (!ready()) return false;
    while (!iov.empty()) {
      msghdr m{};
      m.msg_iov = iov.data();
      m.msg_iovlen = std::min<size_t>(iov.size(), 512);
      const ssize_t n = ::sendmsg(ctx->fd, &m, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return fail_errno("send");
      auto left = static_cast<size_t>(n);
      while (!iov.empty() && left >= iov.front().iov_len) {
        left -= iov.front().iov_len;
        iov = iov.subspan(1);
      }
      if (left > 0) {
        iov.front().iov_base = static_cast<char*>(iov.front().iov_base) + left;
        iov.front().iov_len -= left;
      }
    }
    return true;
  }
  // Receives exactly n bytes into dst (nullptr: discards them), the buffered ones first.
  bool receive(char* dst, size_t n) {
    const size_t buffered = std::min(n, hi - lo);
    if (dst != nullptr) std::memcpy(dst, in.data() + lo, buffered);
    lo += buffered;
    n -= buffered;
    if (dst != nullptr) dst += buffered;
    while (n > 0) {
      char* to = dst != nullptr ? dst : in.data();
      const size_t want = dst != nullptr ? n : std::min(n, in.size());
      const ssize_t r = ::recv(ctx->fd, to, want, MSG_WAITALL);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) {
        fail("the store closed the connection");
        return false;
      }
      if (r < 0) return fail_errno("receive");
      n -= static_cast<size_t>(r);
      if (dst != nullptr) dst += r;
    }
    return true;
  }
  // A reply's first line without its "\r\n" (at most 64 bytes).
  bool line(std::string& out) {
    for (;;) {
      const char* begin = in.data() + lo;
      const char* nl = static_cast<const char*>(std::memchr(begin, '\n', hi - lo));
      if (nl != nullptr) {
        if (nl == begin || nl[-1] != '\r') break;
        out.assign(begin, nl - 1);
        lo = static_cast<size_t>(nl - in.data()) + 1;
        return true;
      }
      if (hi - lo > 64) break;
      if (lo > 0) {  // keep what is there at the front
        std::memmove(in.data(), in.data() + lo, hi - lo);
        hi -= lo;
        lo = 0;
      }
      const ssize_t r = ::recv(ctx->fd, in.data() + hi, in.size() - hi, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) {
        fail("the store closed the connection");
        return false;
      }
      if (r < 0) return fail_errno("receive");
      hi += static_cast<size_t>(r);
    }
    fail("malformed reply");
    return false;
  }
  // A simple-string reply (SET's "+OK"): true. An error reply: logged, false, the connection
  // kept. Anything else: false, the connection dropped.
  bool read_ok() {
    std::string l;
    if (ctx == nullptr || !line(l)) return false;
    if (l.starts_with('+')) return true;
    if (l.starts_with('-')) {
      LONGCTX_LOG_WARN("KV store {}: {}", store.url_, l.substr(1));
      return false;
    }
    fail("unexpected reply");
    return false;
  }
  // A GET reply of `head.size() + payload.size()` bytes: the first into head, the rest into
  // payload. kNil: no such key; kBad: an error reply or a value of another size (read past,
  // the connection kept); kFailed: the connection failed (logged, dropped).
  Got read_value(std::span<char> head, std::span<std::byte> payload) {
    std::string l;
    if (ctx == nullptr || !line(l)) return Got::kFailed;
    if (l.starts_with('-')) {
      LONGCTX_LOG_WARN("KV store {}: {}", store.url_, l.substr(1));
      return Got::kBad;
    }
    int64_t len = 0;
    const auto [end, ec] = std::from_chars(l.data() + 1, l.data() + l.size(), len);
    if (!l.starts_with('$') || ec != std::errc() || end != l.data() + l.size() || len < -1) {
      fail("unexpected reply");
      return Got::kFailed;
    }
    if (len == -1) return Got::kNil;
    if (static_cast<size_t>(len) != head.size() + payload.size())
      return receive(nullptr, static_cast<size_t>(len) + 2) ? Got::kBad : Got::kFailed;
    char crlf[2];
    if (!receive(head.data(), head.size()) ||
        !receive(reinterpret_cast<char*>(payload.data()), payload.size()) || !receive(crlf, 2))
      return Got::kFailed;
    return Got::kValue;
  }
};

KvStore::KvStore(const std::string& url, std::string ns, int64_t block_size, int64_t block_bytes,
                 KvStoreOptions options)
    : url_(url),
      ns_(std::move(ns)),
      block_size_(block_size),
      block_bytes_(block_bytes),
      options_(options),
      chunk_bytes_(std::clamp<int64_t>(options.chunk_bytes, 1, std::max<int64_t>(block_bytes, 1))),
      staging_(KvBlockBuffers::count_for(options.staging_bytes, std::max<int64_t>(block_bytes, 1),
                                         4, static_cast<int64_t>(options.max_queued_writes)),
               std::max<int64_t>(block_bytes, 1), options.pinned, /*initial=*/0) {
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
  LONGCTX_CHECK(
      block_size > 0 && block_bytes > 0 && options.chunk_bytes > 0 && options.timeout_ms > 0,
      ErrorCode::kInvalidArgument,
      "KV store: blocks of {} tokens, {} bytes, chunks of {} bytes, a timeout of {} ms", block_size,
      block_bytes, options.chunk_bytes, options.timeout_ms);
  hiredis();  // a missing library is a start-up error
  for (size_t i = 0; i < kReaders; ++i) readers_.push_back(std::make_unique<Connection>(*this));
  writer_ = std::make_unique<Connection>(*this);
  thread_ = std::thread([this] { run_writer(); });
  loader_ = std::thread([this] { run_loader(); });
}

KvStore::~KvStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (auto& l : loads_) l->stop();
    if (loading_ != nullptr) loading_->stop();
  }
  cv_.notify_all();
  loader_.join();
  thread_.join();
}

KvStoreLoad::KvStoreLoad(std::span<const KvStoreBlockRef> blocks)
    : imported_(blocks.size(), 0), wait_(blocks.size()) {
  for (const KvStoreBlockRef& b : blocks)
    tokens_.insert(tokens_.end(), b.tokens.begin(), b.tokens.end());
  size_t at = 0;
  for (const KvStoreBlockRef& b : blocks) {
    blocks_.push_back(
        {b.hash, b.parent, std::span<const int32_t>(tokens_).subspan(at, b.tokens.size())});
    at += b.tokens.size();
  }
}

std::vector<KvStoreLoad::Hit> KvStoreLoad::take_hits() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Hit> out(ready_.begin(), ready_.end());
  ready_.clear();
  return out;
}

void KvStoreLoad::imported(size_t index, std::function<void()> wait) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wait_.at(index) = std::move(wait);
    imported_.at(index) = 1;
  }
  cv_.notify_all();
}

void KvStoreLoad::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    ready_.clear();
  }
  cv_.notify_all();
}

bool KvStoreLoad::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void KvStoreLoad::wait(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return done_ || !ready_.empty(); });
}

bool KvStoreLoad::hand_on(size_t index, std::span<const std::byte> bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    ready_.push_back({index, bytes});
  }
  cv_.notify_all();
  return true;
}

void KvStoreLoad::wait_imported(size_t index) {
  std::function<void()> wait;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopped_ || imported_[index] != 0; });
    // Stopped before the engine took it: nothing copies out of the buffer.
    wait = std::move(wait_[index]);
  }
  if (wait) wait();
}

void KvStoreLoad::finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    ready_.clear();  // what the engine did not take by now, it never will (stopped)
  }
  cv_.notify_all();
}

std::shared_ptr<KvStoreLoad> KvStore::start_load(std::span<const KvStoreBlockRef> blocks) {
  auto load = std::make_shared<KvStoreLoad>(blocks);
  {
    std::lock_guard<std::mutex> lock(mu_);
    loads_.push_back(load);
  }
  cv_.notify_all();
  return load;
}

void KvStore::run_loader() {
  for (;;) {
    std::shared_ptr<KvStoreLoad> load;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !loads_.empty(); });
      if (stop_) {  // the loads left are not read
        for (auto& l : loads_) l->finish();
        loads_.clear();
        return;
      }
      load = std::move(loads_.front());
      loads_.pop_front();
      loading_ = load;
    }
    // Each block is handed to the engine thread; its read buffer is reused (and get_prefix
    // returns) only once the engine imported it and its copy finished, or the load stopped.
    get_prefix(load->blocks(),
               [&](size_t i, std::span<const std::byte> bytes, std::function<void()>* reuse_after) {
                 if (!load->hand_on(i, bytes)) return false;
                 *reuse_after = [load, i] { load->wait_imported(i); };
                 return true;
               });
    {
      std::lock_guard<std::mutex> lock(mu_);
      loading_ = nullptr;
    }
    load->finish();
  }
}

std::string KvStore::key(uint64_t hash, int64_t chunk) const {
  return fmt::format("longctx:kv:{}:{:016x}:{}", ns_, hash, chunk);
}

size_t KvStore::chunk_head_bytes() const {
  return kHeaderBytes + 4 * static_cast<size_t>(block_size_);
}

std::string KvStore::chunk_head(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                                int64_t chunk, std::span<const std::byte> payload) const {
  std::string v;
  v.reserve(chunk_head_bytes());
  v.append(kMagic, 4);
  put_le<uint32_t>(v, kFormat);
  put_le<uint32_t>(v, static_cast<uint32_t>(block_size_));
  put_le<uint32_t>(v, static_cast<uint32_t>(chunk));
  put_le<uint32_t>(v, static_cast<uint32_t>(num_chunks()));
  put_le<uint64_t>(v, parent);
  put_le<uint64_t>(v, hash);
  put_le<uint64_t>(v, static_cast<uint64_t>(block_bytes_));
  put_le<uint64_t>(v, 0);  // the checksum, below
  for (int32_t t : tokens) put_le<uint32_t>(v, static_cast<uint32_t>(t));
  const uint64_t sum = chunk_checksum(v.data(), v.size(), payload);
  for (size_t i = 0; i < 8; ++i) v[kChecksumAt + i] = static_cast<char>((sum >> (8 * i)) & 0xff);
  return v;
}

const char* KvStore::check(std::span<const char> head, std::span<const std::byte> payload,
                           const KvStoreBlockRef& b, int64_t chunk) const {
  const char* p = head.data();
  if (head.size() != kHeaderBytes + b.tokens.size_bytes()) return "wrong size";
  if (std::memcmp(p, kMagic, 4) != 0 || get_le<uint32_t>(p + 4) != kFormat ||
      get_le<uint32_t>(p + 8) != block_size_ || get_le<uint32_t>(p + 16) != num_chunks())
    return "wrong format";
  if (get_le<uint32_t>(p + 12) != chunk || get_le<uint64_t>(p + 20) != b.parent ||
      get_le<uint64_t>(p + 28) != b.hash ||
      get_le<uint64_t>(p + 36) != static_cast<uint64_t>(block_bytes_))
    return "another block's chunk";
  if (chunk_checksum(p, head.size(), payload) != get_le<uint64_t>(p + kChecksumAt))
    return "checksum mismatch";
  for (size_t i = 0; i < b.tokens.size(); ++i)
    if (get_le<uint32_t>(p + kHeaderBytes + 4 * i) != static_cast<uint32_t>(b.tokens[i]))
      return "another prefix (hash collision)";
  return nullptr;
}

void KvStore::put(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                  std::string bytes) {
  LONGCTX_CHECK(static_cast<int64_t>(bytes.size()) == block_bytes_, ErrorCode::kInvalidArgument,
                "KV store: a block of {} bytes, expected {}", bytes.size(), block_bytes_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (num_unstaged_ >= options_.max_queued_writes) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    Write w;
    w.hash = hash;
    w.parent = parent;
    w.tokens.assign(tokens.begin(), tokens.end());
    w.bytes = std::move(bytes);
    queue_.push_back(std::move(w));
    ++num_unstaged_;
  }
  cv_.notify_all();
}

int32_t KvStore::take_staging() { return staging_.try_take(); }

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

void KvStore::queue_export(int32_t block, uint64_t hash, uint64_t parent,
                           std::span<const int32_t> tokens) {
  if (waiting_.size() >= options_.max_waiting_exports) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  waiting_.push_back({block, hash, parent, std::vector<int32_t>(tokens.begin(), tokens.end())});
}

int64_t KvStore::start_exports(const CopyOut& copy) {
  int64_t started = 0;
  while (!waiting_.empty()) {
    const int32_t buffer = take_staging();
    if (buffer < 0) break;
    Export& e = waiting_.front();
    std::function<void()> wait = copy(e.block, staging(buffer));
    put_staged(e.hash, e.parent, e.tokens, buffer, std::move(wait));
    waiting_.pop_front();
    ++started;
  }
  return started;
}

void KvStore::forget_exports(std::span<const int32_t> blocks) {
  if (waiting_.empty() || blocks.empty()) return;
  const std::unordered_set<int32_t> written(blocks.begin(), blocks.end());
  const auto n = std::erase_if(waiting_, [&](const Export& e) { return written.count(e.block); });
  dropped_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
}

bool KvStore::send_block(const Write& w, std::span<const std::byte> payload) {
  // Every chunk's SET, pipelined, each chunk sent from where it lies; then their replies.
  const int64_t n = num_chunks();
  std::vector<std::string> heads;  // the command up to the value, then the chunk's header
  heads.reserve(static_cast<size_t>(n));
  std::vector<iovec> iov;
  static constexpr char kCrlf[] = "\r\n";
  int64_t value_bytes = 0;
  for (int64_t c = 0; c < n; ++c) {
    const auto begin = static_cast<size_t>(c * chunk_bytes_);
    const std::span<const std::byte> part =
        payload.subspan(begin, std::min(static_cast<size_t>(chunk_bytes_), payload.size() - begin));
    const std::string k = key(w.hash, c);
    const std::string_view args[] = {"SET", k};
    const std::string head = chunk_head(w.hash, w.parent, w.tokens, c, part);
    heads.push_back(command_head(args, head.size() + part.size()) + head);
    value_bytes += static_cast<int64_t>(head.size() + part.size());
  }
  for (int64_t c = 0; c < n; ++c) {
    const auto begin = static_cast<size_t>(c * chunk_bytes_);
    const size_t len = std::min(static_cast<size_t>(chunk_bytes_), payload.size() - begin);
    iov.push_back({heads[c].data(), heads[c].size()});
    iov.push_back({const_cast<std::byte*>(payload.data() + begin), len});
    iov.push_back({const_cast<char*>(kCrlf), 2});
  }
  if (!writer_->send(iov)) return false;
  bool ok = true;
  for (int64_t c = 0; c < n; ++c) {
    if (writer_->ctx == nullptr) return false;  // failed: the rest is not read
    ok = writer_->read_ok() && ok;
  }
  if (ok) bytes_written_.fetch_add(value_bytes, std::memory_order_relaxed);
  return ok;
}

void KvStore::run_writer() {
  // The whole pool, here rather than on demand: pinning host memory stalls the device's other
  // work (graph launches wait on the driver), which while decoding cost the 8B model's TPOT ~10 %
  // (H100, growth by 16 buffers during the decode after a 32K prefill), so it happens once, off
  // the engine thread, each buffer usable as soon as it is pinned.
  staging_.grow(staging_.count());
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
      if (w.buffer < 0) --num_unstaged_;
      busy_ = true;
    }
    if (w.wait) w.wait();
    const std::span<const std::byte> payload =
        w.buffer >= 0 ? std::span<const std::byte>(staging_.bytes(w.buffer))
                      : std::as_bytes(std::span(w.bytes));
    if (!send_block(w, payload)) errors_.fetch_add(1, std::memory_order_relaxed);
    if (w.buffer >= 0) staging_.give_back(w.buffer);
  }
}

void KvStore::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

int64_t KvStore::get_prefix(std::span<const KvStoreBlockRef> blocks, const OnHit& on_hit) {
  if (blocks.empty()) return 0;
  const std::lock_guard<std::mutex> reading(read_mu_);
  // kReaders threads, each with a connection of its own, GET the blocks' chunks in order (kPipeline
  // GETs sent, then their replies read), each into its place in the read buffer of its block
  // (block i's is i % kReadAhead), and check them; this thread hands the blocks on in order. A
  // reader fills a block's buffer only once the block kReadAhead before it was handed on and the
  // caller's copy out of it finished.
  if (reading_ == nullptr)
    reading_ = std::make_unique<KvBlockBuffers>(static_cast<int64_t>(kReadAhead), block_bytes_,
                                                options_.pinned);
  enum class State { kPending, kValue, kMiss, kFailed };
  struct Block {
    State state = State::kPending;
    int64_t chunks = 0;  // verified
    const char* problem = nullptr;
  };
  // A caller's copy out of a read buffer, waited for once by whoever needs the buffer first.
  struct Reuse {
    std::once_flag once;
    std::function<void()> wait;
    void operator()() {
      std::call_once(once, [this] {
        if (wait) wait();
      });
    }
  };
  const int64_t chunks = num_chunks();
  const size_t n = blocks.size();
  std::vector<Block> state(n);
  std::vector<std::shared_ptr<Reuse>> reuse(kReadAhead);  // per read buffer
  std::mutex mu;
  std::condition_variable cv;
  size_t next = 0;      // the next chunk a reader takes (block next / chunks)
  size_t consumed = 0;  // blocks handed on (or that ended the lookup)
  size_t end = n;       // no block at or past a miss is read
  bool stop = false;
  const size_t head_bytes = chunk_head_bytes();
  auto buffer = [&](size_t block) {
    return reading_->bytes(static_cast<int32_t>(block % kReadAhead));
  };
  auto read = [&](Connection& conn) {
    std::vector<char> heads(kPipeline * head_bytes);
    for (;;) {
      std::vector<size_t> batch;  // chunk numbers
      std::vector<std::shared_ptr<Reuse>> waits;
      {
        std::unique_lock<std::mutex> lock(mu);
        auto open = [&] {
          const size_t b = next / chunks;
          return b < end && b < consumed + kReadAhead;
        };
        cv.wait(lock, [&] { return stop || next / chunks >= end || open(); });
        if (stop || next / chunks >= end) return;
        while (batch.size() < kPipeline && open()) {
          if (next % chunks == 0 || batch.empty()) {
            const auto& r = reuse[(next / chunks) % kReadAhead];
            if (r != nullptr) waits.push_back(r);
          }
          batch.push_back(next++);
        }
      }
      for (auto& w : waits) (*w)();  // the buffer's previous block was copied out
      std::vector<iovec> iov;
      std::vector<std::string> cmds;
      cmds.reserve(batch.size());
      for (size_t u : batch) {
        const std::string k = key(blocks[u / chunks].hash, static_cast<int64_t>(u % chunks));
        cmds.push_back(fmt::format("*2\r\n$3\r\nGET\r\n${}\r\n{}\r\n", k.size(), k));
        iov.push_back({cmds.back().data(), cmds.back().size()});
      }
      const bool sent = conn.send(iov);
      for (size_t j = 0; j < batch.size(); ++j) {
        const size_t i = batch[j] / chunks;
        const auto c = static_cast<int64_t>(batch[j] % chunks);
        const std::span<char> head(heads.data() + j * head_bytes, head_bytes);
        const std::span<std::byte> payload =
            buffer(i).subspan(static_cast<size_t>(c * chunk_bytes_),
                              std::min(static_cast<size_t>(chunk_bytes_),
                                       static_cast<size_t>(block_bytes_ - c * chunk_bytes_)));
        State s = State::kFailed;  // the connection failed (logged by it)
        const char* problem = nullptr;
        if (sent && conn.ctx != nullptr) {
          switch (conn.read_value(head, payload)) {
            case Connection::Got::kValue:
              problem = check(head, payload, blocks[i], c);
              s = problem == nullptr ? State::kValue : State::kFailed;
              break;
            case Connection::Got::kNil:
              s = State::kMiss;
              break;
            case Connection::Got::kBad:
              problem = "not a chunk of this block's size";
              break;
            case Connection::Got::kFailed:
              break;
          }
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          Block& b = state[i];
          if (s == State::kValue) {
            if (++b.chunks == chunks && b.state == State::kPending) b.state = State::kValue;
          } else if (b.state == State::kPending) {
            b.state = s;
            b.problem = problem;
            end = std::min(end, i + 1);
          }
        }
        cv.notify_all();
      }
    }
  };
  std::vector<std::thread> threads;
  // Stops and joins the readers however this function leaves (on_hit may throw), then waits for
  // the caller's copies.
  struct Joiner {
    std::vector<std::thread>& threads;
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    std::vector<std::shared_ptr<Reuse>>& reuse;
    ~Joiner() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      for (std::thread& t : threads) t.join();
      for (auto& r : reuse)
        if (r != nullptr) (*r)();
    }
  } joiner{threads, mu, cv, stop, reuse};
  for (auto& conn : readers_) threads.emplace_back(read, std::ref(*conn));

  int64_t taken = 0;
  for (size_t i = 0; i < n; ++i) {
    Block b;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return state[i].state != State::kPending; });
      b = state[i];
    }
    bool more = false;
    auto r = std::make_shared<Reuse>();
    if (b.state == State::kValue) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      bytes_read_.fetch_add(block_bytes_, std::memory_order_relaxed);
      more = on_hit(i, buffer(i), &r->wait);
      if (more) ++taken;
    } else if (b.state == State::kMiss) {
      misses_.fetch_add(1, std::memory_order_relaxed);
    } else {
      if (b.problem != nullptr)
        LONGCTX_LOG_WARN("KV store {}: a chunk of {} is malformed ({}); recomputing the block",
                         url_, key(blocks[i].hash, 0), b.problem);
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      reuse[i % kReadAhead] = std::move(r);
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
  get_prefix(std::span(&b, 1), [&](size_t, std::span<const std::byte> bytes, auto*) {
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
