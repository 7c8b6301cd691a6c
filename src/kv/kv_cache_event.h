// One transition of the prefix cache, as vLLM's KV-cache events name them (BlockStored,
// BlockRemoved, AllBlocksCleared): what a KV-aware router (llm-d, NVIDIA Dynamo, SGLang's
// router) needs to mirror which prefixes a replica holds. The block manager records them; the
// engine publishes them (engine/kv_event_publisher.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace longctx {

// Where the prefix cache's blocks live, published as vLLM's `medium` ("GPU" / "CPU", the names
// vLLM's GPU prefix cache and its CPU offloading tier use): the engine's block manager hands out
// ids of one pool, device memory (kGpu; the CPU backend's pool counts as the engine's primary
// pool, as vLLM's CPU backend reports it) or, under KV offload, the host pool (kCpu), where every
// block lives and which the GPU cache only stages (docs/offload.md).
enum class KvMedium { kGpu, kCpu };

inline const char* kv_medium_name(KvMedium m) { return m == KvMedium::kCpu ? "CPU" : "GPU"; }

struct KvCacheEvent {
  enum class Kind { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  // kStored: consecutive blocks of one chain, block_hashes[i + 1]'s parent is block_hashes[i];
  // kRemoved: blocks that left the cache (evicted), in no particular chain order.
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;  // kStored: the first block's parent (none: first)
  std::vector<int32_t> token_ids;             // kStored: the blocks' tokens, block after block
  // Not published: kStored's block ids, and whether the blocks came from a KV store (imported)
  // rather than being computed here.
  std::vector<int32_t> block_ids;
  bool imported = false;
};

}  // namespace longctx
