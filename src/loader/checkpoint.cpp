// Checkpoint folders: config, (sharded) safetensors, validation against the architecture's
// expected tensors.
#include "longctx/loader/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "loader/quantized_weights.h"
#include "loader/safetensors.h"
#include "loader/weight_spec.h"
#include "longctx/core/json_limits.h"
#include "longctx/core/logging.h"

namespace longctx {

namespace fs = std::filesystem;
using nlohmann::json;

const Tensor& WeightStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  LONGCTX_CHECK(it != tensors_.end(), ErrorCode::kNotFound, "weight '{}' not found", name);
  return it->second;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> n;
  for (const auto& [k, v] : tensors_) n.push_back(k);
  return n;
}

void WeightStore::add(const std::string& name, Tensor t) {
  LONGCTX_CHECK(!has(name), ErrorCode::kInvalidArgument, "weight '{}' given twice", name);
  tensors_.emplace(name, std::move(t));
}

int64_t WeightStore::num_parameters() const {
  int64_t n = 0;
  for (const auto& [k, t] : tensors_) n += t.numel();
  return n;
}

size_t WeightStore::num_bytes() const {
  size_t n = 0;
  for (const auto& [k, t] : tensors_) n += t.nbytes();
  return n;
}

namespace {

// Checkpoint files are untrusted: parsed with a nesting limit (json_limits.h).
json read_json(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  LONGCTX_CHECK(f, ErrorCode::kNotFound, "{}: cannot open", path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_json(ss.str(), path.string());
}

std::string join_limited(const std::vector<std::string>& v, size_t limit = 20) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < limit; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > limit) s += fmt::format(", ... ({} in all)", v.size());
  return s;
}

// Opens the shard files and gathers every tensor, checking the index against the files.
void load_weights(Checkpoint& ck, const fs::path& dir) {
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shard_names;
  if (fs::exists(index)) {
    json j = read_json(index);
    LONGCTX_CHECK(j.contains("weight_map") && j["weight_map"].is_object(),
                  ErrorCode::kInvalidArgument, "{}: missing 'weight_map' object", index.string());
    std::set<std::string> seen;
    for (auto& [name, file] : j["weight_map"].items()) {
      LONGCTX_CHECK(file.is_string(), ErrorCode::kInvalidArgument,
                    "{}: weight_map['{}'] must be a file name", index.string(), name);
      std::string fname = file.get<std::string>();
      LONGCTX_CHECK(fname.find('/') == std::string::npos && fname != "..",
                    ErrorCode::kInvalidArgument, "{}: shard name '{}' must be a plain file name",
                    index.string(), fname);
      weight_map[name] = fname;
      if (seen.insert(fname).second) shard_names.push_back(fname);
    }
  } else {
    LONGCTX_CHECK(fs::exists(single), ErrorCode::kNotFound,
                  "{}: no model.safetensors or model.safetensors.index.json", dir.string());
    shard_names.push_back("model.safetensors");
  }
  for (const auto& shard : shard_names) {
    auto file = SafetensorsFile::open((dir / shard).string());
    ck.files.push_back(file);
    for (const auto& name : file->names()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(name);
        LONGCTX_CHECK(it != weight_map.end() && it->second == shard, ErrorCode::kInvalidArgument,
                      "{}: tensor '{}' is not mapped to this shard by the index", file->path(),
                      name);
      }
      LONGCTX_CHECK(!ck.weights.has(name), ErrorCode::kInvalidArgument,
                    "{}: tensor '{}' appears in more than one shard", file->path(), name);
      ck.weights.add(name, file->get(name));
    }
  }
  std::vector<std::string> unfound;
  for (const auto& [name, shard] : weight_map)
    if (!ck.weights.has(name)) unfound.push_back(name + " (in " + shard + ")");
  LONGCTX_CHECK(unfound.empty(), ErrorCode::kInvalidArgument,
                "{}: the index lists tensors its shards lack: {}", index.string(),
                join_limited(unfound));
}

// The tensor names of a quantized Linear `name` ("<module>.weight") in the file's spelling, for
// errors: "<module>.qweight" for int4, the FP8 weight's own name.
std::string packed_name(const std::string& name, const QuantizedWeight& w) {
  const auto tensors = quantized_tensors(name.substr(0, name.size() - 7), w);
  return tensors.empty() ? name : tensors[0].first;
}

