#include "loader/quantize_checkpoint.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "loader/quantized_weights.h"
#include "loader/safetensors.h"
#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"
#include "longctx/loader/checkpoint.h"

namespace longctx {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* safetensors_dtype_name(DType d) {
  switch (d) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kFP8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

// The files beside the weights that a quantized copy keeps as they are.
constexpr const char* kCopiedFiles[] = {"generation_config.json",
                                        "tokenizer.json",
                                        "tokenizer_config.json",
                                        "tokenizer.model",
                                        "special_tokens_map.json",
                                        "added_tokens.json",
                                        "vocab.json",
                                        "merges.txt",
                                        "chat_template.jinja",
                                        "chat_template.json",
                                        "preprocessor_config.json"};

// Fused experts (transformers 5's `mlp.experts.gate_up_proj` [E, 2 inter, hidden], gate rows
// first, and `mlp.experts.down_proj` [E, hidden, inter]) as one Linear per expert and projection
// (`mlp.experts.{e}.gate_proj.weight` ...): the spelling quantized MoE checkpoints are published
// in, which quantizes_tensor takes and the loader keeps packed. Views of the source (each
// expert's rows are contiguous in it); other tensors as they are.
std::vector<std::pair<std::string, Tensor>> split_fused_experts(
    const std::vector<std::pair<std::string, Tensor>>& raw) {
  const std::string gate_up = ".mlp.experts.gate_up_proj", down = ".mlp.experts.down_proj";
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : raw) {
    const bool gu = name.ends_with(gate_up), dn = name.ends_with(down);
    if (!gu && !dn) {
      out.emplace_back(name, t);
      continue;
    }
    LONGCTX_CHECK(t.rank() == 3 && (!gu || t.size(1) % 2 == 0), ErrorCode::kInvalidArgument,
                  "quantize: fused experts '{}' have shape {}, expected [experts, {}]", name,
                  t.shape_str(), gu ? "2 inter, hidden" : "hidden, inter");
    const std::string p = name.substr(0, name.size() - (gu ? gate_up : down).size());
    const int64_t n = t.size(1) / 2;
    for (int64_t e = 0; e < t.size(0); ++e) {
      const std::string x = fmt::format("{}.mlp.experts.{}.", p, e);
      if (dn) {
        out.emplace_back(x + "down_proj.weight", t.select(0, e));
        continue;
      }
      out.emplace_back(x + "gate_proj.weight", t.select(0, e).slice(0, 0, n));
      out.emplace_back(x + "up_proj.weight", t.select(0, e).slice(0, n, 2 * n));
    }
  }
  return out;
}

struct OutEntry {
  std::string name;
  DType dtype;
  Shape shape;
};

}  // namespace

const std::map<std::string, QuantFormat>& quant_format_names() {
  static const std::map<std::string, QuantFormat> names = {{"fp8", QuantFormat::kFp8Block},
                                                           {"ct-fp8", QuantFormat::kCtFp8Channel},
                                                           {"awq", QuantFormat::kAwq},
                                                           {"gptq", QuantFormat::kGptq}};
  return names;
}

QuantConfig quant_config_for(const QuantFormatOptions& o) {
  QuantConfig q;
  switch (o.format) {
    case QuantFormat::kFp8Block:
      q.method = QuantMethod::kFp8Block;
      q.bits = 8;
      q.block_out = q.block_in = o.block_size;
      break;
    case QuantFormat::kCtFp8Channel:
      q.method = QuantMethod::kCompressedFp8;
      q.bits = 8;
      q.fp8_strategy = Fp8ScaleStrategy::kChannel;
      q.ignore = {"lm_head"};
      break;
    case QuantFormat::kAwq:
      q.method = QuantMethod::kAwq;
      q.bits = 4;
      q.group_size = o.group_size;
      break;
    case QuantFormat::kGptq:
      q.method = QuantMethod::kGptq;
      q.bits = 4;
      q.group_size = o.group_size;
      q.symmetric = !o.asym;
      q.gptq_zero_minus_one = !o.gptq_v2;
      break;
  }
  LONGCTX_CHECK(!o.asym || o.format == QuantFormat::kGptq, ErrorCode::kInvalidArgument,
                "--asym applies to --method gptq only (AWQ is always asymmetric, FP8 symmetric)");
  LONGCTX_CHECK(!o.gptq_v2 || o.format == QuantFormat::kGptq, ErrorCode::kInvalidArgument,
                "--gptq-v2 applies to --method gptq only");
  LONGCTX_CHECK(o.group_size > 0, ErrorCode::kInvalidArgument,
                "--group-size must be positive, got {}", o.group_size);
  LONGCTX_CHECK(o.block_size > 0, ErrorCode::kInvalidArgument,
                "--block-size must be positive, got {}", o.block_size);
  return q;
}

