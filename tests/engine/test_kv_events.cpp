// KV-cache events from a real engine run (models/needle on the CPU), read as a vLLM consumer
// reads them: a ZeroMQ SUB socket (cppzmq) on the PUB endpoint, a DEALER on the ROUTER replay
// endpoint, every batch decoded with msgpack into vLLM's layout. The decoded stream must rebuild
// the engine's own set of cached blocks; a prefix shared by concurrent requests is stored once,
// eviction removes, replay returns the batches sent before the subscriber joined, each hash is
// the documented xxhash64 chain of its tokens; bad configurations and endpoints are clear errors.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/redis_server.h"
#include "common/store_documents.h"
#include "engine/engine_test_util.h"
#include "engine/kv_event_publisher.h"
#include "engine/llm_internal.h"
#include "longctx/core/error.h"
#include "longctx/llm.h"

namespace longctx {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kBlock = 16;

std::string needle_dir() { return std::string(LONGCTX_SOURCE_DIR) + "/models/needle"; }

// One decoded event, as vLLM's consumers see it.
struct Decoded {
  std::string tag;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  std::vector<int32_t> tokens;
  int64_t block_size = 0;
  std::string medium;
};

struct DecodedBatch {
  double ts = 0;
  std::vector<Decoded> events;
  int64_t rank = -1;
};

// Decodes a payload, checking vLLM's array layout field by field.
DecodedBatch decode(const std::string& payload) {
  msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& o = oh.get();
  DecodedBatch b;
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) {
    ADD_FAILURE() << "a batch is [ts, events, data_parallel_rank]";
    return b;
  }
  const msgpack::object* f = o.via.array.ptr;
  EXPECT_EQ(f[0].type, msgpack::type::FLOAT64);
  b.ts = f[0].as<double>();
  b.rank = f[2].as<int64_t>();
  for (uint32_t i = 0; i < f[1].via.array.size; ++i) {
    const msgpack::object& e = f[1].via.array.ptr[i];
    Decoded d;
    EXPECT_EQ(e.type, msgpack::type::ARRAY);
    const msgpack::object* x = e.via.array.ptr;
    d.tag = x[0].as<std::string>();
    if (d.tag == "BlockStored") {
      EXPECT_EQ(e.via.array.size, 8u);  // tag + vLLM's 7 fields
      d.hashes = x[1].as<std::vector<uint64_t>>();
      if (!x[2].is_nil()) d.parent = x[2].as<uint64_t>();
      d.tokens = x[3].as<std::vector<int32_t>>();
      d.block_size = x[4].as<int64_t>();
      EXPECT_TRUE(x[5].is_nil());  // lora_id
      d.medium = x[6].as<std::string>();
      EXPECT_TRUE(x[7].is_nil());  // lora_name
    } else if (d.tag == "BlockRemoved") {
      EXPECT_EQ(e.via.array.size, 3u);
      d.hashes = x[1].as<std::vector<uint64_t>>();
      d.medium = x[2].as<std::string>();
    } else {
      EXPECT_EQ(d.tag, "AllBlocksCleared");
      EXPECT_EQ(e.via.array.size, 1u);
    }
    b.events.push_back(std::move(d));
  }
  return b;
}

uint64_t be64(const zmq::message_t& m) {
  EXPECT_EQ(m.size(), 8u);
  uint64_t v = 0;
  for (size_t i = 0; i < m.size(); ++i) v = (v << 8) | static_cast<const uint8_t*>(m.data())[i];
  return v;
}

// Every batch the replay socket holds from `start` on (seq -> payload), up to its end marker.
std::map<uint64_t, std::string> replay(zmq::context_t& ctx, const std::string& endpoint,
                                       uint64_t start) {
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.connect(endpoint);
  std::array<uint8_t, 8> req{};
  for (int i = 0; i < 8; ++i) req[i] = static_cast<uint8_t>(start >> (56 - 8 * i));
  dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(req), zmq::send_flags::none);
  std::map<uint64_t, std::string> out;
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(dealer, std::back_inserter(frames))) {
      ADD_FAILURE() << "no replay answer";
      return out;
    }
    if (frames.size() != 3) {
      ADD_FAILURE() << "a replay message has 3 frames after the router's: got " << frames.size();
      return out;
    }
    EXPECT_EQ(frames[0].size(), 0u);  // the delimiter
    const uint64_t seq = be64(frames[1]);
    if (seq == ~uint64_t{0}) {
      EXPECT_EQ(frames[2].size(), 0u);
      return out;
    }
    out[seq] = frames[2].to_string();
  }
}

