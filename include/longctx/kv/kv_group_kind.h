// The kinds of per-layer attention state a KV group keeps (attention/kv_groups.h describes a
// model's groups; the BlockManager allocates for each by its kind). Here, in kv, because the
// allocator below the attention layer must know how much of a sequence each kind keeps.
#pragma once

#include <cstdint>

namespace longctx {

enum class KvGroupKind {
  kFull,           // paged K/V of every token (tiers: GPU, host); prefix-cacheable
  kSlidingWindow,  // paged K/V of the last `window` tokens; blocks wholly before it are freed
  kState,          // a fixed-size state per sequence (linear attention / SSM: recurrent + conv)
};

// What the BlockManager needs to know of a group.
struct KvGroupAlloc {
  KvGroupKind kind = KvGroupKind::kFull;
  int64_t window = 0;  // kSlidingWindow: keys a query sees, itself included (> 0)
};

// Where a group's block ids come from (BlockManager): the main pool, or, with KV offload, the
// GPU-resident window pool of the sliding groups.
enum class BlockPool { kMain, kWindow };

const char* kv_group_kind_name(KvGroupKind kind);

}  // namespace longctx
