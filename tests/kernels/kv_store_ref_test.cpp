// The CPU KV store reference: every stored row lands at [page, offset, head, :] of the pool (the
// address computed here from the layout, independently of the reference), padding slots and
// untouched slots keep their old bytes, strided sources (a fused qkv row) are read right, a slot
// past the pool throws kOutOfRange before anything is written, and malformed params throw
// errors that name the field.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kv_store_cpu.h"
#include "kernels/kv_store_params.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

using kernels::KvStoreParams;

// A pool of num_pages pages filled with a marker pattern and a fused qkv source of num_tokens
// rows [q heads | k heads | v heads] with distinct element values.
struct StoreCase {
  int num_tokens, hq, hk, d, page_size, num_pages;
  DType dtype;
  size_t esize;
  std::vector<uint8_t> qkv;               // [num_tokens, hq + 2 * hk, d] elements
  std::vector<uint8_t> k_cache, v_cache;  // [num_pages, page_size, hk, d]
  std::vector<int64_t> slots;

  StoreCase(int t, int q_heads, int kv_heads, int dim, int page, int pages, DType dt)
      : num_tokens(t),
        hq(q_heads),
        hk(kv_heads),
        d(dim),
        page_size(page),
        num_pages(pages),
        dtype(dt),
        esize(dtype_size(dt)) {
    qkv.resize(size_t(t) * (hq + 2 * hk) * d * esize);
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = uint8_t(i * 7 + 3);
    k_cache.assign(size_t(pages) * page * hk * d * esize, 0xA5);
    v_cache.assign(k_cache.size(), 0x5A);
  }

  int64_t token_stride() const { return int64_t(hq + 2 * hk) * d; }

  KvStoreParams params() {
    KvStoreParams p;
    p.k = qkv.data() + size_t(hq) * d * esize;
    p.v = qkv.data() + size_t(hq + hk) * d * esize;
    p.k_token_stride = token_stride();
    p.v_token_stride = token_stride();
    p.k_cache = k_cache.data();
    p.v_cache = v_cache.data();
    p.slot_mapping = slots.data();
    p.num_tokens = num_tokens;
    p.num_kv_heads = hk;
    p.head_dim = d;
    p.page_size = page_size;
    p.num_pages = num_pages;
    p.dtype = dtype;
    return p;
  }

  // Byte offset of element (page, offset, head, 0) of a cache.
  size_t cache_at(int64_t page, int64_t offset, int head) const {
    return size_t(((page * page_size + offset) * hk + head) * d) * esize;
  }
  // Byte offset of head `head` of K (which = 1) or V (which = 2) of token t in qkv.
  size_t src_at(int t, int which, int head) const {
    return size_t(t * token_stride() + (hq + (which - 1) * hk + head) * int64_t(d)) * esize;
  }
};

// Checks every slot of both caches: stored tokens hold their source rows, all others the marker.
void expect_pool(const StoreCase& c) {
  std::vector<int> owner(size_t(c.num_pages) * c.page_size, -1);
  for (int t = 0; t < c.num_tokens; ++t)
    if (c.slots[t] >= 0) owner[c.slots[t]] = t;
  const size_t row = size_t(c.d) * c.esize;
  for (int64_t page = 0; page < c.num_pages; ++page) {
    for (int64_t off = 0; off < c.page_size; ++off) {
      const int t = owner[page * c.page_size + off];
      for (int h = 0; h < c.hk; ++h) {
        const uint8_t* k = c.k_cache.data() + c.cache_at(page, off, h);
        const uint8_t* v = c.v_cache.data() + c.cache_at(page, off, h);
        if (t < 0) {
          for (size_t e = 0; e < row; ++e) {
            ASSERT_EQ(k[e], 0xA5) << "page " << page << " offset " << off << " head " << h;
            ASSERT_EQ(v[e], 0x5A) << "page " << page << " offset " << off << " head " << h;
          }
        } else {
          ASSERT_EQ(std::memcmp(k, c.qkv.data() + c.src_at(t, 1, h), row), 0)
              << "K of token " << t << " head " << h;
          ASSERT_EQ(std::memcmp(v, c.qkv.data() + c.src_at(t, 2, h), row), 0)
              << "V of token " << t << " head " << h;
        }
      }
    }
  }
}

// Distinct random slots for every token, some of them padding (-1).
std::vector<int64_t> random_slots(int num_tokens, int64_t capacity, double pad, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> all(capacity);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::bernoulli_distribution is_pad(pad);
  std::vector<int64_t> slots(num_tokens);
  for (int t = 0; t < num_tokens; ++t) slots[t] = is_pad(rng) ? -1 : all[t];
  return slots;
}

TEST(KvStoreRef, StridedSourcesLandInTheirSlots) {
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int page : {1, 16, 7}) {
      StoreCase c(37, 4, 2, 24, page, 64 / page + 9, dt);
      c.slots = random_slots(c.num_tokens, int64_t(c.num_pages) * page, 0.2, 11 + page);
      kernels::cpu::kv_store(c.params());
      expect_pool(c);
    }
  }
}

