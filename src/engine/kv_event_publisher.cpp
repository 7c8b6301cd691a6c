#include "engine/kv_event_publisher.h"

#include <array>
#include <chrono>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include "engine/zmq_library.h"
#include "longctx/core/error.h"
#include "longctx/core/logging.h"

namespace longctx {

namespace {

constexpr int kLingerMs = 1000;
// How long the publisher thread sleeps when idle before it looks at the replay socket again.
constexpr auto kIdlePoll = std::chrono::milliseconds(10);

void pack_str(msgpack::packer<msgpack::sbuffer>& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

std::array<char, 8> big_endian(int64_t v) {
  std::array<char, 8> b{};
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((u >> (56 - 8 * i)) & 0xff);
  return b;
}

// vLLM binds an endpoint with a wildcard or a local transport and connects to the rest.
bool binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

std::string zmq_error() {
  const ZmqLibrary& z = zmq_library();
  return z.strerror(z.errno_());
}

}  // namespace

KvEventsConfig parse_kv_events_config(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "--kv-events-config: invalid JSON: {}", e.what());
  }
  LONGCTX_CHECK(j.is_object(), ErrorCode::kInvalidArgument,
                "--kv-events-config must be a JSON object, got {}", j.type_name());
  KvEventsConfig c;
  bool publisher_set = false;
  auto want = [](const nlohmann::json& v, bool ok, const std::string& key, const char* what) {
    LONGCTX_CHECK(ok, ErrorCode::kInvalidArgument, "--kv-events-config: \"{}\" must be {}, got {}",
                  key, what, v.dump());
  };
  auto positive = [&](const nlohmann::json& v, const std::string& key) {
    want(v, v.is_number_integer() && v.get<int64_t>() > 0, key, "a positive integer");
    return v.get<int64_t>();
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "enable_kv_cache_events") {
      want(v, v.is_boolean(), key, "true or false");
      c.enable_kv_cache_events = v.get<bool>();
    } else if (key == "publisher") {
      want(v, v.is_string() || v.is_null(), key, "\"zmq\" or \"null\"");
      publisher_set = v.is_string();
      if (!publisher_set) continue;
      const std::string p = v.get<std::string>();
      LONGCTX_CHECK(p == "zmq" || p == "null", ErrorCode::kInvalidArgument,
                    "--kv-events-config: unknown publisher \"{}\" (\"zmq\" or \"null\")", p);
      c.publisher = p == "zmq" ? KvEventsPublisher::kZmq : KvEventsPublisher::kNull;
    } else if (key == "endpoint") {
      want(v, v.is_string() && !v.get<std::string>().empty(), key, "a ZeroMQ address");
      c.endpoint = v.get<std::string>();
    } else if (key == "replay_endpoint") {
      want(v, v.is_string() || v.is_null(), key, "a ZeroMQ address or null");
      c.replay_endpoint = v.is_string() ? v.get<std::string>() : "";
    } else if (key == "buffer_steps") {
      c.buffer_steps = positive(v, key);
    } else if (key == "hwm") {
      want(v, v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX, key,
           "an integer in [0, 2^31)");
      c.hwm = v.get<int64_t>();
    } else if (key == "max_queue_size") {
      c.max_queue_size = positive(v, key);
    } else if (key == "topic") {
      want(v, v.is_string(), key, "a string");
      c.topic = v.get<std::string>();
    } else {
      LONGCTX_THROW(ErrorCode::kInvalidArgument,
                    "--kv-events-config: unknown key \"{}\" (enable_kv_cache_events, publisher, "
                    "endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic)",
                    key);
    }
  }
  if (c.enable_kv_cache_events && !publisher_set) c.publisher = KvEventsPublisher::kZmq;
  return c;
}

