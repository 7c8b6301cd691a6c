// quantization_config's KV cache scheme: ModelOpt's kv_cache_quant_algo "FP8" and
// compressed-tensors' kv_cache_scheme of 8-bit floats ask for an FP8 KV cache (what
// --kv-cache-dtype auto follows); other schemes and configs without one do not.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "longctx/core/error.h"
#include "longctx/loader/model_config.h"

namespace longctx {
namespace {

using nlohmann::json;

json config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", 64},
          {"hidden_size", 32},
          {"intermediate_size", 64},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2}};
}

bool fp8_of(const json& quantization) {
  json j = config();
  if (!quantization.is_null()) j["quantization_config"] = quantization;
  return parse_model_config(j, "config.json").kv_cache_fp8;
}

TEST(KvCacheConfig, ModelOptFp8) {
  EXPECT_TRUE(fp8_of({{"quant_method", "modelopt"}, {"kv_cache_quant_algo", "FP8"}}));
  EXPECT_TRUE(fp8_of({{"kv_cache_quant_algo", "fp8"}}));
  EXPECT_FALSE(fp8_of({{"quant_method", "modelopt"}, {"kv_cache_quant_algo", "NVFP4"}}));
  EXPECT_FALSE(fp8_of({{"quant_method", "modelopt"}, {"kv_cache_quant_algo", nullptr}}));
}

TEST(KvCacheConfig, CompressedTensorsScheme) {
  EXPECT_TRUE(
      fp8_of({{"quant_method", "compressed-tensors"},
              {"kv_cache_scheme", {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}}}}));
  EXPECT_FALSE(fp8_of({{"kv_cache_scheme", {{"num_bits", 8}, {"type", "int"}}}}));
  EXPECT_FALSE(fp8_of({{"kv_cache_scheme", nullptr}}));
}

TEST(KvCacheConfig, NoSchemeIsNotFp8) {
  EXPECT_FALSE(fp8_of(nullptr));
  EXPECT_FALSE(fp8_of({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}));
  EXPECT_THROW(fp8_of("not an object"), Error);  // malformed: refused by the quantization parser
  // ModelOpt FP8 weights are not read (their KV scheme alone is).
  EXPECT_THROW(fp8_of({{"quant_method", "modelopt"}, {"quant_algo", "FP8"}}), Error);
}

}  // namespace
}  // namespace longctx
