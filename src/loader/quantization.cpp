// quantization_config -> QuantConfig. Every string is compared here, once; the rest of the engine
// switches on QuantMethod.
#include "longctx/loader/quantization.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>

#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"

namespace longctx {

using nlohmann::json;

const char* quant_method_name(QuantMethod method) {
  switch (method) {
    case QuantMethod::kNone:
      return "none";
    case QuantMethod::kFp8Block:
      return "fp8";
    case QuantMethod::kCompressedFp8:
      return "compressed-tensors";
    case QuantMethod::kAwq:
      return "awq";
    case QuantMethod::kGptq:
      return "gptq";
  }
  return "?";
}

bool QuantConfig::ignores(const std::string& module) const {
  for (const std::string& pattern : ignore) {
    if (pattern.starts_with("re:")) {
      // Patterns were compiled once at parse time, so a bad one has already been reported.
      if (std::regex_match(module, std::regex(pattern.substr(3)))) return true;
    } else if (pattern == module) {
      return true;
    }
  }
  return false;
}

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A string field, lowercased; `dflt` when absent or null.
std::string opt_string(const json& j, const char* key, const std::string& dflt,
                       const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  LONGCTX_CHECK(j[key].is_string(), ErrorCode::kInvalidArgument,
                "{}: quantization_config field '{}' must be a string, got {}", where, key,
                json_excerpt(j[key]));
  return lower(j[key].get<std::string>());
}

int64_t opt_int(const json& j, const char* key, int64_t dflt, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  LONGCTX_CHECK(j[key].is_number_integer(), ErrorCode::kInvalidArgument,
                "{}: quantization_config field '{}' must be an integer, got {}", where, key,
                json_excerpt(j[key]));
  return j[key].get<int64_t>();
}

bool opt_bool(const json& j, const char* key, bool dflt, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  LONGCTX_CHECK(j[key].is_boolean(), ErrorCode::kInvalidArgument,
                "{}: quantization_config field '{}' must be true or false, got {}", where, key,
                json_excerpt(j[key]));
  return j[key].get<bool>();
}

// The first of `keys` present (AWQ's configs spell bits `w_bit` and group_size `q_group_size`).
const char* pick(const json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (j.contains(k) && !j[k].is_null()) return k;
  return *keys.begin();
}

constexpr size_t kMaxPatternChars = 256;

void add_ignore_list(const json& j, const char* key, QuantConfig& q, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return;
  LONGCTX_CHECK(j[key].is_array(), ErrorCode::kInvalidArgument,
                "{}: quantization_config field '{}' must be a list of layer names, got {}", where,
                key, json_excerpt(j[key]));
  for (const auto& v : j[key]) {
    LONGCTX_CHECK(v.is_string(), ErrorCode::kInvalidArgument,
                  "{}: quantization_config '{}' entries must be strings, got {}", where, key,
                  json_excerpt(v));
    std::string s = v.get<std::string>();
    if (s.starts_with("re:")) {
      // std::regex recurses on the pattern's structure: a short limit keeps a hostile
      // config.json from exhausting the stack (real patterns are a few dozen characters).
      LONGCTX_CHECK(s.size() <= kMaxPatternChars, ErrorCode::kInvalidArgument,
                    "{}: quantization_config '{}' entry of {} characters is too long (at most {})",
                    where, key, s.size(), kMaxPatternChars);
      try {
        std::regex r(s.substr(3));
      } catch (const std::regex_error& e) {
        LONGCTX_THROW(ErrorCode::kInvalidArgument,
                      "{}: quantization_config '{}' entry '{}' is not a valid regex: {}", where,
                      key, s, e.what());
      }
    }
    q.ignore.push_back(std::move(s));
  }
}

void require_4_bits(const QuantConfig& q, const std::string& where) {
  LONGCTX_CHECK(q.bits == 4, ErrorCode::kUnsupported,
                "{}: {} with bits {} is not supported (4 bits only)", where,
                quant_method_name(q.method), q.bits);
}

void parse_fp8_block(const json& j, QuantConfig& q, const std::string& where) {
  q.method = QuantMethod::kFp8Block;
  q.bits = 8;
  const std::string fmt = opt_string(j, "fmt", "e4m3", where);
  LONGCTX_CHECK(fmt == "e4m3", ErrorCode::kUnsupported,
                "{}: fp8 fmt '{}' is not supported (e4m3 only)", where, fmt);
  const std::string act = opt_string(j, "activation_scheme", "dynamic", where);
  LONGCTX_CHECK(act == "dynamic", ErrorCode::kUnsupported,
                "{}: fp8 activation_scheme '{}' is not supported (dynamic only)", where, act);
  LONGCTX_CHECK(j.contains("weight_block_size") && !j["weight_block_size"].is_null(),
                ErrorCode::kUnsupported,
                "{}: fp8 without weight_block_size (per-tensor FP8 scales) is not supported; "
                "block-wise FP8 ([128, 128] blocks) and compressed-tensors FP8 are",
                where);
  const json& b = j["weight_block_size"];
  LONGCTX_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() &&
                    b[1].is_number_integer() && b[0].get<int64_t>() > 0 && b[1].get<int64_t>() > 0,
                ErrorCode::kInvalidArgument,
                "{}: fp8 weight_block_size must be two positive integers, got {}", where,
                json_excerpt(b));
  q.block_out = b[0].get<int64_t>();
  q.block_in = b[1].get<int64_t>();
  add_ignore_list(j, "ignored_layers", q, where);
  add_ignore_list(j, "modules_to_not_convert", q, where);
}