TEST(KvStoreRef, HandBuiltSlotsAndPadding) {
  // 4 tokens, page size 4, 3 pages: token 0 -> page 2 offset 1 (slot 9), token 1 padding,
  // token 2 -> page 0 offset 3 (slot 3), token 3 padding with another negative value.
  StoreCase c(4, 1, 1, 3, 4, 3, DType::kF32);
  c.slots = {2 * 4 + 1, -1, 3, -7};
  kernels::cpu::kv_store(c.params());
  expect_pool(c);
  // Token 0's K (after its one q head of 3 floats) is the 3 floats at element (9 * 1 + 0) * 3.
  EXPECT_EQ(std::memcmp(c.k_cache.data() + 9 * 3 * 4, c.qkv.data() + 3 * 4, 3 * 4), 0);
  // Token 0's V follows its K in qkv.
  EXPECT_EQ(std::memcmp(c.v_cache.data() + 9 * 3 * 4, c.qkv.data() + 6 * 4, 3 * 4), 0);
}

TEST(KvStoreRef, DenseSourceAndSeparateStrides) {
  // K contiguous ([T, hk, d]), V inside a wider buffer: the strides are independent.
  const int T = 5, hk = 3, d = 8;
  std::vector<uint16_t> k(T * hk * d), v(T * (hk * d + 5));
  for (size_t i = 0; i < k.size(); ++i) k[i] = uint16_t(1000 + i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = uint16_t(5000 + i);
  std::vector<uint16_t> kc(4 * 2 * hk * d, 0), vc(kc.size(), 0);
  std::vector<int64_t> slots = {7, 0, 3, -1, 4};
  KvStoreParams p;
  p.k = k.data();
  p.v = v.data();
  p.k_token_stride = hk * d;
  p.v_token_stride = hk * d + 5;
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.slot_mapping = slots.data();
  p.num_tokens = T;
  p.num_kv_heads = hk;
  p.head_dim = d;
  p.page_size = 2;
  p.num_pages = 4;
  p.dtype = DType::kBF16;
  kernels::cpu::kv_store(p);
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    for (int e = 0; e < hk * d; ++e) {
      EXPECT_EQ(kc[slots[t] * hk * d + e], k[t * hk * d + e]) << t << " " << e;
      EXPECT_EQ(vc[slots[t] * hk * d + e], v[t * (hk * d + 5) + e]) << t << " " << e;
    }
  }
  // Slots 1, 2, 5, 6 were not written.
  for (int s : {1, 2, 5, 6})
    for (int e = 0; e < hk * d; ++e) EXPECT_EQ(kc[s * hk * d + e], 0) << s;
}

TEST(KvStoreRef, SlotPastThePoolThrowsAndWritesNothing) {
  StoreCase c(6, 2, 1, 16, 16, 2, DType::kBF16);
  c.slots = {0, 1, 2, 32, 4, 5};  // capacity 32: slot 32 is one past the end
  try {
    kernels::cpu::kv_store(c.params());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("slot_mapping[3] = 32"), std::string::npos) << e.what();
  }
  for (uint8_t b : c.k_cache) ASSERT_EQ(b, 0xA5);  // checked before any copy
  for (uint8_t b : c.v_cache) ASSERT_EQ(b, 0x5A);
  c.slots[3] = 31;  // the last slot is fine
  kernels::cpu::kv_store(c.params());
  expect_pool(c);
}

TEST(KvStoreRef, ZeroTokensIsANoOp) {
  StoreCase c(0, 1, 1, 8, 4, 2, DType::kF16);
  KvStoreParams p = c.params();
  p.k = p.v = nullptr;
  p.slot_mapping = nullptr;
  kernels::cpu::kv_store(p);
  for (uint8_t b : c.k_cache) ASSERT_EQ(b, 0xA5);
}

void expect_error(const KvStoreParams& p, ErrorCode code, const std::string& needle) {
  try {
    kernels::cpu::kv_store(p);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(KvStoreRef, MalformedParamsNameTheField) {
  StoreCase c(3, 1, 2, 8, 4, 2, DType::kBF16);
  c.slots = {0, 1, 2};
  KvStoreParams p = c.params();
  KvStoreParams q = p;
  q.head_dim = 0;
  expect_error(q, ErrorCode::kInvalidArgument, "head_dim");
  q = p;
  q.num_kv_heads = -1;
  expect_error(q, ErrorCode::kInvalidArgument, "num_kv_heads");
  q = p;
  q.page_size = 0;
  expect_error(q, ErrorCode::kInvalidArgument, "page_size");
  q = p;
  q.num_tokens = -2;
  expect_error(q, ErrorCode::kInvalidArgument, "num_tokens");
  q = p;
  q.k_token_stride = 15;  // < 2 heads x 8
  expect_error(q, ErrorCode::kInvalidArgument, "token strides");
  q = p;
  q.slot_mapping = nullptr;
  expect_error(q, ErrorCode::kInvalidArgument, "slot_mapping");
  q = p;
  q.dtype = DType::kI32;
  expect_error(q, ErrorCode::kUnsupported, "dtype");
}

}  // namespace
}  // namespace longctx
