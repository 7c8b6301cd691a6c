// A build without CUDA: the CUDA runtime layer reports that clearly instead of failing later.
#include <gtest/gtest.h>

#include <string>

#include "longctx/core/error.h"
#include "longctx/core/pinned_upload.h"
#include "longctx/core/stream.h"

using namespace longctx;

namespace {
template <typename F>
void expect_unsupported(F&& f, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << " did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos) << e.what();
  }
}
}  // namespace

// Only in a build without CUDA (tests/gpu_core covers the CUDA build's).
#ifndef LONGCTX_WITH_CUDA
TEST(NoCuda, StreamsEventsAndUploader) {
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_EQ(current_stream(0), nullptr);
  EXPECT_EQ(current_stream(3), nullptr);
  { DeviceGuard g(-1); }  // no-op
  expect_unsupported([] { DeviceGuard g(0); }, "DeviceGuard(0)");
  expect_unsupported([] { Stream s(Device::cuda(0)); }, "Stream");
  expect_unsupported([] { Event e(Device::cuda(0), true); }, "Event");
  expect_unsupported([] { device_synchronize(0); }, "device_synchronize");
  expect_unsupported([] { device_properties(0); }, "device_properties");
  expect_unsupported([] { PinnedUploader u(0); }, "PinnedUploader");
}
#endif
