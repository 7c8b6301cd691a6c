// Quantized checkpoints: quantization_config parsing, the packed layouts decoded by a plain
// reference written here (bit by bit, from the published descriptions), and every kind of bad
// input an Error naming the tensor or field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_data.h"
#include "loader/quantize_checkpoint.h"
#include "loader/quantized_weights.h"
#include "loader/safetensors.h"
#include "longctx/core/error.h"
#include "longctx/loader/checkpoint.h"

using namespace longctx;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string fixture(const std::string& name) {
  return longctx::testing::test_data_dir() + "/fixtures/" + name;
}

json parse_error_config(const json& qc) { return json{{"quantization_config", qc}}; }

// The message of the Error `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(stmt, text)                                            \
  do {                                                                          \
    const std::string msg_ = error_of([&] { stmt; });                           \
    EXPECT_NE(msg_.find(text), std::string::npos) << "error: '" << msg_ << "'"; \
  } while (0)

TEST(QuantConfig, ParsesEachPublishedConfig) {
  QuantConfig q = parse_quant_config(json::object(), "c");
  EXPECT_EQ(q.method, QuantMethod::kNone);
  q = parse_quant_config(json::parse(R"({"quantization_config": {"quant_method": "fp8",
      "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 64]}})"),
                         "c");
  EXPECT_EQ(q.method, QuantMethod::kFp8Block);
  EXPECT_EQ(q.block_out, 128);
  EXPECT_EQ(q.block_in, 64);
  q = parse_quant_config(json::parse(R"({"quantization_config": {"quant_method": "awq",
      "bits": 4, "group_size": 64, "zero_point": true, "version": "GEMM"}})"),
                         "c");
  EXPECT_EQ(q.method, QuantMethod::kAwq);
  EXPECT_EQ(q.group_size, 64);
  q = parse_quant_config(json::parse(R"({"quantization_config": {"quant_method": "gptq",
      "bits": 4, "group_size": -1, "desc_act": false, "sym": false,
      "checkpoint_format": "gptq_v2"}})"),
                         "c");
  EXPECT_EQ(q.method, QuantMethod::kGptq);
  EXPECT_EQ(q.group_of(384), 384);
  EXPECT_FALSE(q.symmetric);
  EXPECT_FALSE(q.gptq_zero_minus_one);
  // What the tool writes parses back to the same config.
  for (const char* m : {"fp8", "ct", "awq", "gptq"}) {
    QuantConfig w;
    if (std::string(m) == "fp8") w.method = QuantMethod::kFp8Block, w.block_out = w.block_in = 128;
    if (std::string(m) == "ct") w.method = QuantMethod::kCompressedFp8, w.ignore = {"lm_head"};
    if (std::string(m) == "awq") w.method = QuantMethod::kAwq, w.bits = 4, w.group_size = 128;
    if (std::string(m) == "gptq")
      w.method = QuantMethod::kGptq, w.bits = 4, w.group_size = 128, w.symmetric = true,
      w.gptq_zero_minus_one = true;
    QuantConfig r =
        parse_quant_config(json{{"quantization_config", quantization_config_json(w)}}, "c");
    EXPECT_EQ(r.method, w.method) << m;
    EXPECT_EQ(r.group_size, w.group_size) << m;
    EXPECT_EQ(r.block_in, w.block_in) << m;
    EXPECT_EQ(r.ignore, w.ignore) << m;
    EXPECT_EQ(r.symmetric, w.symmetric) << m;
    EXPECT_EQ(r.gptq_zero_minus_one, w.gptq_zero_minus_one) << m;
  }
}

TEST(QuantConfig, IgnoreListTakesNamesAndRegexes) {
  QuantConfig q = parse_quant_config(json::parse(R"({"quantization_config": {
      "quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
        "strategy": "tensor", "symmetric": true, "dynamic": false}}},
      "ignore": ["lm_head", "re:.*mlp\\.gate$"]}})"),
                                     "c");
  EXPECT_EQ(q.fp8_strategy, Fp8ScaleStrategy::kTensor);
  EXPECT_TRUE(q.ignores("lm_head"));
  EXPECT_TRUE(q.ignores("model.layers.3.mlp.gate"));
  EXPECT_FALSE(q.ignores("model.layers.3.mlp.gate_proj"));
}