std::string encode_kv_event_batch(double ts, std::span<const KvCacheEvent> events,
                                  int64_t block_size, KvMedium medium, int64_t data_parallel_rank) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack_double(ts);
  p.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvCacheEvent& e : events) {
    switch (e.kind) {
      case KvCacheEvent::Kind::kStored:
        p.pack_array(8);
        pack_str(p, "BlockStored");
        p.pack_array(static_cast<uint32_t>(e.block_hashes.size()));
        for (uint64_t h : e.block_hashes) p.pack_uint64(h);
        if (e.parent_block_hash) {
          p.pack_uint64(*e.parent_block_hash);
        } else {
          p.pack_nil();
        }
        p.pack_array(static_cast<uint32_t>(e.token_ids.size()));
        for (int32_t t : e.token_ids) p.pack_int32(t);
        p.pack_int64(block_size);
        p.pack_nil();  // lora_id
        pack_str(p, kv_medium_name(medium));
        p.pack_nil();  // lora_name
        break;
      case KvCacheEvent::Kind::kRemoved:
        p.pack_array(3);
        pack_str(p, "BlockRemoved");
        p.pack_array(static_cast<uint32_t>(e.block_hashes.size()));
        for (uint64_t h : e.block_hashes) p.pack_uint64(h);
        pack_str(p, kv_medium_name(medium));
        break;
      case KvCacheEvent::Kind::kAllCleared:
        p.pack_array(1);
        pack_str(p, "AllBlocksCleared");
        break;
    }
  }
  p.pack_int64(data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

KvEventPublisher::KvEventPublisher(const KvEventsConfig& config, int64_t block_size,
                                   KvMedium medium, int64_t data_parallel_rank)
    : config_(config), block_size_(block_size), medium_(medium), rank_(data_parallel_rank) {
  LONGCTX_CHECK(config_.publisher == KvEventsPublisher::kZmq, ErrorCode::kInvalidArgument,
                "KV events: the zmq publisher was not chosen");
  const ZmqLibrary& z = zmq_library();
  ctx_ = z.ctx_new();
  LONGCTX_CHECK(ctx_ != nullptr, ErrorCode::kIo, "KV events: zmq_ctx_new failed: {}", zmq_error());
  try {
    pub_ = z.socket(ctx_, ZMQ_PUB);
    LONGCTX_CHECK(pub_ != nullptr, ErrorCode::kIo, "KV events: no PUB socket: {}", zmq_error());
    const int hwm = static_cast<int>(config_.hwm), linger = kLingerMs;
    z.setsockopt(pub_, ZMQ_SNDHWM, &hwm, sizeof hwm);
    z.setsockopt(pub_, ZMQ_LINGER, &linger, sizeof linger);
    const bool bind = binds(config_.endpoint);
    const int rc =
        bind ? z.bind(pub_, config_.endpoint.c_str()) : z.connect(pub_, config_.endpoint.c_str());
    LONGCTX_CHECK(rc == 0, ErrorCode::kInvalidArgument,
                  "KV events: cannot {} the PUB socket to {} (--kv-events-config \"endpoint\"): {}",
                  bind ? "bind" : "connect", config_.endpoint, zmq_error());
    if (!config_.replay_endpoint.empty()) {
      replay_ = z.socket(ctx_, ZMQ_ROUTER);
      LONGCTX_CHECK(replay_ != nullptr, ErrorCode::kIo, "KV events: no ROUTER socket: {}",
                    zmq_error());
      const int zero = 0;
      z.setsockopt(replay_, ZMQ_LINGER, &zero, sizeof zero);
      LONGCTX_CHECK(z.bind(replay_, config_.replay_endpoint.c_str()) == 0,
                    ErrorCode::kInvalidArgument,
                    "KV events: cannot bind the replay socket to {} (--kv-events-config "
                    "\"replay_endpoint\"): {}",
                    config_.replay_endpoint, zmq_error());
    }
  } catch (...) {
    close_sockets();
    throw;
  }
  LONGCTX_LOG_INFO("KV events: publishing on {}{}", config_.endpoint,
                   replay_ ? ", replay on " + config_.replay_endpoint : std::string());
  thread_ = std::thread([this] { run(); });
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  close_sockets();
}

void KvEventPublisher::close_sockets() {
  const ZmqLibrary& z = zmq_library();
  if (pub_ != nullptr) z.close(pub_);
  if (replay_ != nullptr) z.close(replay_);
  pub_ = replay_ = nullptr;
  if (ctx_ != nullptr) z.ctx_term(ctx_);  // waits for the PUB socket's linger
  ctx_ = nullptr;
}

void KvEventPublisher::publish(std::vector<KvCacheEvent> events) {
  using namespace std::chrono;
  const double ts = duration<double>(system_clock::now().time_since_epoch()).count();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return static_cast<int64_t>(queue_.size()) < config_.max_queue_size; });
  queue_.push_back({ts, std::move(events)});
  lock.unlock();
  cv_.notify_all();
}

