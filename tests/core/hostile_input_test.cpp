// Sizes from untrusted files (issue 15): overflowing shapes and impossible allocations are
// Errors naming the shape and the bytes, not undersized buffers or a bare std::bad_alloc.
#include <gtest/gtest.h>

#include "longctx/core/error.h"
#include "longctx/core/logging.h"
#include "longctx/core/tensor.h"

using namespace longctx;

namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorCode::kInternal, "no error");
}

TEST(CoreHostile, OverflowingShapesAreErrors) {
  const int64_t big = int64_t{1} << 32;
  Error e = error_of([&] { shape_numel({big, big}); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_CONTAINS(e.what(), "shape [4294967296, 4294967296] has more than 2^63 elements");
  e = error_of([&] { Tensor::empty({big, big}, DType::kF32); });
  EXPECT_CONTAINS(e.what(), "more than 2^63 elements");
  // 2^61 elements fit, 2^61 * 4 bytes do not.
  e = error_of([&] { Tensor::empty({int64_t{1} << 61}, DType::kF32); });
  EXPECT_CONTAINS(e.what(), "needs more than 2^63 bytes");
  EXPECT_EQ(shape_numel({3, 0, big}), 0);
}

TEST(CoreHostile, ImpossibleAllocationIsAnOutOfMemoryError) {
  // 2^46 floats = 256 TiB: past any machine's address space.
  Error e = error_of([&] { Tensor::empty({int64_t{1} << 23, int64_t{1} << 23}, DType::kF32); });
  EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
  EXPECT_CONTAINS(e.what(), "cannot allocate 281474976710656 bytes");
  EXPECT_CONTAINS(e.what(), "shape [8388608, 8388608]");
}

TEST(CoreHostile, UnknownLogLevelIsAnError) {
  Error e = error_of([&] { set_log_level("verbose"); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_CONTAINS(e.what(), "unknown log level 'verbose'");
  const auto before = logger().level();
  set_log_level("error");
  EXPECT_EQ(logger().level(), spdlog::level::err);
  set_log_level("warn");
  EXPECT_EQ(logger().level(), spdlog::level::warn);
  logger().set_level(before);
}

}  // namespace