struct Mirror {
  std::set<uint64_t> cached;
  std::map<uint64_t, int> times_stored;
  int64_t removed = 0;
  void apply(const DecodedBatch& b) {
    for (const Decoded& d : b.events) {
      if (d.tag == "AllBlocksCleared") cached.clear();
      for (uint64_t h : d.hashes) {
        if (d.tag == "BlockStored") {
          EXPECT_TRUE(cached.insert(h).second) << "stored while cached: " << h;
          ++times_stored[h];
        } else {
          EXPECT_EQ(cached.erase(h), 1u) << "removed while not cached: " << h;
          ++removed;
        }
      }
    }
  }
};

class KvEvents : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("longctx_kv_events_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string ipc(const char* name) const { return "ipc://" + (dir_ / name).string(); }
  EngineConfig config(KvEventsConfig ev) const {
    EngineConfig c;
    c.model = needle_dir();
    c.device = "cpu";
    c.block_size = kBlock;
    c.max_model_len = 512;
    // 8 layers x 2 KV heads x 64 x (K, V) x fp32 = 8 KiB a token: 40 blocks, 640 tokens.
    c.cpu_kv_cache_bytes = 40 * kBlock * 8192;
    c.kv_events = std::move(ev);
    return c;
  }
  fs::path dir_;
};

