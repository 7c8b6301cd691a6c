// KV-cache events (docs/fleet.md): the engine publishes every change of its prefix cache as vLLM
// does (ZeroMQ PUB, msgpack batches of BlockStored / BlockRemoved / AllBlocksCleared, an optional
// ROUTER socket replaying missed batches), so a KV-aware router can send a request to the
// replica that holds its prefix. Configured with vLLM's --kv-events-config JSON.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace longctx {

enum class KvEventsPublisher { kNull, kZmq };

// vLLM's KVEventsConfig: the same keys, defaults and meaning.
struct KvEventsConfig {
  bool enable_kv_cache_events = false;
  // "null" publishes nothing; unset in the JSON with events enabled means "zmq" (as vLLM).
  KvEventsPublisher publisher = KvEventsPublisher::kNull;
  // The PUB socket: bound when it has a wildcard ("*", "::") or is ipc:// or inproc://,
  // connected otherwise (vLLM's rule).
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;      // the ROUTER socket serving missed batches (bound); empty: none
  int64_t buffer_steps = 10000;     // batches kept for replay
  int64_t hwm = 100000;             // the PUB socket's send high-water mark (messages)
  int64_t max_queue_size = 100000;  // batches waiting for the publisher thread
  std::string topic;                // the first frame of every message

  bool enabled() const { return enable_kv_cache_events && publisher != KvEventsPublisher::kNull; }
};

// Parses --kv-events-config's JSON object. Throws Error(kInvalidArgument) naming the problem:
// malformed JSON, an unknown key, a value of the wrong type or out of range, an unknown publisher.
KvEventsConfig parse_kv_events_config(std::string_view json);

}  // namespace longctx
