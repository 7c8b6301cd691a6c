// A copy of one KV block into another, the block manager's copy-on-write request that the
// executor runs before a step writes anything.
#pragma once

#include <cstdint>

namespace longctx {

struct KVBlockCopy {
  int32_t src = -1;  // every layer's K and V of block src are copied into block dst
  int32_t dst = -1;
};

}  // namespace longctx
