// Bad calls get clear errors and leave the KV cache as it was; the registry names what it runs.
#include <gtest/gtest.h>

#include "longctx/attention/kv_cache.h"
#include "longctx/engine/reference_forward.h"
#include "model_test_util.h"

using namespace longctx;
using namespace longctx::testing;

TEST(KVCache, ShapesAdvanceAndTruncate) {
  auto model = load_fixture_model("tiny-llama3");
  KVCache cache(model->config(), 10);
  EXPECT_EQ(cache.num_layers(), 3);
  EXPECT_EQ(cache.k(0).shape(), (Shape{10, 2, 16}));
  EXPECT_EQ(cache.v(2).shape(), (Shape{10, 2, 16}));
  EXPECT_EQ(cache.positions().shape(), (Shape{10}));
  cache.advance(4);
  EXPECT_EQ(cache.length(), 4);
  EXPECT_THROW(cache.advance(7), Error);
  EXPECT_EQ(cache.length(), 4);
  cache.truncate(1);
  EXPECT_EQ(cache.length(), 1);
  EXPECT_THROW(cache.truncate(2), Error);
}

TEST(ModelErrors, FullCacheIsOutOfRangeAndAppendsNothing) {
  auto model = load_fixture_model("tiny-qwen3");
  auto cache = std::make_unique<KVCache>(model->config(), 4);
  std::vector<int32_t> ids = {1, 2, 3};
  reference_forward(*model, ids, iota_positions(0, 3), *cache);
  try {
    reference_forward(*model, ids, iota_positions(3, 3), *cache);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange) << e.what();
  }
  EXPECT_EQ(cache->length(), 3);
}

TEST(ModelErrors, BadArgumentsAreRejected) {
  auto model = load_fixture_model("tiny-qwen2");
  auto cache = std::make_unique<KVCache>(model->config(), 8);
  std::vector<int32_t> ids = {1, 2, 3};
  EXPECT_THROW(reference_forward(*model, ids, iota_positions(0, 2), *cache), Error);
  std::vector<int32_t> bad = {1, 5000};
  try {
    reference_forward(*model, bad, iota_positions(0, 2), *cache);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange) << e.what();
  }
  EXPECT_EQ(cache->length(), 0);
  // A cache made for another model.
  auto other = load_fixture_model("tiny-llama3");
  auto wrong = std::make_unique<KVCache>(other->config(), 8);
  EXPECT_THROW(reference_forward(*model, ids, iota_positions(0, 3), *wrong), Error);
}

TEST(ModelRegistry, UnknownArchitectureListsSupportedOnes) {
  auto ckpt = std::make_shared<Checkpoint>(load_checkpoint(fixture_dir("tiny-llama3")));
  ckpt->config.architecture = "GPT2LMHeadModel";
  try {
    create_model(ckpt);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    std::string msg = e.what();
    EXPECT_NE(msg.find("GPT2LMHeadModel"), std::string::npos) << msg;
    for (const std::string& a : supported_architectures())
      EXPECT_NE(msg.find(a), std::string::npos) << a << " missing from: " << msg;
  }
}