TEST(QuantConfig, UnsupportedConfigsAreNamed) {
  auto parse = [](const char* qc) {
    return parse_quant_config(parse_error_config(json::parse(qc)), "cfg.json");
  };
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "bitsandbytes"})"),
                   "quant_method 'bitsandbytes' is not supported");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "gptq", "bits": 8, "group_size": 128})"),
                   "gptq with bits 8 is not supported");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "gptq", "bits": 4, "desc_act": true})"),
                   "desc_act true (act-order) is not supported");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "gptq", "checkpoint_format": "marlin"})"),
                   "checkpoint_format 'marlin' is not supported");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "awq", "bits": 4, "version": "gemv"})"),
                   "awq version 'gemv' is not supported");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "awq", "bits": 4, "zero_point": false})"),
                   "zero_point false");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "awq", "bits": 3})"), "awq with bits 3");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "fp8", "activation_scheme": "static",
                             "weight_block_size": [128, 128]})"),
                   "activation_scheme 'static' is not supported");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "fp8", "activation_scheme": "dynamic"})"),
                   "without weight_block_size");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "fp8", "weight_block_size": [128, 0]})"),
                   "weight_block_size must be two positive integers");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
                             "config_groups": {}})"),
                   "format 'pack-quantized' is not supported");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
        "strategy": "channel"}, "input_activations": {"num_bits": 8, "type": "float",
        "dynamic": false, "strategy": "tensor"}}}})"),
                   "static input activation scales are not supported");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
        "strategy": "group"}}}})"),
                   "weights strategy 'group' is not supported");
  EXPECT_ERROR_HAS(parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
        "strategy": "channel"}}}, "ignore": ["re:("]})"),
                   "is not a valid regex");
  EXPECT_ERROR_HAS(parse(R"([1, 2])"), "quantization_config must be an object");
}

TEST(Fp8E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = fp8e4m3_to_f32(uint8_t(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    // The value the E4M3 description gives, computed from its fields.
    const int e = (c >> 3) & 0xf, m = c & 7;
    const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
    EXPECT_EQ(double(v), (c & 0x80) ? -mag : mag) << c;
    // -0 encodes as 0x80.
    EXPECT_EQ(f32_to_fp8e4m3(v), c) << c;
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_fp8e4m3(1e6f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_fp8e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(std::nanf("")), 0x7f);
  // Halfway between 1 and 1.125 rounds to even (1); just above it rounds up.
  EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(1.0625f)), 1.0f);
  EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(1.07f)), 1.125f);
  // Every float maps to a nearest code: |x - dq(q(x))| <= half the spacing of x's binade.
  for (float x = -500; x <= 500; x += 0.0173f) {
    const float a = std::min(std::fabs(x), 448.0f);
    const float dq = std::fabs(fp8e4m3_to_f32(f32_to_fp8e4m3(x)));
    const float spacing =
        a < std::ldexp(1.0f, -6) ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, std::ilogb(a) - 3);
    EXPECT_LE(std::fabs(a - dq), spacing / 2) << x;
  }
}

// ---- A plain decoding of each layout, written from the format descriptions. ----

// One module's tensors from the file: the weight (packed or FP8), scales in f32, zeros, g_idx.
struct Packed {
  Tensor w, s, z, g;
};

Packed packed(SafetensorsFile& f, const std::string& m, const QuantConfig& q) {
  Packed p;
  switch (q.method) {
    case QuantMethod::kFp8Block:
      p.w = f.get(m + ".weight");
      p.s = f.get(m + ".weight_scale_inv").to_dtype(DType::kF32);
      break;
    case QuantMethod::kCompressedFp8:
      p.w = f.get(m + ".weight");
      p.s = f.get(m + ".weight_scale").to_dtype(DType::kF32);
      break;
    case QuantMethod::kAwq:
    case QuantMethod::kGptq:
      p.w = f.get(m + ".qweight");
      p.z = f.get(m + ".qzeros");
      p.s = f.get(m + ".scales").to_dtype(DType::kF32);
      if (q.method == QuantMethod::kGptq) p.g = f.get(m + ".g_idx");
      break;
    case QuantMethod::kNone:
      break;
  }
  return p;
}