void KvEventPublisher::run() {
  for (;;) {
    std::deque<Batch> todo;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kIdlePoll, [&] { return stop_ || !queue_.empty(); });
      todo.swap(queue_);
      stopping = stop_;
    }
    if (!todo.empty()) cv_.notify_all();  // room for a waiting publish()
    for (const Batch& b : todo) {
      try {
        send_batch(b);
      } catch (const std::exception& e) {
        LONGCTX_LOG_ERROR("KV events: batch {} not sent: {}", next_seq_, e.what());
      }
    }
    try {
      service_replay();
    } catch (const std::exception& e) {
      LONGCTX_LOG_ERROR("KV events: replay failed: {}", e.what());
    }
    if (stopping) return;  // stop_ was seen with the queue swapped out: nothing is left
  }
}

void KvEventPublisher::send_batch(const Batch& batch) {
  const ZmqLibrary& z = zmq_library();
  const uint64_t seq = next_seq_++;
  std::string payload = encode_kv_event_batch(batch.ts, batch.events, block_size_, medium_, rank_);
  const auto seq_bytes = big_endian(static_cast<int64_t>(seq));
  // A PUB socket never blocks: past the high-water mark (or with no subscriber) ZeroMQ drops the
  // message, which a subscriber sees as a gap in the sequence numbers and can replay.
  if (z.send(pub_, config_.topic.data(), config_.topic.size(), ZMQ_SNDMORE) < 0 ||
      z.send(pub_, seq_bytes.data(), seq_bytes.size(), ZMQ_SNDMORE) < 0 ||
      z.send(pub_, payload.data(), payload.size(), 0) < 0) {
    LONGCTX_LOG_WARN("KV events: batch {} not sent: {}", seq, zmq_error());
  }
  sent_.emplace_back(seq, std::move(payload));
  while (static_cast<int64_t>(sent_.size()) > config_.buffer_steps) sent_.pop_front();
}

void KvEventPublisher::service_replay() {
  if (replay_ == nullptr) return;
  const ZmqLibrary& z = zmq_library();
  for (;;) {
    zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
    if (z.poll(&item, 1, 0) <= 0 || (item.revents & ZMQ_POLLIN) == 0) return;
    // One request: its frames (identity, delimiter, start sequence number).
    std::vector<std::string> frames;
    int more = 1;
    while (more) {
      std::string f(256, '\0');
      const int n = z.recv(replay_, f.data(), f.size(), 0);
      if (n < 0) return;
      f.resize(std::min<size_t>(static_cast<size_t>(n), f.size()));
      frames.push_back(std::move(f));
      size_t len = sizeof more;
      z.getsockopt(replay_, ZMQ_RCVMORE, &more, &len);
    }
    if (frames.size() != 3 || frames[2].size() != 8) {
      LONGCTX_LOG_WARN("KV events: ignored a replay request of {} frames", frames.size());
      continue;
    }
    uint64_t start = 0;
    for (char c : frames[2]) start = (start << 8) | static_cast<uint8_t>(c);
    const std::string& id = frames[0];
    auto reply = [&](std::span<const char> seq, const std::string& body) {
      z.send(replay_, id.data(), id.size(), ZMQ_SNDMORE);
      z.send(replay_, "", 0, ZMQ_SNDMORE);
      z.send(replay_, seq.data(), seq.size(), ZMQ_SNDMORE);
      z.send(replay_, body.data(), body.size(), 0);
    };
    for (const auto& [seq, payload] : sent_)
      if (seq >= start) reply(big_endian(static_cast<int64_t>(seq)), payload);
    reply(big_endian(-1), std::string());
  }
}

}  // namespace longctx
