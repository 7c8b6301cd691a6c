// config.json and generation_config.json: the input is parsed as both (with the depth limit
// every checkpoint file gets), validated, and the sizes the models derive from it computed.
#include "fuzz_common.h"
#include "longctx/core/dtype.h"
#include "longctx/core/json_limits.h"
#include "longctx/loader/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace longctx;
  fuzz::expect_clean([&] {
    nlohmann::json j = parse_json(fuzz::as_text(data, size), "config.json");
    fuzz::expect_clean([&] {
      ModelConfig c = parse_model_config(j, "config.json");
      (void)c.kv_bytes_per_token(DType::kF32);
      (void)c.q_size();
      (void)c.quantization.ignores("model.layers.0.mlp.down_proj");
    });
    if (j.is_object() && j.contains("eos_token_id"))
      parse_token_id_list(j["eos_token_id"], "generation_config.json eos_token_id");
    (void)json_excerpt(j);
  });
  return 0;
}