TEST(KvEventsConfig, ParsesVllmKeys) {
  KvEventsConfig c = parse_kv_events_config(
      R"({"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:6000",
          "replay_endpoint": "tcp://*:6001", "buffer_steps": 7, "hwm": 9, "max_queue_size": 5,
          "topic": "kv"})");
  EXPECT_TRUE(c.enabled());
  EXPECT_EQ(c.endpoint, "tcp://*:6000");
  EXPECT_EQ(c.replay_endpoint, "tcp://*:6001");
  EXPECT_EQ(c.buffer_steps, 7);
  EXPECT_EQ(c.hwm, 9);
  EXPECT_EQ(c.max_queue_size, 5);
  EXPECT_EQ(c.topic, "kv");
  // Defaults as vLLM's; enabled without a publisher means zmq; "null" publishes nothing.
  c = parse_kv_events_config(R"({"enable_kv_cache_events": true})");
  EXPECT_EQ(c.publisher, KvEventsPublisher::kZmq);
  EXPECT_EQ(c.endpoint, "tcp://*:5557");
  EXPECT_EQ(c.buffer_steps, 10000);
  EXPECT_TRUE(c.replay_endpoint.empty());
  EXPECT_FALSE(
      parse_kv_events_config(R"({"enable_kv_cache_events": true, "publisher": "null"})").enabled());
  EXPECT_FALSE(parse_kv_events_config(R"({"publisher": "zmq"})").enabled());
  auto fails = [](const char* json, const char* needle) {
    try {
      parse_kv_events_config(json);
      ADD_FAILURE() << "accepted " << json;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails("{", "invalid JSON");
  fails("[]", "JSON object");
  fails(R"({"enable_kv_cache_event": true})", "unknown key \"enable_kv_cache_event\"");
  fails(R"({"publisher": "kafka"})", "unknown publisher \"kafka\"");
  fails(R"({"buffer_steps": 0})", "\"buffer_steps\" must be a positive integer");
  fails(R"({"enable_kv_cache_events": "yes"})", "\"enable_kv_cache_events\" must be true");
  fails(R"({"endpoint": 5557})", "\"endpoint\" must be a ZeroMQ address");
}

TEST(KvEventsEncoding, VllmArrayLayout) {
  std::vector<KvCacheEvent> ev(3);
  ev[0] = {KvCacheEvent::Kind::kStored, {11, 12}, std::nullopt, {1, 2, 3, 4}};
  ev[1] = {KvCacheEvent::Kind::kRemoved, {0xfedcba9876543210ULL}, std::nullopt, {}};
  ev[2] = {KvCacheEvent::Kind::kAllCleared, {}, std::nullopt, {}};
  const std::string bytes = encode_kv_event_batch(1.5, ev, 2, KvMedium::kGpu, 0);
  DecodedBatch b = decode(bytes);
  EXPECT_EQ(b.ts, 1.5);
  EXPECT_EQ(b.rank, 0);
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(b.events[0].tag, "BlockStored");
  EXPECT_EQ(b.events[0].hashes, (std::vector<uint64_t>{11, 12}));
  EXPECT_FALSE(b.events[0].parent.has_value());
  EXPECT_EQ(b.events[0].tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(b.events[0].block_size, 2);
  EXPECT_EQ(b.events[0].medium, "GPU");
  EXPECT_EQ(b.events[1].tag, "BlockRemoved");
  EXPECT_EQ(b.events[1].hashes[0], 0xfedcba9876543210ULL);  // a full 64-bit unsigned hash
  EXPECT_EQ(b.events[2].tag, "AllBlocksCleared");
  // The exact bytes msgspec writes for [1.5, [["AllBlocksCleared"]], 0].
  const std::string cleared =
      encode_kv_event_batch(1.5, std::span(ev).subspan(2), 2, KvMedium::kGpu, 0);
  const std::string expect = std::string("\x93\xcb\x3f\xf8\0\0\0\0\0\0\x91\x91\xb0", 13) +
                             "AllBlocksCleared" + std::string("\x00", 1);
  EXPECT_EQ(cleared, expect);
  // The host tier, under KV offload: vLLM's CPU offloading tier's name, on both kinds of event.
  DecodedBatch host =
      decode(encode_kv_event_batch(1.5, std::span(ev).first(2), 2, KvMedium::kCpu, 0));
  ASSERT_EQ(host.events.size(), 2u);
  EXPECT_EQ(host.events[0].medium, "CPU");
  EXPECT_EQ(host.events[1].medium, "CPU");
}

TEST_F(KvEvents, EngineRunRebuildsTheCacheAndReplays) {
  KvEventsConfig ev;
  ev.enable_kv_cache_events = true;
  ev.publisher = KvEventsPublisher::kZmq;
  ev.endpoint = ipc("pub");
  ev.replay_endpoint = ipc("replay");
  ev.topic = "kv@needle";
  LLM llm(config(ev));
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 3;

  // Phase 1, before anyone subscribes: two requests sharing a 96-token document in one batch.
  const std::vector<int32_t> doc = testing::store_document(1, 96);
  auto with_tail = [&](std::vector<int32_t> t, int32_t q) {
    for (int i = 0; i < 20; ++i) t.push_back(500 + q * 30 + i);
    return t;
  };
  llm.generate({Prompt(with_tail(doc, 1)), Prompt(with_tail(doc, 2))}, sp, false);

  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv@needle");
  sub.set(zmq::sockopt::rcvtimeo, 500);
  sub.connect(ev.endpoint);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription propagates

  // Phase 2: the document again (hits), then distinct long prompts that evict it.
  llm.generate({Prompt(with_tail(doc, 3))}, sp, false);
  for (int32_t s = 2; s < 6; ++s)
    llm.generate({Prompt(testing::store_document(s * 7, 300))}, sp, false);

  std::map<uint64_t, std::string> live;
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(sub, std::back_inserter(frames))) break;  // quiet for 500 ms
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_EQ(frames[0].to_string(), "kv@needle");
    live[be64(frames[1])] = frames[2].to_string();
  }
  ASSERT_FALSE(live.empty()) << "the subscriber received nothing";
  ASSERT_GT(live.begin()->first, 0u) << "phase 1's batches were sent before the subscription";

  const std::vector<uint64_t> engine = engine_core(llm).cached_block_hashes();
  std::map<uint64_t, std::string> all = replay(ctx, ev.replay_endpoint, 0);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.begin()->first, 0u);
  EXPECT_EQ(all.rbegin()->first + 1, all.size()) << "sequence numbers are 0, 1, 2, ...";
  for (const auto& [seq, payload] : live) {
    ASSERT_TRUE(all.count(seq)) << seq;
    EXPECT_EQ(all[seq], payload) << "replayed batch " << seq << " differs from the live one";
  }
  // A replay from the middle returns just the rest.
  const uint64_t mid = all.size() / 2;
  EXPECT_EQ(replay(ctx, ev.replay_endpoint, mid).size(), all.size() - mid);

  Mirror m;
  std::map<uint64_t, std::pair<std::optional<uint64_t>, std::vector<int32_t>>> stored;
  double last_ts = 0;
  for (const auto& [seq, payload] : all) {
    DecodedBatch b = decode(payload);
    EXPECT_EQ(b.rank, 0);
    EXPECT_GE(b.ts, last_ts);
    last_ts = b.ts;
    EXPECT_FALSE(b.events.empty());
    m.apply(b);
    for (const Decoded& d : b.events) {
      if (d.tag != "BlockStored") continue;
      EXPECT_EQ(d.block_size, kBlock);
      EXPECT_EQ(d.medium, "GPU");
      ASSERT_EQ(d.tokens.size(), d.hashes.size() * kBlock);
      // The documented hash chain: xxhash64 of the block's int32 token ids, seeded by the parent.
      uint64_t parent = d.parent.value_or(0);
      for (size_t i = 0; i < d.hashes.size(); ++i) {
        const int32_t* t = d.tokens.data() + i * kBlock;
        EXPECT_EQ(XXH64(t, kBlock * sizeof(int32_t), parent), d.hashes[i]);
        parent = d.hashes[i];
      }
    }
  }
  EXPECT_EQ(std::vector<uint64_t>(m.cached.begin(), m.cached.end()), engine)
      << "the events' cache differs from the engine's";
  // The document's 6 blocks were stored once in phase 1 (the concurrent requests shared them),
  // and evicted by phase 2's prompts.
  uint64_t h = 0;
  for (int64_t i = 0; i < 6; ++i) {
    h = XXH64(doc.data() + i * kBlock, kBlock * sizeof(int32_t), h);
    EXPECT_EQ(m.times_stored[h], 1) << "document block " << i;
    EXPECT_EQ(m.cached.count(h), 0u) << "document block " << i << " should be evicted";
  }
  EXPECT_GT(m.removed, 0);
  engine_core(llm).check_consistency();
}

