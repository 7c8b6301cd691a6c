// Hostile checkpoint files (issue 15): deep JSON, out-of-range sizes and overflowing shapes end
// in an Error naming the field, never a stack overflow, a wrap-around or an endless allocation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_data.h"
#include "loader/safetensors.h"
#include "longctx/core/json_limits.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/loader/model_config.h"

using namespace longctx;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

json tiny_config() {
  std::ifstream f(longctx::testing::test_data_dir() + "/fixtures/tiny-llama3/config.json");
  return json::parse(f);
}

std::string config_error(const json& j) {
  try {
    parse_model_config(j, "config.json");
  } catch (const Error& e) {
    EXPECT_NE(e.code(), ErrorCode::kInternal);
    return e.what();
  }
  return "";
}

fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("longctx_hostile_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string deep_json(int depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

TEST(HostileJson, DepthLimitAndShortExcerpts) {
  EXPECT_NO_THROW(parse_json(deep_json(kMaxJsonDepth), "x"));
  try {
    parse_json(deep_json(300000), "deep.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "deep.json: JSON nested deeper than");
  }
  // Brackets inside strings do not count.
  EXPECT_NO_THROW(parse_json("[\"" + std::string(1000, '[') + "\\\"[\"]", "x"));
  EXPECT_CONTAINS(json_excerpt(json(std::string(10000, 'a'))).size() < 100 ? "short" : "long",
                  "short");
  json nested = 1;
  for (int i = 0; i < 100; ++i) nested = json::array({nested, 2});
  EXPECT_LT(json_excerpt(nested).size(), 100u);
  EXPECT_EQ(json_excerpt(json::parse("[1, \"a\", {\"k\": null}]")), "[1, \"a\", {\"k\": null}]");
}

TEST(HostileConfig, DeepFieldsAreRefusedByTheParser) {
  for (const char* name : {"config.json", "generation_config.json"}) {
    fs::path dir = scratch(std::string("deep_") + name);
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
      fs::copy_file(longctx::testing::test_data_dir() + "/fixtures/tiny-llama3/" + f, dir / f);
    std::string text = "{\"eos_token_id\": " + deep_json(300000) + "}";
    if (std::string(name) == "config.json") {
      json j = tiny_config();
      std::string s = j.dump();
      text = s.substr(0, s.size() - 1) + ", \"head_dim\": " + deep_json(300000) + "}";
    }
    std::ofstream(dir / name) << text;
    try {
      load_checkpoint(dir.string());
      FAIL() << "no error for " << name;
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), "JSON nested deeper than");
      EXPECT_CONTAINS(e.what(), name);
    }
    fs::remove_all(dir);
  }
  // A wrong type deep inside (accepted by the depth limit) is quoted briefly.
  json j = tiny_config();
  j["head_dim"] = json::parse(deep_json(100));
  std::string e = config_error(j);
  EXPECT_CONTAINS(e, "field 'head_dim' must be an integer");
  EXPECT_LT(e.size(), 200u);
}

TEST(HostileConfig, SizesOutOfRange) {
  struct Case {
    const char* key;
    json value;
    const char* message;
  } cases[] = {
      {"num_hidden_layers", 1000000000, "field 'num_hidden_layers' must be in [1, 1024]"},
      {"vocab_size", int64_t{1} << 40, "field 'vocab_size' must be in"},
      {"hidden_size", int64_t{1} << 40, "field 'hidden_size' must be in"},
      {"intermediate_size", int64_t{1} << 40, "field 'intermediate_size' must be in"},
      {"num_attention_heads", 100000, "field 'num_attention_heads' must be in"},
      {"head_dim", 0, "field 'head_dim' must be in"},
      {"head_dim", -64, "field 'head_dim' must be in"},
      {"head_dim", int64_t{1} << 40, "field 'head_dim' must be in"},
      {"max_position_embeddings", 0, "field 'max_position_embeddings' must be in"},
      {"max_position_embeddings", int64_t{1} << 62, "field 'max_position_embeddings' must be in"},
      {"vocab_size", 18446744073709551615ull, "field 'vocab_size' must be an integer"},
      {"rms_norm_eps", -1.0, "rms_norm_eps"},
      // fuzz_config finding: a non-string model_type escaped as a nlohmann type_error.
      {"model_type", 3, "field 'model_type' must be a string, got 3"},
  };
  for (const Case& c : cases) {
    json j = tiny_config();
    j[c.key] = c.value;
    EXPECT_CONTAINS(config_error(j), c.message);
  }
}

TEST(HostileConfig, RopeFields) {
  json j = tiny_config();
  j.erase("rope_parameters");  // so that rope_scaling is the one read
  j["rope_scaling"] = {{"rope_type", 3}, {"factor", 8.0}};
  EXPECT_CONTAINS(config_error(j), "'rope_type' must be a string, got 3");
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 0}};
  EXPECT_CONTAINS(config_error(j), "field 'original_max_position_embeddings' must be in");
  j["rope_scaling"]["original_max_position_embeddings"] = -5;
  EXPECT_CONTAINS(config_error(j), "field 'original_max_position_embeddings' must be in");
  j["rope_scaling"]["original_max_position_embeddings"] = 8192;
  EXPECT_EQ(config_error(j), "");
}

// Writes a safetensors file with the given header text and `data_bytes` zero bytes of data.
std::string write_safetensors(const fs::path& path, const std::string& header, size_t data_bytes) {
  std::string padded = header;
  while ((8 + padded.size()) % 8 != 0) padded += ' ';  // data must be aligned for its dtype
  std::string out(8, '\0');
  uint64_t n = padded.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += padded + std::string(data_bytes, '\0');
  std::ofstream(path, std::ios::binary) << out;
  try {
    SafetensorsFile::open(path.string());
  } catch (const Error& e) {
    EXPECT_NE(e.code(), ErrorCode::kInternal);
    return e.what();
  }
  return "";
}

TEST(HostileSafetensors, DeepHeaderAndOverflowingShapes) {
  fs::path dir = scratch("safetensors");
  fs::path f = dir / "model.safetensors";
  EXPECT_CONTAINS(write_safetensors(f, "{\"a\": " + deep_json(300000) + "}", 0),
                  "safetensors header: JSON nested deeper than");
  // 2^32 * 2^32 elements wraps to 0 in 64 bits: must not pass as a 0-byte tensor.
  EXPECT_CONTAINS(write_safetensors(f,
                                    "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, "
                                    "4294967296], \"data_offsets\": [0, 0]}}",
                                    0),
                  "more than 2^63 elements");
  // 2^62 elements fit in int64, but not 2^62 * 4 bytes.
  EXPECT_CONTAINS(write_safetensors(f,
                                    "{\"w\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904],"
                                    " \"data_offsets\": [0, 0]}}",
                                    0),
                  "is too large");
  EXPECT_CONTAINS(
      write_safetensors(f,
                        "{\"w\": {\"dtype\": \"F32\", \"shape\": [18446744073709551615],"
                        " \"data_offsets\": [0, 0]}}",
                        0),
      "shape entries must be non-negative integers");
  EXPECT_EQ(write_safetensors(f,
                              "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2],"
                              " \"data_offsets\": [0, 16]}}",
                              16),
            "");
  fs::remove_all(dir);
}

}  // namespace