// Nibble n (bits 4n..4n+3) of int32 element i.
int nibble(const Tensor& t, int64_t i, int n) {
  return int((std::bit_cast<uint32_t>(t.data<int32_t>()[i]) >> (4 * n)) & 0xf);
}

// The scale that applies to W[o][i].
float scale_of(const Packed& p, const QuantConfig& q, int64_t o, int64_t i, int64_t out,
               int64_t in) {
  const float* s = p.s.data<float>();
  switch (q.method) {
    case QuantMethod::kFp8Block:
      return s[(o / q.block_out) * ((in + q.block_in - 1) / q.block_in) + i / q.block_in];
    case QuantMethod::kCompressedFp8:
      return s[o];
    case QuantMethod::kAwq:
      return s[(i / q.group_size) * out + o];
    case QuantMethod::kGptq:
      return s[p.g.data<int32_t>()[i] * out + o];
    case QuantMethod::kNone:
      break;
  }
  return NAN;
}

// W[o][i] of a quantized module, from the file's raw tensors.
float reference_weight(const Packed& p, const QuantConfig& q, int64_t o, int64_t i, int64_t out,
                       int64_t in) {
  const float scale = scale_of(p, q, o, i, out, in);
  switch (q.method) {
    case QuantMethod::kFp8Block:
    case QuantMethod::kCompressedFp8:
      return fp8e4m3_to_f32(p.w.data<uint8_t>()[o * in + i]) * scale;
    case QuantMethod::kAwq: {
      // Word (i, o/8) holds columns o/8*8 + {0,2,4,6,1,3,5,7} in nibbles 0..7.
      const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
      int n = 0;
      while (order[n] != o % 8) ++n;
      const int64_t g = i / q.group_size;
      const int qv = nibble(p.w, i * (out / 8) + o / 8, n);
      const int zv = nibble(p.z, g * (out / 8) + o / 8, n);
      return float(qv - zv) * scale;
    }
    case QuantMethod::kGptq: {
      const int64_t g = p.g.data<int32_t>()[i];
      const int qv = nibble(p.w, (i / 8) * out + o, int(i % 8));
      const int zv =
          nibble(p.z, g * (out / 8) + o / 8, int(o % 8)) + (q.gptq_zero_minus_one ? 1 : 0);
      return float(qv - zv) * scale;
    }
    case QuantMethod::kNone:
      break;
  }
  return NAN;
}

struct FormatCase {
  const char* name;
  QuantConfig q;
};

std::vector<FormatCase> format_cases() {
  std::vector<FormatCase> v;
  QuantConfig q;
  q.method = QuantMethod::kFp8Block;
  q.bits = 8;
  q.block_out = q.block_in = 128;
  v.push_back({"fp8_block", q});
  q = QuantConfig();
  q.method = QuantMethod::kCompressedFp8;
  q.bits = 8;
  q.ignore = {"lm_head"};
  v.push_back({"ct_fp8_channel", q});
  q = QuantConfig();
  q.method = QuantMethod::kAwq;
  q.bits = 4;
  q.group_size = 128;
  v.push_back({"awq", q});
  q = QuantConfig();
  q.method = QuantMethod::kGptq;
  q.bits = 4;
  q.group_size = 128;
  q.symmetric = true;
  q.gptq_zero_minus_one = true;
  v.push_back({"gptq_sym", q});
  q.symmetric = false;
  v.push_back({"gptq_asym", q});
  q.gptq_zero_minus_one = false;
  v.push_back({"gptq_asym_v2", q});
  return v;
}

