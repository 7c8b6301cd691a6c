// StatePool: slots of every state layer's recurrent and conv state, views that do not overlap,
// reset zeroing one slot only, copy moving every layer of one slot into another, out-of-range
// slots and layers refused.
#include <gtest/gtest.h>

#include "kv/state_pool.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

void fill(const Tensor& t, float v) {
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v;
}

bool all_equal(const Tensor& t, float v) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.data<float>()[i] != v) return false;
  return true;
}

TEST(StatePool, SlotsAndLayersAreDisjointAndResetZeroesOneSlot) {
  StatePool pool(3, 2, {4, 2, 3}, {3, 5});
  EXPECT_EQ(pool.slot_bytes(), 2 * (24 + 15) * 4);
  EXPECT_EQ(pool.recurrent(0, 0).shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(pool.conv(2, 1).shape(), (Shape{3, 5}));
  float v = 1.f;
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t l = 0; l < 2; ++l) {
      fill(pool.recurrent(s, l), v++);
      fill(pool.conv(s, l), v++);
    }
  v = 1.f;
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t l = 0; l < 2; ++l) {
      EXPECT_TRUE(all_equal(pool.recurrent(s, l), v++)) << s << " " << l;
      EXPECT_TRUE(all_equal(pool.conv(s, l), v++)) << s << " " << l;
    }
  pool.reset(1);
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(all_equal(pool.recurrent(1, l), 0.f));
    EXPECT_TRUE(all_equal(pool.conv(1, l), 0.f));
    EXPECT_FALSE(all_equal(pool.recurrent(0, l), 0.f));
    EXPECT_FALSE(all_equal(pool.conv(2, l), 0.f));
  }
}

TEST(StatePool, CopyMovesEveryLayerOfOneSlot) {
  StatePool pool(3, 2, {2, 3}, {1, 4});
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t l = 0; l < 2; ++l) {
      fill(pool.recurrent(s, l), float(10 * s + 2 * l));
      fill(pool.conv(s, l), float(10 * s + 2 * l + 1));
    }
  pool.copy(0, 2);
  pool.copy(1, 1);  // onto itself: unchanged
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(all_equal(pool.recurrent(2, l), float(2 * l)));
    EXPECT_TRUE(all_equal(pool.conv(2, l), float(2 * l + 1)));
    EXPECT_TRUE(all_equal(pool.recurrent(1, l), float(10 + 2 * l)));
    EXPECT_TRUE(all_equal(pool.recurrent(0, l), float(2 * l)));
  }
  EXPECT_THROW(pool.copy(0, 3), Error);
  EXPECT_THROW(pool.copy(-1, 0), Error);
}

TEST(StatePool, RejectsBadSizesAndIndices) {
  EXPECT_THROW(StatePool(0, 2, {1}, {1}), Error);
  EXPECT_THROW(StatePool(2, 0, {1}, {1}), Error);
  EXPECT_THROW(StatePool(2, 2, {-1}, {1}), Error);
  StatePool pool(2, 1, {2}, {2});
  EXPECT_THROW(pool.recurrent(2, 0), Error);
  EXPECT_THROW(pool.conv(0, 1), Error);
  EXPECT_THROW(pool.reset(-1), Error);
}

}  // namespace
}  // namespace longctx
