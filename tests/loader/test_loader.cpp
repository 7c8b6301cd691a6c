// Loader tests: the fixtures load; every kind of bad input gets an Error that names the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_data.h"
#include "longctx/loader/checkpoint.h"

using namespace longctx;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string fixture(const std::string& name) {
  return longctx::testing::test_data_dir() + "/fixtures/" + name;
}

// A scratch folder holding a copy of a fixture that each test breaks in its own way.
class BrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("longctx_loader_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
      fs::copy_file(fixture("tiny-llama3") + "/" + f, dir_ / f);
    config_ = json::parse(std::ifstream(dir_ / "config.json"));
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_config() { std::ofstream(dir_ / "config.json") << config_.dump(2); }

  // Writes model.safetensors from a header object and raw data bytes.
  void write_raw(const json& header, const std::string& data, int64_t header_len_override = -1) {
    std::string h = header.dump();
    while ((8 + h.size()) % 8) h += ' ';
    uint64_t len = header_len_override >= 0 ? uint64_t(header_len_override) : h.size();
    std::ofstream f(dir_ / "model.safetensors", std::ios::binary);
    for (int i = 0; i < 8; ++i) f.put(char((len >> (8 * i)) & 0xff));
    f << h << data;
  }

  // Rewrites model.safetensors from the fixture's tensors after `edit` changed the set.
  void rewrite(const std::function<void(std::map<std::string, Tensor>&)>& edit) {
    Checkpoint ck = load_checkpoint(fixture("tiny-llama3"));
    std::map<std::string, Tensor> t(ck.weights.all().begin(), ck.weights.all().end());
    edit(t);
    json header = json::object();
    std::string data;
    for (auto& [name, tensor] : t) {
      const char* dt = tensor.dtype() == DType::kBF16  ? "BF16"
                       : tensor.dtype() == DType::kF32 ? "F32"
                                                       : "F16";
      header[name] = {{"dtype", dt},
                      {"shape", tensor.shape()},
                      {"data_offsets", {data.size(), data.size() + tensor.nbytes()}}};
      data.append(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
    }
    write_raw(header, data);
  }

  // Loads and returns the error message (fails the test when loading succeeds).
  std::string load_error() {
    try {
      load_checkpoint(dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "load_checkpoint succeeded";
    return "";
  }

  fs::path dir_;
  json config_;
};

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

}  // namespace

TEST(Loader, LoadsAllFixtures) {
  for (const char* name : {"tiny-llama3", "tiny-qwen3", "tiny-qwen2"}) {
    Checkpoint ck = load_checkpoint(fixture(name));
    EXPECT_EQ(ck.config.vocab_size, 1024) << name;
    EXPECT_EQ(ck.config.dtype, DType::kBF16);
    EXPECT_EQ(ck.config.eos_token_ids, (std::vector<int64_t>{2}));
    EXPECT_EQ(ck.weights.get("model.embed_tokens.weight").dtype(), DType::kBF16);
  }
  Checkpoint llama = load_checkpoint(fixture("tiny-llama3"));
  EXPECT_EQ(llama.config.rope.type, RopeType::kLlama3);
  EXPECT_EQ(llama.config.rope.original_max_position_embeddings, 256);
  EXPECT_DOUBLE_EQ(llama.config.rope.theta, 500000.0);
  EXPECT_EQ(llama.config.head_dim, 16);
  EXPECT_TRUE(llama.weights.has("lm_head.weight"));
  Checkpoint qwen3 = load_checkpoint(fixture("tiny-qwen3"));
  EXPECT_TRUE(qwen3.config.qk_norm);
  EXPECT_TRUE(qwen3.config.tie_word_embeddings);
  EXPECT_EQ(qwen3.config.head_dim, 64);
  EXPECT_EQ(qwen3.weights.get("model.layers.0.self_attn.q_proj.weight").shape(), (Shape{256, 128}));
  Checkpoint qwen2 = load_checkpoint(fixture("tiny-qwen2"));
  EXPECT_TRUE(qwen2.config.attention_bias);
  EXPECT_FALSE(qwen2.config.o_proj_bias);
  EXPECT_TRUE(qwen2.weights.has("model.layers.1.self_attn.k_proj.bias"));
}

TEST(Loader, WeightsOutliveTheCheckpointObject) {
  Tensor w;
  {
    Checkpoint ck = load_checkpoint(fixture("tiny-llama3"));
    w = ck.weights.get("model.norm.weight");
  }
  // The view keeps the mapping alive: reading it after the checkpoint is gone is valid.
  float sum = 0;
  for (int64_t i = 0; i < w.numel(); ++i) sum += bf16_to_f32(w.data<uint16_t>()[i]);
  EXPECT_TRUE(std::isfinite(sum));
}

TEST_F(BrokenCheckpoint, MissingDirectoryAndFiles) {
  EXPECT_THROW(load_checkpoint((dir_ / "nope").string()), Error);
  fs::remove(dir_ / "model.safetensors");
  EXPECT_HAS(load_error(), "no model.safetensors");
  fs::remove(dir_ / "config.json");
  EXPECT_HAS(load_error(), "config.json: cannot open");
}

TEST_F(BrokenCheckpoint, BadConfigJson) {
  std::ofstream(dir_ / "config.json") << "{\"architectures\": [\"LlamaForCausalLM\",";
  EXPECT_HAS(load_error(), "not valid JSON");
}

TEST_F(BrokenCheckpoint, UnsupportedArchitectureListsSupported) {
  config_["architectures"] = {"GPT2LMHeadModel"};
  write_config();
  std::string e = load_error();
  EXPECT_HAS(e, "unsupported architecture 'GPT2LMHeadModel'");
  EXPECT_HAS(e, "Qwen3ForCausalLM");
  EXPECT_HAS(e, "LlamaForCausalLM");
}

TEST_F(BrokenCheckpoint, UnsupportedRopeType) {
  config_["rope_parameters"]["rope_type"] = "mrope";
  write_config();
  EXPECT_HAS(load_error(), "unsupported rope type 'mrope'");
  EXPECT_HAS(load_error(), "supported: default, linear, llama3, yarn, longrope, dynamic");
}

TEST_F(BrokenCheckpoint, OldStyleRopeScalingAndTorchDtype) {
  json rp = config_["rope_parameters"];
  config_.erase("rope_parameters");
  config_.erase("dtype");
  config_["torch_dtype"] = "bfloat16";
  config_["rope_theta"] = rp["rope_theta"];
  rp.erase("rope_theta");
  rp["type"] = rp["rope_type"];
  rp.erase("rope_type");
  config_["rope_scaling"] = rp;
  write_config();
  Checkpoint ck = load_checkpoint(dir_.string());
  EXPECT_EQ(ck.config.rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(ck.config.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(ck.config.rope.factor, 8.0);
  EXPECT_EQ(ck.config.dtype, DType::kBF16);
}

TEST_F(BrokenCheckpoint, MissingOrInvalidConfigField) {
  config_.erase("hidden_size");
  write_config();
  EXPECT_HAS(load_error(), "missing required field 'hidden_size'");
  config_["hidden_size"] = "wide";
  write_config();
  EXPECT_HAS(load_error(), "field 'hidden_size' must be an integer");
  config_["hidden_size"] = 128;
  config_["num_key_value_heads"] = 3;
  write_config();
  EXPECT_HAS(load_error(), "must be a multiple of num_key_value_heads");
}

TEST_F(BrokenCheckpoint, HeaderLengthPastFile) {
  write_raw(json::object(), "", 1 << 20);
  EXPECT_HAS(load_error(), "header length 1048576 runs past the end of the file");
}

TEST_F(BrokenCheckpoint, TruncatedFile) {
  std::ofstream(dir_ / "model.safetensors", std::ios::binary) << "abc";
  EXPECT_HAS(load_error(), "shorter than the 8-byte header length");
}

TEST_F(BrokenCheckpoint, HeaderNotJson) {
  std::string h = "{not json}     ";
  std::ofstream f(dir_ / "model.safetensors", std::ios::binary);
  uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) f.put(char((len >> (8 * i)) & 0xff));
  f << h;
  f.close();
  EXPECT_HAS(load_error(), "header is not a valid JSON object");
}

TEST_F(BrokenCheckpoint, OffsetsOutsideDataSection) {
  write_raw(
      {{"model.norm.weight", {{"dtype", "BF16"}, {"shape", {128}}, {"data_offsets", {0, 256}}}}},
      std::string(100, '\0'));
  EXPECT_HAS(load_error(), "lie outside the data section of 100 bytes");
}

TEST_F(BrokenCheckpoint, SizeNotMatchingShape) {
  write_raw(
      {{"model.norm.weight", {{"dtype", "BF16"}, {"shape", {128}}, {"data_offsets", {0, 128}}}}},
      std::string(256, '\0'));
  EXPECT_HAS(load_error(), "128 bytes of data for shape [128] of bf16 (needs 256)");
}

TEST_F(BrokenCheckpoint, OverlappingTensors) {
  write_raw({{"a", {{"dtype", "BF16"}, {"shape", {64}}, {"data_offsets", {0, 128}}}},
             {"b", {{"dtype", "BF16"}, {"shape", {64}}, {"data_offsets", {64, 192}}}}},
            std::string(256, '\0'));
  std::string e = load_error();
  EXPECT_HAS(e, "tensors 'a' [0, 128) and 'b' [64, 192) overlap");
}

TEST_F(BrokenCheckpoint, MisalignedTensor) {
  write_raw({{"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {2, 18}}}}},
            std::string(32, '\0'));
  EXPECT_HAS(load_error(), "is misaligned for f32 elements");
}

TEST_F(BrokenCheckpoint, UnsupportedSafetensorsDtype) {
  write_raw({{"a", {{"dtype", "F8_E5M2"}, {"shape", {4}}, {"data_offsets", {0, 4}}}}},
            std::string(8, '\0'));
  EXPECT_HAS(load_error(), "unsupported safetensors dtype 'F8_E5M2'");
}

TEST_F(BrokenCheckpoint, MissingTensorsAreListed) {
  rewrite([](auto& t) {
    t.erase("model.layers.1.mlp.up_proj.weight");
    t.erase("model.norm.weight");
  });
  std::string e = load_error();
  EXPECT_HAS(e, "2 tensor(s) missing for LlamaForCausalLM");
  EXPECT_HAS(e, "model.layers.1.mlp.up_proj.weight");
  EXPECT_HAS(e, "model.norm.weight");
}

TEST_F(BrokenCheckpoint, UnexpectedTensorsAreListed) {
  rewrite([](auto& t) {
    t["model.layers.0.self_attn.q_proj.bias"] = Tensor::zeros({128}, DType::kBF16);
    t["vision_tower.weight"] = Tensor::zeros({4}, DType::kBF16);
  });
  std::string e = load_error();
  EXPECT_HAS(e, "2 unexpected tensor(s)");
  EXPECT_HAS(e, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_HAS(e, "vision_tower.weight");
}

TEST_F(BrokenCheckpoint, ShapeNotMatchingConfig) {
  config_["intermediate_size"] = 360;
  write_config();
  EXPECT_HAS(load_error(), "has shape [128, 352] but the config implies [128, 360]");
}

TEST_F(BrokenCheckpoint, DtypeNotMatchingConfig) {
  config_["dtype"] = "float16";
  write_config();
  EXPECT_HAS(load_error(), "is bf16 but config.json declares f16");
}

TEST_F(BrokenCheckpoint, ShardedCheckpoint) {
  // Split the fixture into two shards with an index; it must load to the same tensors.
  Checkpoint ref = load_checkpoint(fixture("tiny-llama3"));
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  std::map<std::string, std::pair<json, std::string>> shards;
  int i = 0;
  for (const auto& [name, t] : ref.weights.all()) {
    std::string shard =
        (i++ % 2) ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    auto& [h, data] = shards[shard];
    h[name] = {{"dtype", "BF16"},
               {"shape", t.shape()},
               {"data_offsets", {data.size(), data.size() + t.nbytes()}}};
    data.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
    index["weight_map"][name] = shard;
  }
  fs::remove(dir_ / "model.safetensors");
  for (auto& [shard, hd] : shards) {
    std::string h = hd.first.dump();
    while ((8 + h.size()) % 8) h += ' ';
    std::ofstream f(dir_ / shard, std::ios::binary);
    uint64_t len = h.size();
    for (int b = 0; b < 8; ++b) f.put(char((len >> (8 * b)) & 0xff));
    f << h << hd.second;
  }
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  Checkpoint ck = load_checkpoint(dir_.string());
  EXPECT_EQ(ck.files.size(), 2u);
  EXPECT_EQ(ck.weights.all().size(), ref.weights.all().size());
  const Tensor& a = ck.weights.get("model.layers.2.mlp.down_proj.weight");
  const Tensor& b = ref.weights.get("model.layers.2.mlp.down_proj.weight");
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);

  // An index naming a tensor its shard lacks.
  index["weight_map"]["model.extra.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  EXPECT_HAS(load_error(), "the index lists tensors its shards lack: model.extra.weight");
  // An index naming a shard that does not exist.
  index["weight_map"].erase("model.extra.weight");
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  EXPECT_HAS(load_error(), "model-00002-of-00002.safetensors: cannot open");
}

TEST(Loader, DummyPresets) {
  for (const char* p : {"llama-3.1-8b", "qwen3-0.6b", "qwen3-8b"}) {
    ModelConfig c = dummy_preset_config(p);
    EXPECT_GT(c.num_hidden_layers, 0) << p;
  }
  ModelConfig q = dummy_preset_config("qwen3-0.6b");
  EXPECT_EQ(q.kv_bytes_per_token(DType::kBF16), 2 * 28 * 8 * 128 * 2);
  EXPECT_THROW(dummy_preset_config("gpt-5"), Error);
  Checkpoint ck = make_dummy_checkpoint(dummy_preset_config("tiny-llama"), 7);
  Checkpoint ck2 = make_dummy_checkpoint(dummy_preset_config("tiny-llama"), 7);
  const Tensor& a = ck.weights.get("model.layers.1.self_attn.q_proj.weight");
  const Tensor& b = ck2.weights.get("model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);  // deterministic
  const Tensor& n = ck.weights.get("model.norm.weight");
  for (int64_t i = 0; i < n.numel(); ++i) {
    float v = bf16_to_f32(n.data<uint16_t>()[i]);
    EXPECT_GT(v, 0.85f);
    EXPECT_LT(v, 1.15f);
  }
}
