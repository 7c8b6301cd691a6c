// Publishes the block manager's KV-cache events as vLLM's ZmqEventPublisher does, so consumers
// written for vLLM (NVIDIA Dynamo's KV router, llm-d's KV-cache indexer, SGLang's router) read
// them unchanged:
//
// - every step's events form one batch, msgpack-encoded as msgspec encodes vLLM's KVEventBatch
//   (array_like structs, tagged events): [ts, [event, ...], data_parallel_rank] with
//     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//      lora_name]
//     ["BlockRemoved", block_hashes, medium]
//     ["AllBlocksCleared"]
//   ts the wall clock in seconds (float64), hashes unsigned 64-bit integers, lora_id and
//   lora_name nil (no adapters), medium where the blocks live (kv_cache_event.h: "GPU", or
//   "CPU" under KV offload);
// - the PUB socket sends it as three frames: topic, the batch's sequence number (8 bytes, big
//   endian, from 0), the payload;
// - the ROUTER replay socket answers a request [identity, "", start_seq (8 bytes big endian)]
//   with [identity, "", seq, payload] for every buffered batch from start_seq on, then
//   [identity, "", -1 (8 bytes), ""].
//
// The engine thread only queues a batch (publish()); encoding, sending and replays run on a
// thread of the publisher's own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kv/kv_cache_event.h"
#include "longctx/engine/kv_events_config.h"

namespace longctx {

// The msgpack bytes of one batch, as above.
std::string encode_kv_event_batch(double ts, std::span<const KvCacheEvent> events,
                                  int64_t block_size, KvMedium medium, int64_t data_parallel_rank);

class KvEventPublisher {
 public:
  // Opens the sockets; throws Error naming the endpoint when one cannot be bound or connected
  // (a port in use, a malformed address), Error(kNotFound) without libzmq.
  KvEventPublisher(const KvEventsConfig& config, int64_t block_size,
                   KvMedium medium = KvMedium::kGpu, int64_t data_parallel_rank = 0);
  // Sends what is queued (the PUB socket lingers up to a second), then closes.
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues one batch, stamped now; waits only while max_queue_size batches are queued (as
  // vLLM's publisher).
  void publish(std::vector<KvCacheEvent> events);

 private:
  struct Batch {
    double ts = 0;
    std::vector<KvCacheEvent> events;
  };
  void run();
  void send_batch(const Batch& batch);
  void service_replay();
  void close_sockets();

  KvEventsConfig config_;
  int64_t block_size_;
  KvMedium medium_;
  int64_t rank_;
  void* ctx_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  uint64_t next_seq_ = 0;                              // publisher thread only
  std::deque<std::pair<uint64_t, std::string>> sent_;  // [buffer_steps] for replay
  std::mutex mu_;
  std::condition_variable cv_;  // a batch queued, room freed, or stopping
  std::deque<Batch> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace longctx