class QuantizedFixture : public ::testing::TestWithParam<FormatCase> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("longctx_quant_" + std::to_string(::getpid()) + "_" + GetParam().name);
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// The tool's output loads with its Linears packed and no dense copy of them (the checkpoint's
// dense store holds exactly the original's other tensors); each Linear through dense_weight()
// equals the plain decoding of the file's packed tensors (rounded once to bf16) bit for bit, and
// lies within the RTN bound of the original weight.
TEST_P(QuantizedFixture, LoaderMatchesPlainDecodingAndTheOriginal) {
  for (const char* model : {"tiny-qwen3", "tiny-llama3"}) {
    QuantConfig q = GetParam().q;
    // tiny-llama3's MLP is 352 wide: groups of 32 (and 128-row FP8 blocks it ends inside).
    if (q.group_size && std::string(model) == "tiny-llama3") q.group_size = 32;
    fs::remove_all(dir_);
    const QuantizeStats stats = quantize_checkpoint(fixture(model), dir_.string(), q);
    EXPECT_GT(stats.quantized_tensors, 0);
    Checkpoint dense = load_checkpoint(fixture(model));
    Checkpoint ck = load_checkpoint(dir_.string());
    EXPECT_EQ(ck.config.quantization.method, q.method);
    EXPECT_EQ(int64_t(ck.quantized.size()), stats.quantized_tensors);
    // Every Linear of the decoder layers is quantized, nothing else.
    int64_t linears = 0;
    for (const auto& [name, t] : dense.weights.all())
      if (name.find(".layers.") != std::string::npos && name.ends_with("_proj.weight")) {
        ++linears;
        EXPECT_TRUE(ck.quantized.count(name)) << name;
      }
    EXPECT_EQ(linears, stats.quantized_tensors);
    // Loading made no dense copy of a quantized Linear (an eager dequantization would put them
    // here): the dense store is the original's other tensors, byte for byte the same count.
    size_t other_bytes = 0;
    for (const auto& [name, t] : dense.weights.all())
      if (!ck.quantized.count(name)) other_bytes += t.nbytes();
    EXPECT_EQ(ck.weights.num_bytes(), other_bytes) << model;
    EXPECT_EQ(ck.weights.all().size() + ck.quantized.size(), dense.weights.all().size()) << model;
    int64_t packed_bytes = 0;
    for (const auto& [name, qw] : ck.quantized) {
      EXPECT_FALSE(ck.weights.has(name)) << name;
      EXPECT_TRUE(ck.has_weight(name)) << name;
      packed_bytes += quantized_bytes(qw);
      EXPECT_EQ(quantized_bytes(qw), quantized_bytes(qw.out_features, qw.in_features, q)) << name;
    }
    EXPECT_EQ(size_t(packed_bytes) + other_bytes, stats.bytes_out) << model;
    EXPECT_TRUE(fs::exists(dir_ / "generation_config.json"));
    auto file = SafetensorsFile::open((dir_ / "model.safetensors").string());
    for (const auto& [name, qw] : ck.quantized) {
      const std::string m = name.substr(0, name.size() - 7);
      const Tensor got = ck.dense_weight(name);
      ASSERT_EQ(got.dtype(), DType::kBF16);
      const Tensor orig = dense.weights.get(name).to_dtype(DType::kF32);
      const Packed p = packed(*file, m, q);
      const int64_t out = got.size(0), in = got.size(1);
      double worst = 0;
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          const float ref = reference_weight(p, q, o, i, out, in);
          const uint16_t g = got.data<uint16_t>()[o * in + i];
          ASSERT_EQ(g, f32_to_bf16(ref)) << model << " " << name << " [" << o << ", " << i << "]";
          // RTN error: FP8 keeps 3 mantissa bits (relative 2^-4, plus the subnormal spacing of
          // the scale); int4 is within one step of its group (a clamped end value).
          const float w = orig.data<float>()[o * in + i];
          const double err = std::fabs(double(bf16_to_f32(g)) - w);
          const double scale = scale_of(p, q, o, i, out, in);
          double bound = q.method == QuantMethod::kAwq || q.method == QuantMethod::kGptq
                             ? scale
                             : std::fabs(w) * 0.0625 + scale * 0.002;
          bound += std::fabs(w) * 0.0079;  // the bf16 rounding of the result
          worst = std::max(worst, err / std::max(bound, 1e-30));
          ASSERT_LE(err, bound + 1e-7) << model << " " << name << " [" << o << ", " << i << "]";
        }
      EXPECT_GT(worst, 0.0) << name << ": nothing was rounded?";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedFixture, ::testing::ValuesIn(format_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Phi-3's fused qkv_proj and gate_up_proj quantized: loaded split into q, k, v and gate, up in
// the format's own layout (no dense copy), each part through dense_weight() bit for bit the rows
// of the whole projection dequantized. FP8 blocks of 128 rows end inside tiny-phi3's 64-row q
// (its qkv_proj is then dequantized whole, its parts row views of that copy); gate_up splits.
TEST(QuantizedFused, Phi3ProjectionsSplitPacked) {
  const fs::path dir = fs::temp_directory_path() / ("longctx_qphi3_" + std::to_string(getpid()));
  for (const auto& [fname, format] : quant_format_names())
    for (const int64_t block : {32, 128}) {
      if (block == 128 && format != QuantFormat::kFp8Block) continue;
      SCOPED_TRACE(fname + " block " + std::to_string(block));
      QuantFormatOptions f;
      f.format = format;
      f.group_size = 32;
      f.block_size = block;
      const QuantConfig q = quant_config_for(f);
      fs::remove_all(dir);
      quantize_checkpoint(fixture("tiny-phi3-longrope"), dir.string(), q);
      const Checkpoint ck = load_checkpoint(dir.string());
      // The fused projections as the file holds them, dequantized whole.
      WeightStore raw;
      auto file = SafetensorsFile::open((dir / "model.safetensors").string());
      for (const auto& n : file->names()) raw.add(n, file->get(n));
      std::map<std::string, QuantizedWeight> fused;
      extract_quantized(raw, q, fused, "test");
      const bool qkv_splits = format != QuantFormat::kFp8Block || block == 32;
      for (int layer = 0; layer < 2; ++layer) {
        const std::string p = "model.layers." + std::to_string(layer) + ".";
        for (const auto& [whole, parts] :
             std::vector<std::pair<std::string, std::vector<std::string>>>{
                 {"self_attn.qkv_proj.weight",
                  {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                   "self_attn.v_proj.weight"}},
                 {"mlp.gate_up_proj.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight"}}}) {
          const Tensor all = dequantize(fused.at(p + whole), q, DType::kBF16);
          const bool packed = qkv_splits || whole.starts_with("mlp.");
          int64_t row = 0;
          for (const std::string& part : parts) {
            EXPECT_EQ(ck.quantized.count(p + part), packed ? 1u : 0u) << part;
            EXPECT_EQ(ck.weights.has(p + part), !packed) << part;
            const Tensor got = ck.dense_weight(p + part);
            const Tensor want = all.slice(0, row, row + got.size(0)).contiguous();
            ASSERT_EQ(got.shape(), want.shape()) << part;
            EXPECT_EQ(std::memcmp(got.contiguous().data_ptr(), want.data_ptr(), want.nbytes()), 0)
                << p + part;
            row += got.size(0);
          }
          EXPECT_EQ(row, all.size(0)) << whole;
        }
      }
    }
  fs::remove_all(dir);
}

// slice_quantized (the inverse of stack_quantized) splits where the format allows, views FP8
// rows in place, and refuses a split inside a scale block or an int4 word.
TEST(QuantizedFused, SliceWhereTheFormatAllows) {
  for (const auto& [name, format] : quant_format_names()) {
    QuantFormatOptions f;
    f.format = format;
    f.group_size = 32;
    f.block_size = 32;
    const QuantConfig q = quant_config_for(f);
    const QuantizedWeight w = random_quantized(96, 64, q, 3, 0.02f, name);
    const Tensor all = dequantize(w, q, DType::kF32);
    const QuantizedWeight s = slice_quantized(w, q, 32, 64);
    ASSERT_EQ(s.method, q.method) << name;
    const Tensor got = dequantize(s, q, DType::kF32);
    const Tensor want = all.slice(0, 32, 96).contiguous();
    EXPECT_EQ(std::memcmp(got.data_ptr(), want.data_ptr(), want.nbytes()), 0) << name;
    const bool fp8 = format == QuantFormat::kFp8Block || format == QuantFormat::kCtFp8Channel;
    if (fp8) EXPECT_EQ(s.qweight.data_ptr(), w.qweight.slice(0, 32, 96).data_ptr()) << name;
    // Inside an FP8 block of 32 rows / an int4 word of 8 columns; per-channel scales split
    // anywhere.
    EXPECT_EQ(slice_quantized(w, q, 4, 32).method,
              format == QuantFormat::kCtFp8Channel ? q.method : QuantMethod::kNone)
        << name;
  }
}

// ---- Bad tensors: a quantized copy of tiny-qwen3 broken one way per test. ----

// Writes a safetensors file of any dtypes.
void write_file(const fs::path& path, const std::map<std::string, Tensor>& tensors) {
  const std::map<DType, const char*> names = {{DType::kF32, "F32"},
                                              {DType::kBF16, "BF16"},
                                              {DType::kF16, "F16"},
                                              {DType::kI32, "I32"},
                                              {DType::kFP8E4M3, "F8_E4M3"}};
  json header = json::object();
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", names.at(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (const auto& [name, t] : tensors) {
    Tensor c = t.contiguous();
    f.write(static_cast<const char*>(c.data_ptr()), std::streamsize(c.nbytes()));
  }
}

class BrokenQuantized : public ::testing::Test {
 protected:
  void make(QuantMethod method) {
    dir_ = fs::temp_directory_path() / ("longctx_badquant_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    for (const auto& c : format_cases())
      if (c.q.method == method) {
        quantize_checkpoint(fixture("tiny-qwen3"), dir_.string(), c.q);
        break;
      }
    auto f = SafetensorsFile::open((dir_ / "model.safetensors").string());
    tensors_.clear();
    // Copies: the file is rewritten under its mapping.
    for (const auto& n : f->names()) {
      Tensor t = f->get(n);
      tensors_[n] = Tensor::empty(t.shape(), t.dtype());
      tensors_[n].copy_from(t);
    }
    config_ = json::parse(std::ifstream(dir_ / "config.json"));
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string load_error() {
    write_file(dir_ / "model.safetensors", tensors_);
    std::ofstream(dir_ / "config.json") << config_.dump(2);
    return error_of([&] { load_checkpoint(dir_.string()); });
  }
  fs::path dir_;
  std::map<std::string, Tensor> tensors_;
  json config_;
  const std::string q_ = "model.layers.1.self_attn.q_proj";
};

TEST_F(BrokenQuantized, AwqMissingScales) {
  make(QuantMethod::kAwq);
  tensors_.erase(q_ + ".scales");
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor '" + q_ + ".scales' is missing"), std::string::npos) << e;
}

TEST_F(BrokenQuantized, AwqZerosOfTheWrongShape) {
  make(QuantMethod::kAwq);
  tensors_[q_ + ".qzeros"] = Tensor::zeros({2, 32}, DType::kI32);
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor '" + q_ + ".qzeros' has shape [2, 32], expected [1, 32]"),
            std::string::npos)
      << e;
}

TEST_F(BrokenQuantized, GroupSizeThatDoesNotDivide) {
  make(QuantMethod::kGptq);
  config_["quantization_config"]["group_size"] = 256;
  const std::string e = load_error();
  EXPECT_NE(
      e.find("'model.layers.0.mlp.down_proj': group_size 256 does not divide in_features 384"),
      std::string::npos)
      << e;
}

TEST_F(BrokenQuantized, GptqScalesOfTheWrongShapeAndDtype) {
  make(QuantMethod::kGptq);
  tensors_[q_ + ".scales"] = Tensor::zeros({1, 128}, DType::kF16);
  std::string e = load_error();
  EXPECT_NE(e.find("tensor '" + q_ + ".scales' has shape [1, 128], expected [1, 256]"),
            std::string::npos)
      << e;
  tensors_[q_ + ".scales"] = Tensor::zeros({1, 256}, DType::kI32);
  e = load_error();
  EXPECT_NE(e.find("tensor '" + q_ + ".scales' is i32, expected float"), std::string::npos) << e;
}

TEST_F(BrokenQuantized, GptqActOrderGroupIndex) {
  make(QuantMethod::kGptq);
  // An act-order checkpoint's g_idx (input 5 in another group) under desc_act false.
  tensors_[q_ + ".g_idx"].data<int32_t>()[5] = 1;
  const std::string e = load_error();
  EXPECT_NE(e.find("'" + q_ + ".g_idx' maps input 5 to group 1, not 0"), std::string::npos) << e;
  EXPECT_NE(e.find("act-order"), std::string::npos) << e;
}

TEST_F(BrokenQuantized, Fp8BlockScalesOfTheWrongShape) {
  make(QuantMethod::kFp8Block);
  tensors_[q_ + ".weight_scale_inv"] = Tensor::zeros({1, 1}, DType::kF32);
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor '" + q_ + ".weight_scale_inv' has shape [1, 1], expected [2, 1]"),
            std::string::npos)
      << e;
}

TEST_F(BrokenQuantized, CompressedTensorsMissingScaleAndIgnoredLayer) {
  make(QuantMethod::kCompressedFp8);
  Tensor s = tensors_[q_ + ".weight_scale"];
  tensors_.erase(q_ + ".weight_scale");
  std::string e = load_error();
  EXPECT_NE(e.find("tensor '" + q_ + ".weight_scale' is missing"), std::string::npos) << e;
  tensors_[q_ + ".weight_scale"] = s;
  config_["quantization_config"]["ignore"].push_back(q_);
  e = load_error();
  EXPECT_NE(e.find("ignore list names layer '" + q_ + "'"), std::string::npos) << e;
}

TEST_F(BrokenQuantized, PackedTensorsUnderAnotherConfig) {
  make(QuantMethod::kAwq);
  config_.erase("quantization_config");
  std::string e = load_error();
  EXPECT_NE(e.find("packed int4 weight but config.json's quantization_config is 'none'"),
            std::string::npos)
      << e;
  make(QuantMethod::kFp8Block);
  config_["quantization_config"] = json::parse(R"({"quant_method": "awq", "bits": 4})");
  e = load_error();
  EXPECT_NE(e.find("is F8_E4M3 but config.json's quantization_config is 'awq'"), std::string::npos)
      << e;
}

// A packed Linear whose tensors agree with each other but not with the config's shape: the
// error names the packed tensor, its shape and the config's.
TEST_F(BrokenQuantized, PackedShapeTheConfigDoesNotImply) {
  for (const QuantMethod method : {QuantMethod::kAwq, QuantMethod::kFp8Block}) {
    make(method);
    const QuantConfig q = parse_quant_config(config_, "test");
    Tensor wrong = Tensor::zeros({128, 128}, DType::kF32);  // q_proj is [256, 128]
    for (int64_t i = 0; i < wrong.numel(); ++i) wrong.data<float>()[i] = 0.01f * float(i % 7);
    for (auto& [n, t] : quantized_tensors(q_, quantize_rtn(wrong, q, q_))) tensors_[n] = t;
    const std::string e = load_error();
    const std::string packed = q_ + (method == QuantMethod::kAwq ? ".qweight" : ".weight");
    EXPECT_NE(e.find("tensor '" + packed + "' holds a"), std::string::npos) << e;
    EXPECT_NE(
        e.find("of shape [128, 128] but the config implies [256, 128] for '" + q_ + ".weight'"),
        std::string::npos)
        << e;
  }
}

TEST_F(BrokenQuantized, DenseWeightBesidePackedOnes) {
  make(QuantMethod::kGptq);
  tensors_[q_ + ".weight"] = Tensor::zeros({256, 128}, DType::kBF16);
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor '" + q_ + ".weight' is a dense weight beside the packed tensors"),
            std::string::npos)
      << e;
}

