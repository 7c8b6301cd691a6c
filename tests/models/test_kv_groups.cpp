// KvGroups from model configs: Llama/Qwen fixtures are one full group (the pool as before);
// mixed sliding/full layers, Gemma 3's pattern and Qwen3-Next's linear layers form groups with
// their layers, pool layers, windows and bytes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/test_data.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/error.h"
#include "longctx/loader/model_config.h"

namespace longctx {
namespace {

using LA = LayerAttention;

ModelConfig fixture(const std::string& name) {
  return load_model_config(testing::test_data_dir() + "/fixtures/" + name + "/config.json");
}

TEST(KvGroups, FixturesAreOneFullGroup) {
  for (const char* name : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    const ModelConfig c = fixture(name);
    const KvGroups g = KvGroups::from_config(c, DType::kBF16);
    ASSERT_EQ(g.size(), 1) << name;
    EXPECT_TRUE(g.single_full());
    EXPECT_EQ(g[0].layers.size(), static_cast<size_t>(c.num_hidden_layers));
    EXPECT_EQ(g.pool_layers(), c.num_hidden_layers);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      EXPECT_EQ(g.pool_layer(l), l);
      EXPECT_EQ(g.window_of(l), 0);
    }
    EXPECT_EQ(g[0].bytes_per_token, c.kv_bytes_per_token(DType::kBF16));
    EXPECT_EQ(g.block_bytes(16), 16 * c.kv_bytes_per_token(DType::kBF16));
    EXPECT_EQ(g.state_bytes_per_seq(), 0);
    EXPECT_EQ(g.allocs().size(), 1u);
  }
}

TEST(KvGroups, Fp8HalvesTheBytesAndAddsScalesPerBlock) {
  ModelConfig c = fixture("tiny-llama3");
  c.num_hidden_layers = 4;
  c.layer_types = {LA::kSliding, LA::kFull, LA::kSliding, LA::kFull};
  c.sliding_window = 20;
  const KvGroups bf16 = KvGroups::from_config(c, DType::kBF16);
  const KvGroups fp8 = KvGroups::from_config(c, DType::kFP8E4M3);
  const int64_t hkv = c.num_key_value_heads, d = c.head_dim;
  ASSERT_EQ(fp8.size(), 2);
  for (int64_t g = 0; g < 2; ++g) {
    EXPECT_EQ(fp8[g].dtype, DType::kFP8E4M3);
    EXPECT_EQ(2 * fp8[g].bytes_per_token, bf16[g].bytes_per_token);
    EXPECT_EQ(fp8[g].scale_bytes_per_block, 2 * 2 * hkv * 4);  // 2 layers, K and V, fp32
    EXPECT_EQ(bf16[g].scale_bytes_per_block, 0);
  }
  // A block: K + V codes of the pool's 2 layers, and their scales.
  EXPECT_EQ(fp8.block_bytes(16), 2 * (2 * hkv * d * 16 + 2 * hkv * 4));
  // 100 tokens: the full group's 7 blocks of 16, the sliding group's 20 tokens in 2 blocks.
  EXPECT_EQ(fp8.bytes_per_seq(100, 16),
            100 * 4 * hkv * d + 20 * 4 * hkv * d + (7 + 2) * 2 * 2 * hkv * 4);
  EXPECT_EQ(fp8.describe()[0], fmt::format("group 0: full, 2 layers (1,3), fp8_e4m3, {} B/token + "
                                           "{} B/block of scales",
                                           4 * hkv * d, 4 * hkv * 4));
}

TEST(KvGroups, SlidingAndFullLayers) {
  ModelConfig c = fixture("tiny-llama3");
  c.num_hidden_layers = 4;
  c.layer_types = {LA::kSliding, LA::kFull, LA::kSliding, LA::kFull};
  c.sliding_window = 20;
  const KvGroups g = KvGroups::from_config(c, DType::kF32);
  ASSERT_EQ(g.size(), 2);
  EXPECT_FALSE(g.single_full());
  EXPECT_EQ(g[0].kind, KvGroupKind::kFull);  // full first
  EXPECT_EQ(g[0].layers, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(g[1].kind, KvGroupKind::kSlidingWindow);
  EXPECT_EQ(g[1].window, 20);
  EXPECT_EQ(g[1].layers, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(g.group_of(2), 1);
  EXPECT_EQ(g.pool_layer(2), 1);
  EXPECT_EQ(g.pool_layer(3), 1);
  EXPECT_EQ(g.window_of(0), 20);
  EXPECT_EQ(g.window_of(1), 0);
  EXPECT_EQ(g.pool_layers(), 2);
  const int64_t per_layer = 2 * c.num_key_value_heads * c.head_dim * 4;
  EXPECT_EQ(g[0].bytes_per_token, 2 * per_layer);
  EXPECT_EQ(g.block_bytes(8), 8 * 2 * per_layer);
  EXPECT_EQ(g.paged_bytes_per_token(), 4 * per_layer);
  EXPECT_EQ(g.bytes_per_seq(100, 16), 100 * 2 * per_layer + 20 * 2 * per_layer);
  EXPECT_EQ(g.bytes_per_seq(10, 16), 10 * 4 * per_layer);
  const auto lines = g.describe();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], fmt::format("group 1: sliding_window (window 20), 2 layers (0,2), f32, {} "
                                  "B/token",
                                  2 * per_layer));
  const auto a = g.allocs();
  EXPECT_EQ(a[1].kind, KvGroupKind::kSlidingWindow);
  EXPECT_EQ(a[1].window, 20);
}

TEST(KvGroups, LinearAttentionIsAStateGroup) {
  ModelConfig c = fixture("tiny-llama3");
  c.num_hidden_layers = 8;
  c.layer_types.assign(8, LA::kLinear);
  c.layer_types[3] = c.layer_types[7] = LA::kFull;
  c.linear = {2, 4, 16, 32, 4};
  const KvGroups g = KvGroups::from_config(c, DType::kBF16);
  ASSERT_EQ(g.size(), 2);
  EXPECT_EQ(g[0].layers, (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(g[1].kind, KvGroupKind::kState);
  EXPECT_EQ(g[1].layers, (std::vector<int64_t>{0, 1, 2, 4, 5, 6}));
  // recurrent [4, 16, 32] + conv (4 - 1) x (2 * 2 * 16 + 4 * 32), per layer, in fp32 (as the
  // kernels keep it) whatever the KV cache's dtype
  const int64_t per_layer = (4 * 16 * 32 + 3 * (2 * 2 * 16 + 4 * 32)) * 4;
  EXPECT_EQ(g[1].dtype, DType::kF32);
  EXPECT_EQ(KvGroups::from_config(c, DType::kFP8E4M3).state_bytes_per_seq(), 6 * per_layer);
  EXPECT_EQ(g[1].bytes_per_seq, 6 * per_layer);
  EXPECT_EQ(g[1].bytes_per_token, 0);
  EXPECT_EQ(g.state_bytes_per_seq(), 6 * per_layer);
  EXPECT_EQ(g.pool_layers(), 2);
  EXPECT_TRUE(g.has_kind(KvGroupKind::kState));
  c.linear.conv_kernel_dim = 0;
  EXPECT_THROW(KvGroups::from_config(c, DType::kBF16), Error);
}

// Gemma's 5 local : 1 global: the local layers are cut into groups as large as the global one,
// so a pool block (pool_layers() layers) is full in every group, and a sequence's blocks cost
// what its layers keep (the global group every token, each local group its window).
TEST(KvGroups, GemmaPatternIsCutIntoGroupsOfEqualSize) {
  ModelConfig c = fixture("tiny-llama3");
  c.num_hidden_layers = 12;
  c.layer_types.assign(12, LA::kSliding);
  c.layer_types[5] = c.layer_types[11] = LA::kFull;
  c.sliding_window = 512;
  const KvGroups g = KvGroups::from_config(c, DType::kBF16);
  ASSERT_EQ(g.size(), 6);
  EXPECT_EQ(g[0].layers, (std::vector<int64_t>{5, 11}));
  EXPECT_EQ(g[1].layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(g[3].layers, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(g[5].layers, (std::vector<int64_t>{9, 10}));
  for (int64_t i = 1; i < 6; ++i) EXPECT_EQ(g[i].window, 512);
  EXPECT_EQ(g.pool_layers(), 2);
  EXPECT_EQ(g.pool_layer(11), 1);
  EXPECT_EQ(g.pool_layer(10), 1);
  EXPECT_EQ(g.group_of(10), 5);
  const int64_t per_layer = 2 * c.num_key_value_heads * c.head_dim * 2;
  EXPECT_EQ(g.block_bytes(16), 16 * 2 * per_layer);
  EXPECT_EQ(g.bytes_per_seq(4096, 16), 4096 * 2 * per_layer + 512 * 10 * per_layer);
  // A sliding kind of 7 layers beside 3 full: groups of 3, 3 and 1.
  c.num_hidden_layers = 10;
  c.layer_types.assign(10, LA::kSliding);
  c.layer_types[0] = c.layer_types[4] = c.layer_types[8] = LA::kFull;
  const KvGroups h = KvGroups::from_config(c, DType::kBF16);
  ASSERT_EQ(h.size(), 4);
  EXPECT_EQ(h[3].layers, (std::vector<int64_t>{9}));
  EXPECT_EQ(h.pool_layers(), 3);
  c.sliding_window = 0;
  EXPECT_THROW(KvGroups::from_config(c, DType::kBF16), Error);
}

}  // namespace
}  // namespace longctx