void parse_compressed_tensors(const json& j, QuantConfig& q, const std::string& where) {
  q.method = QuantMethod::kCompressedFp8;
  q.bits = 8;
  const std::string format = opt_string(j, "format", "", where);
  LONGCTX_CHECK(format == "float-quantized", ErrorCode::kUnsupported,
                "{}: compressed-tensors format '{}' is not supported (float-quantized FP8 only)",
                where, format);
  LONGCTX_CHECK(j.contains("config_groups") && j["config_groups"].is_object() &&
                    j["config_groups"].size() == 1,
                ErrorCode::kUnsupported,
                "{}: compressed-tensors needs exactly one entry in config_groups, got {}", where,
                j.contains("config_groups") ? json_excerpt(j["config_groups"]) : "none");
  const json& g = j["config_groups"].begin().value();
  const std::string gw = where + " config_groups." + j["config_groups"].begin().key();
  LONGCTX_CHECK(
      g.is_object() && g.contains("targets") && g["targets"].is_array() &&
          std::find(g["targets"].begin(), g["targets"].end(), json("Linear")) != g["targets"].end(),
      ErrorCode::kUnsupported, "{}: targets must include \"Linear\"", gw);
  LONGCTX_CHECK(g.contains("weights") && g["weights"].is_object(), ErrorCode::kInvalidArgument,
                "{}: 'weights' (an object) is missing", gw);
  const json& w = g["weights"];
  const int64_t bits = opt_int(w, "num_bits", 0, gw);
  const std::string type = opt_string(w, "type", "", gw);
  LONGCTX_CHECK(bits == 8 && type == "float", ErrorCode::kUnsupported,
                "{}: weights of {} bits of type '{}' are not supported (8-bit float only)", gw,
                bits, type);
  const std::string strategy = opt_string(w, "strategy", "", gw);
  if (strategy == "channel")
    q.fp8_strategy = Fp8ScaleStrategy::kChannel;
  else if (strategy == "tensor")
    q.fp8_strategy = Fp8ScaleStrategy::kTensor;
  else
    LONGCTX_THROW(ErrorCode::kUnsupported,
                  "{}: weights strategy '{}' is not supported (channel or tensor)", gw, strategy);
  LONGCTX_CHECK(opt_bool(w, "symmetric", true, gw) && !opt_bool(w, "dynamic", false, gw),
                ErrorCode::kUnsupported,
                "{}: FP8 weights must be symmetric with static (stored) scales", gw);
  if (g.contains("input_activations") && !g["input_activations"].is_null()) {
    const json& a = g["input_activations"];
    LONGCTX_CHECK(a.is_object(), ErrorCode::kInvalidArgument,
                  "{}: input_activations must be an object", gw);
    LONGCTX_CHECK(opt_bool(a, "dynamic", false, gw), ErrorCode::kUnsupported,
                  "{}: static input activation scales are not supported (dynamic only)", gw);
    const std::string as = opt_string(a, "strategy", "token", gw);
    LONGCTX_CHECK(as == "token" || as == "tensor", ErrorCode::kUnsupported,
                  "{}: input activation strategy '{}' is not supported (token)", gw, as);
  }
  add_ignore_list(j, "ignore", q, where);
}