TEST_F(BrokenQuantized, MissingPackedWeight) {
  make(QuantMethod::kGptq);
  for (const char* s : {".qweight", ".qzeros", ".scales", ".g_idx"}) tensors_.erase(q_ + s);
  const std::string e = load_error();
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  EXPECT_NE(e.find(q_ + ".weight"), std::string::npos) << e;
}

TEST(QuantizeTool, RefusesBadInputs) {
  const fs::path dir = fs::temp_directory_path() / ("longctx_qtool_" + std::to_string(getpid()));
  fs::remove_all(dir);
  QuantConfig q;
  q.method = QuantMethod::kAwq;
  q.bits = 4;
  q.group_size = 100;  // does not divide 128
  EXPECT_ERROR_HAS(quantize_checkpoint(fixture("tiny-qwen3"), dir.string(), q),
                   "does not fit awq with group_size 100");
  q.group_size = 128;
  quantize_checkpoint(fixture("tiny-qwen3"), dir.string(), q);
  const fs::path again = dir.string() + "_again";
  EXPECT_ERROR_HAS(quantize_checkpoint(dir.string(), again.string(), q), "already quantized");
  EXPECT_ERROR_HAS(quantize_checkpoint(fixture("tiny-qwen3"), dir.string(), q),
                   "exists and is not an empty folder");
  fs::remove_all(dir);
  fs::remove_all(again);
}

}  // namespace