// KV offload (the CPU simulation of the host pool, the GPU cache and the ring): the block
// manager's blocks are the host pool's, so every event names the host tier ("CPU") and none the
// device ("GPU"): the GPU cache stages blocks per step and is no prefix cache of its own. The
// stream, with blocks through the ring, evicted from the host pool and shared by a prefix, still
// rebuilds the engine's cached set.
TEST_F(KvEvents, OffloadedEnginePublishesTheHostTier) {
  CpuExecutorOptions x;
  x.block_size = 4;
  x.num_blocks = 48;          // the host pool: later prompts evict earlier ones
  x.offload_gpu_blocks = 12;  // the GPU cache: most of a prompt goes through the ring
  x.offload_slots = 2;
  x.offload_slot_blocks = 3;
  EngineCoreOptions o = testing::core_options(24, 2);
  o.kv_medium = KvMedium::kCpu;
  o.kv_events = {.enable_kv_cache_events = true,
                 .publisher = KvEventsPublisher::kZmq,
                 .endpoint = ipc("pub"),
                 .topic = "kv"};
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv");
  sub.set(zmq::sockopt::rcvtimeo, 500);
  EngineCore core(make_cpu_executor(testing::tiny_model(), x), nullptr, o);
  sub.connect(o.kv_events.endpoint);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription propagates

  auto doc = [](int32_t salt, int64_t n) {  // ids below the tiny model's 1024
    std::vector<int32_t> t = testing::store_document(salt, n);
    for (int32_t& v : t) v %= 1000;
    return t;
  };
  const std::vector<int32_t> shared = doc(3, 40);
  size_t index = 0;
  auto run = [&](std::vector<std::vector<int32_t>> prompts) {
    for (auto& p : prompts) core.add_request(index++, std::move(p), testing::greedy(5), 0);
    while (core.has_unfinished()) core.step();
    core.take_finished();
  };
  auto tail = [&](std::vector<int32_t> t, int32_t salt) {
    for (int i = 0; i < 9; ++i) t.push_back(700 + salt * 10 + i);
    return t;
  };
  run({tail(shared, 1), tail(shared, 2)});                 // one prefix, stored once
  run({tail(shared, 3)});                                  // a prefix hit of host blocks
  for (int32_t s = 0; s < 3; ++s) run({doc(20 + s, 90)});  // evict from the host pool
  EXPECT_GT(core.stats().executor.offload_host_bytes_loaded, 0) << "nothing went through the ring";

  Mirror m;
  std::set<std::string> media;
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(sub, std::back_inserter(frames))) break;  // quiet for 500 ms
    ASSERT_EQ(frames.size(), 3u);
    DecodedBatch b = decode(frames[2].to_string());
    m.apply(b);
    for (const Decoded& d : b.events) media.insert(d.medium);
  }
  EXPECT_EQ(media, (std::set<std::string>{"CPU"}));
  EXPECT_GT(m.removed, 0) << "the host pool evicted nothing";
  uint64_t h = XXH64(shared.data(), 4 * sizeof(int32_t), 0);
  EXPECT_EQ(m.times_stored[h], 1) << "the shared prefix's first block";
  EXPECT_EQ(std::vector<uint64_t>(m.cached.begin(), m.cached.end()), core.cached_block_hashes());
  core.check_consistency();
}