json quantization_config_json(const QuantConfig& q) {
  switch (q.method) {
    case QuantMethod::kFp8Block:
      return {{"quant_method", "fp8"},
              {"fmt", "e4m3"},
              {"activation_scheme", "dynamic"},
              {"weight_block_size", {q.block_out, q.block_in}}};
    case QuantMethod::kCompressedFp8: {
      const char* strategy = q.fp8_strategy == Fp8ScaleStrategy::kChannel ? "channel" : "tensor";
      json weights = {{"num_bits", 8},
                      {"type", "float"},
                      {"strategy", strategy},
                      {"symmetric", true},
                      {"dynamic", false},
                      {"group_size", nullptr},
                      {"block_structure", nullptr},
                      {"observer", "minmax"}};
      json acts = {{"num_bits", 8},      {"type", "float"}, {"strategy", "token"},
                   {"symmetric", true},  {"dynamic", true}, {"group_size", nullptr},
                   {"observer", nullptr}};
      return {{"quant_method", "compressed-tensors"},
              {"format", "float-quantized"},
              {"quantization_status", "compressed"},
              {"config_groups",
               {{"group_0",
                 {{"targets", {"Linear"}},
                  {"weights", weights},
                  {"input_activations", acts},
                  {"output_activations", nullptr}}}}},
              {"ignore", q.ignore},
              {"kv_cache_scheme", nullptr}};
    }
    case QuantMethod::kAwq:
      return {{"quant_method", "awq"}, {"bits", q.bits},    {"group_size", q.group_size},
              {"zero_point", true},    {"version", "gemm"}, {"modules_to_not_convert", nullptr}};
    case QuantMethod::kGptq:
      return {{"quant_method", "gptq"},
              {"bits", q.bits},
              {"group_size", q.group_size > 0 ? q.group_size : -1},
              {"desc_act", false},
              {"sym", q.symmetric},
              {"static_groups", false},
              {"true_sequential", true},
              {"lm_head", false},
              {"checkpoint_format", q.gptq_zero_minus_one ? "gptq" : "gptq_v2"}};
    case QuantMethod::kNone:
      break;
  }
  LONGCTX_THROW(ErrorCode::kInvalidArgument, "quantization_config_json: no method");
}

bool quantizes_tensor(const std::string& name, const Shape& shape, const QuantConfig& q) {
  static const std::regex kLinear(R"((^|.*\.)layers\.\d+\..*_proj\.weight)");
  if (shape.size() != 2 || !std::regex_match(name, kLinear)) return false;
  return !q.ignores(name.substr(0, name.size() - 7));
}

QuantizeStats quantize_checkpoint(const std::string& src, const std::string& dst,
                                  const QuantConfig& q) {
  LONGCTX_CHECK(q.quantized(), ErrorCode::kInvalidArgument, "quantize: no method given");
  Checkpoint ck = load_checkpoint(src);
  LONGCTX_CHECK(!ck.config.quantization.quantized(), ErrorCode::kInvalidArgument,
                "{}: already quantized ({}); quantize a dense checkpoint", src,
                quant_method_name(ck.config.quantization.method));
  const fs::path out_dir(dst);
  LONGCTX_CHECK(!fs::exists(out_dir) || (fs::is_directory(out_dir) && fs::is_empty(out_dir)),
                ErrorCode::kInvalidArgument, "{}: exists and is not an empty folder", dst);
  std::error_code ec;
  LONGCTX_CHECK(!fs::exists(out_dir) || !fs::equivalent(out_dir, src, ec),
                ErrorCode::kInvalidArgument, "{}: the output must differ from the input", dst);

  // The raw tensors under their names in the files (not the canonical names the engine uses).
  std::vector<std::pair<std::string, Tensor>> raw;
  for (const auto& file : ck.files)
    for (const auto& name : file->names()) raw.emplace_back(name, file->get(name));
  raw = split_fused_experts(raw);
  std::sort(raw.begin(), raw.end(), [](const auto& a, const auto& b) { return a.first < b.first; });

  // The header first (every output's shape follows from its input's), then each tensor in turn,
  // so only one layer's quantized copy is in memory at a time.
  std::vector<OutEntry> entries;
  QuantizeStats stats;
  for (const auto& [name, t] : raw) {
    stats.bytes_in += t.nbytes();
    if (!quantizes_tensor(name, t.shape(), q)) {
      entries.push_back({name, t.dtype(), t.shape()});
      ++stats.copied_tensors;
      continue;
    }
    QuantizedWeight w = quantized_layout(t.size(0), t.size(1), q, name);
    for (const auto& [n, qt] : quantized_tensors(name.substr(0, name.size() - 7), w))
      entries.push_back({n, qt.dtype(), qt.shape()});
    ++stats.quantized_tensors;
  }
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  for (const OutEntry& e : entries) {
    size_t n = dtype_size(e.dtype);
    for (int64_t d : e.shape) n *= static_cast<size_t>(d);
    header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  stats.bytes_out = offset;
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';

  fs::create_directories(out_dir);
  const fs::path st = out_dir / "model.safetensors";
  std::ofstream f(st, std::ios::binary);
  LONGCTX_CHECK(f, ErrorCode::kIo, "{}: cannot create", st.string());
  const uint64_t hn = h.size();
  f.write(reinterpret_cast<const char*>(&hn), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  auto write = [&](const Tensor& t) {
    Tensor c = t.contiguous();
    f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  };
  size_t next = 0;
  for (const auto& [name, t] : raw) {
    if (!quantizes_tensor(name, t.shape(), q)) {
      LONGCTX_ASSERT(entries[next].name == name, "quantize: entry order");
      write(t);
      ++next;
      continue;
    }
    QuantizedWeight w = quantize_rtn(t, q, name);
    for (const auto& [n, qt] : quantized_tensors(name.substr(0, name.size() - 7), w)) {
      LONGCTX_ASSERT(entries[next].name == n && entries[next].shape == qt.shape(),
                     "quantize: entry order");
      write(qt);
      ++next;
    }
  }
  f.close();
  LONGCTX_CHECK(f, ErrorCode::kIo, "{}: write failed", st.string());

  std::ifstream cf(fs::path(src) / "config.json", std::ios::binary);
  std::stringstream ss;
  ss << cf.rdbuf();
  json config = parse_json(ss.str(), src + "/config.json");
  config["quantization_config"] = quantization_config_json(q);
  std::ofstream(out_dir / "config.json") << config.dump(2) << "\n";
  for (const char* name : kCopiedFiles) {
    const fs::path from = fs::path(src) / name;
    if (fs::exists(from)) fs::copy_file(from, out_dir / name, fs::copy_options::overwrite_existing);
  }
  return stats;
}

}  // namespace longctx