void parse_awq(const json& j, QuantConfig& q, const std::string& where) {
  q.method = QuantMethod::kAwq;
  q.bits = static_cast<int>(opt_int(j, pick(j, {"bits", "w_bit"}), 4, where));
  require_4_bits(q, where);
  q.group_size = opt_int(j, pick(j, {"group_size", "q_group_size"}), 128, where);
  LONGCTX_CHECK(q.group_size > 0, ErrorCode::kUnsupported,
                "{}: awq group_size {} is not supported (a positive group size)", where,
                q.group_size);
  LONGCTX_CHECK(opt_bool(j, "zero_point", true, where), ErrorCode::kUnsupported,
                "{}: awq without zero points (zero_point false) is not supported", where);
  const std::string version = opt_string(j, "version", "gemm", where);
  LONGCTX_CHECK(version == "gemm", ErrorCode::kUnsupported,
                "{}: awq version '{}' is not supported (the GEMM layout only)", where, version);
  add_ignore_list(j, "modules_to_not_convert", q, where);
}

void parse_gptq(const json& j, QuantConfig& q, const std::string& where) {
  q.method = QuantMethod::kGptq;
  q.bits = static_cast<int>(opt_int(j, "bits", 4, where));
  require_4_bits(q, where);
  const int64_t g = opt_int(j, "group_size", 128, where);
  LONGCTX_CHECK(g > 0 || g == -1, ErrorCode::kUnsupported,
                "{}: gptq group_size {} is not supported (positive, or -1 for one group)", where,
                g);
  q.group_size = g == -1 ? 0 : g;
  LONGCTX_CHECK(!opt_bool(j, "desc_act", false, where), ErrorCode::kUnsupported,
                "{}: gptq desc_act true (act-order) is not supported (desc_act false only)", where);
  LONGCTX_CHECK(!opt_bool(j, "is_marlin_format", false, where), ErrorCode::kUnsupported,
                "{}: gptq is_marlin_format true is not supported (the GPTQ layout only)", where);
  q.symmetric = opt_bool(j, "sym", true, where);
  const std::string format = opt_string(j, pick(j, {"checkpoint_format", "format"}), "gptq", where);
  if (format == "gptq")
    q.gptq_zero_minus_one = true;
  else if (format == "gptq_v2")
    q.gptq_zero_minus_one = false;
  else
    LONGCTX_THROW(ErrorCode::kUnsupported,
                  "{}: gptq checkpoint_format '{}' is not supported (gptq or gptq_v2)", where,
                  format);
  add_ignore_list(j, "modules_to_not_convert", q, where);
}

}  // namespace

QuantConfig parse_quant_config(const json& config, const std::string& source) {
  QuantConfig q;
  if (!config.contains("quantization_config") || config["quantization_config"].is_null()) return q;
  const json& j = config["quantization_config"];
  const std::string where = source + " quantization_config";
  LONGCTX_CHECK(j.is_object(), ErrorCode::kInvalidArgument, "{} must be an object, got {}", where,
                json_excerpt(j));
  const std::string method = opt_string(j, "quant_method", "", where);
  // A config that quantizes only the KV cache (ModelOpt's kv_cache_quant_algo without a
  // quant_algo, compressed-tensors' kv_cache_scheme without config_groups: --kv-cache-dtype auto
  // reads those) leaves the weights as they are.
  const bool no_groups = !j.contains("config_groups") || j["config_groups"].is_null() ||
                         (j["config_groups"].is_object() && j["config_groups"].empty());
  if (method == "modelopt" || method.empty()) {
    const bool weights = j.contains("quant_algo") && !j["quant_algo"].is_null();
    LONGCTX_CHECK(!weights, ErrorCode::kUnsupported,
                  "{}: ModelOpt weight quantization (quant_algo {}) is not supported (the KV "
                  "cache's kv_cache_quant_algo alone is read)",
                  where, weights ? json_excerpt(j["quant_algo"]) : "");
    return q;
  }
  const std::string ct_format = opt_string(j, "format", "", where);
  if (method == "compressed-tensors" && no_groups && (ct_format.empty() || ct_format == "dense"))
    return q;
  if (method == "fp8")
    parse_fp8_block(j, q, where);
  else if (method == "compressed-tensors")
    parse_compressed_tensors(j, q, where);
  else if (method == "awq")
    parse_awq(j, q, where);
  else if (method == "gptq")
    parse_gptq(j, q, where);
  else
    LONGCTX_THROW(ErrorCode::kUnsupported,
                  "{}: quant_method '{}' is not supported (supported: fp8 with "
                  "weight_block_size, compressed-tensors float-quantized, awq gemm, gptq)",
                  where, method);
  return q;
}

}  // namespace longctx