namespace longctx {
namespace {

// stack_quantized (q/k/v and gate/up kept packed as one projection): in every format the stacked
// weight dequantizes to the parts' dequantized rows one above the other; what a format cannot
// stack (per-tensor FP8 scales, an FP8 block a part ends inside) comes back as kNone.
TEST(StackQuantized, DequantizesToTheStackedRows) {
  for (const auto& [name, format] : quant_format_names()) {
    QuantFormatOptions f;
    f.format = format;
    f.group_size = 32;
    f.block_size = 32;
    const QuantConfig q = quant_config_for(f);
    const std::vector<int64_t> outs = {64, 32, 96};
    std::vector<QuantizedWeight> parts;
    for (size_t i = 0; i < outs.size(); ++i)
      parts.push_back(random_quantized(outs[i], 128, q, 100 + i, 0.02f, name));
    const QuantizedWeight s = stack_quantized(parts, q);
    ASSERT_EQ(s.method, q.method) << name;
    EXPECT_EQ(s.out_features, 192) << name;
    EXPECT_EQ(s.in_features, 128) << name;
    const Tensor all = dequantize(s, q, DType::kF32);
    int64_t row = 0;
    for (const QuantizedWeight& p : parts) {
      const Tensor want = dequantize(p, q, DType::kF32);
      const Tensor got = all.slice(0, row, row + p.out_features).contiguous();
      ASSERT_EQ(std::memcmp(want.data_ptr(), got.data_ptr(), want.nbytes()), 0)
          << name << " part at row " << row;
      row += p.out_features;
    }
    EXPECT_EQ(stack_quantized({parts[1]}, q).qweight.data_ptr(), parts[1].qweight.data_ptr());
  }
  QuantFormatOptions f;
  f.format = QuantFormat::kFp8Block;
  f.block_size = 64;
  const QuantConfig blocks = quant_config_for(f);
  // A 32-row part ends inside a 64-row scale block: not stackable; as the last part it is.
  EXPECT_EQ(stack_quantized({random_quantized(32, 128, blocks, 1, 0.02f, "a"),
                             random_quantized(64, 128, blocks, 2, 0.02f, "b")},
                            blocks)
                .method,
            QuantMethod::kNone);
  EXPECT_EQ(stack_quantized({random_quantized(64, 128, blocks, 1, 0.02f, "a"),
                             random_quantized(32, 128, blocks, 2, 0.02f, "b")},
                            blocks)
                .method,
            QuantMethod::kFp8Block);
  QuantConfig tensor = quant_config_for({QuantFormat::kCtFp8Channel});
  tensor.fp8_strategy = Fp8ScaleStrategy::kTensor;
  EXPECT_EQ(stack_quantized({random_quantized(64, 128, tensor, 1, 0.02f, "a"),
                             random_quantized(64, 128, tensor, 2, 0.02f, "b")},
                            tensor)
                .method,
            QuantMethod::kNone);
}

// The memory plan and `longctx info` count packed bytes without allocating them.
TEST(StackQuantized, QuantizedBytesMatchTheLayout) {
  for (const auto& [name, format] : quant_format_names()) {
    const QuantConfig q = quant_config_for({format});
    const QuantizedWeight w = quantized_layout(384, 512, q, name);
    int64_t bytes = 0;
    for (const Tensor* t : {&w.qweight, &w.scales, &w.qzeros, &w.g_idx})
      if (t->defined()) bytes += int64_t(t->nbytes());
    EXPECT_EQ(quantized_bytes(384, 512, q), bytes) << name;
  }
}

}  // namespace
}  // namespace longctx