// A KV store under offload: the blocks a hit imports go into the host pool, and their
// BlockStored events (published when the load ends) name the host tier too.
TEST_F(KvEvents, OffloadedStoreHitsPublishTheHostTier) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  auto make = [&](bool events) {
    CpuExecutorOptions x;
    x.block_size = 4;
    x.num_blocks = 64;
    x.offload_gpu_blocks = 12;
    x.offload_slots = 2;
    x.offload_slot_blocks = 3;
    EngineCoreOptions o = testing::core_options(24, 2);
    o.kv_medium = KvMedium::kCpu;
    o.kv_store = redis.url();
    o.kv_store_namespace = "tiny";
    if (events)
      o.kv_events = {.enable_kv_cache_events = true,
                     .publisher = KvEventsPublisher::kZmq,
                     .endpoint = ipc("pub"),
                     .topic = "kv"};
    return std::make_unique<EngineCore>(make_cpu_executor(testing::tiny_model(), x), nullptr, o);
  };
  std::vector<int32_t> doc = testing::store_document(4, 81);
  for (int32_t& v : doc) v %= 1000;
  {
    auto a = make(false);
    a->add_request(0, doc, testing::greedy(2), 0);
    while (a->has_unfinished()) a->step();
    a->flush_kv_store();
  }
  auto b = make(true);
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv");
  sub.set(zmq::sockopt::rcvtimeo, 500);
  sub.connect(ipc("pub"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription propagates
  b->add_request(0, doc, testing::greedy(2), 0);
  while (b->has_unfinished()) b->step();
  b->take_finished();
  EXPECT_EQ(b->stats().kv_store_hits, 20);  // every full block before the last token
  Mirror m;
  std::set<std::string> media;
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(sub, std::back_inserter(frames))) break;  // quiet for 500 ms
    ASSERT_EQ(frames.size(), 3u);
    DecodedBatch batch = decode(frames[2].to_string());
    m.apply(batch);
    for (const Decoded& d : batch.events) media.insert(d.medium);
  }
  EXPECT_EQ(media, (std::set<std::string>{"CPU"}));
  EXPECT_EQ(m.times_stored[XXH64(doc.data(), 4 * sizeof(int32_t), 0)], 1) << "the first block";
  EXPECT_EQ(std::vector<uint64_t>(m.cached.begin(), m.cached.end()), b->cached_block_hashes());
  b->check_consistency();
}

TEST_F(KvEvents, EndpointErrorsAreClear) {
  zmq::context_t ctx;
  zmq::socket_t taken(ctx, zmq::socket_type::pub);
  taken.bind("tcp://127.0.0.1:0");
  const std::string last = taken.get(zmq::sockopt::last_endpoint);
  const std::string port = last.substr(last.rfind(':') + 1);
  auto fails = [&](KvEventsConfig ev, const char* needle) {
    ev.enable_kv_cache_events = true;
    ev.publisher = KvEventsPublisher::kZmq;
    try {
      LLM llm(config(ev));
      ADD_FAILURE() << "started with endpoint " << ev.endpoint;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  KvEventsConfig ev;
  ev.endpoint = "tcp://*:" + port;  // in use
  fails(ev, ("cannot bind the PUB socket to tcp://*:" + port).c_str());
  ev.endpoint = "tcp://127.0.0.1";  // no port
  fails(ev, "cannot connect the PUB socket to tcp://127.0.0.1");
  ev.endpoint = ipc("pub");
  ev.replay_endpoint = "tcp://*:" + port;
  fails(ev, ("cannot bind the replay socket to tcp://*:" + port).c_str());
  // Events need prefix caching.
  EngineConfig c = config({.enable_kv_cache_events = true,
                           .publisher = KvEventsPublisher::kZmq,
                           .endpoint = ipc("pub2")});
  c.enable_prefix_caching = false;
  EXPECT_THROW(LLM{c}, Error);
}

}  // namespace
}  // namespace longctx