void validate_weights(const Checkpoint& ck, const std::string& where) {
  const ModelConfig& c = ck.config;
  std::vector<std::string> names = ck.weights.names();
  for (const auto& [name, w] : ck.quantized) names.push_back(name);
  auto expected = expected_weights(c, detect_expert_layout(names));
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, shape] : expected)
    if (!ck.has_weight(name)) missing.push_back(name);
  for (const auto& name : names)
    if (!expected.count(name) && !is_ignorable_weight(name, c)) unexpected.push_back(name);
  LONGCTX_CHECK(missing.empty(), ErrorCode::kInvalidArgument, "{}: {} tensor(s) missing for {}: {}",
                where, missing.size(), c.architecture, join_limited(missing));
  LONGCTX_CHECK(unexpected.empty(), ErrorCode::kInvalidArgument,
                "{}: {} unexpected tensor(s) for {}: {}", where, unexpected.size(), c.architecture,
                join_limited(unexpected));
  for (const auto& [name, shape] : expected) {
    if (auto it = ck.quantized.find(name); it != ck.quantized.end()) {
      // Packed: the [out, in] its tensors hold (their own shapes were checked against each
      // other when they were read) against the config's; dequantized it is config.dtype.
      const QuantizedWeight& w = it->second;
      LONGCTX_CHECK(!ck.weights.has(name), ErrorCode::kInvalidArgument,
                    "{}: tensor '{}' is both dense and quantized ('{}')", where, name,
                    packed_name(name, w));
      LONGCTX_CHECK(Shape({w.out_features, w.in_features}) == shape, ErrorCode::kInvalidArgument,
                    "{}: tensor '{}' holds a {} weight of shape [{}, {}] but the config implies {} "
                    "for '{}'",
                    where, packed_name(name, w), quant_method_name(w.method), w.out_features,
                    w.in_features, shape_to_string(shape), name);
      continue;
    }
    const Tensor& t = ck.weights.get(name);
    LONGCTX_CHECK(t.shape() == shape, ErrorCode::kInvalidArgument,
                  "{}: tensor '{}' has shape {} but the config implies {}", where, name,
                  t.shape_str(), shape_to_string(shape));
    LONGCTX_CHECK(t.dtype() == c.dtype, ErrorCode::kInvalidArgument,
                  "{}: tensor '{}' is {} but config.json declares {}", where, name,
                  dtype_name(t.dtype()), dtype_name(c.dtype));
  }
}

}  // namespace

Tensor Checkpoint::dense_weight(const std::string& name) const {
  if (weights.has(name)) return weights.get(name);
  auto it = quantized.find(name);
  LONGCTX_CHECK(it != quantized.end(), ErrorCode::kNotFound, "{}: no tensor '{}'",
                dir.empty() ? "dummy checkpoint" : dir, name);
  return dequantize(it->second, config.quantization, config.dtype);
}

Checkpoint load_checkpoint(const std::string& dir_str) {
  fs::path dir(dir_str);
  LONGCTX_CHECK(fs::is_directory(dir), ErrorCode::kNotFound, "{}: not a directory", dir_str);
  Checkpoint ck;
  ck.dir = dir_str;
  const fs::path cfg_path = dir / "config.json";
  ck.config = parse_model_config(read_json(cfg_path), cfg_path.string());
  const fs::path gen = dir / "generation_config.json";
  if (fs::exists(gen)) {
    json g = read_json(gen);
    if (g.contains("eos_token_id") && !g["eos_token_id"].is_null())
      ck.config.eos_token_ids =
          parse_token_id_list(g["eos_token_id"], gen.string() + " eos_token_id");
  }
  load_weights(ck, dir);
  // Also without a quantization_config: packed tensors then get an error naming them. They stay
  // packed (views of the mmaps); dense_weight() dequantizes one for a path that asks.
  std::map<std::string, QuantizedWeight> packed;
  ck.weights = extract_quantized(ck.weights, ck.config.quantization, packed, dir_str);
  ck.weights = canonical_weights(ck.weights, ck.config);
  ck.quantized = canonical_quantized(packed, ck.config, ck.weights);
  validate_weights(ck, dir_str);
  int64_t packed_bytes = 0;
  for (const auto& [name, w] : ck.quantized) packed_bytes += quantized_bytes(w);
  LONGCTX_LOG_INFO("loaded {} ({} tensors, {:.1f} MB; {} quantized Linears, {:.1f} MB packed)",
                   dir_str, ck.weights.all().size(), ck.weights.num_bytes() / 1e6,
                   ck.quantized.size(), packed_bytes / 1e6);
  return ck;
}

}  // namespace longctx
