// longctx forward: the numerics debugging tool. Runs token ids through the CPU reference model in
// one forward pass and writes the float32 logits as .npy ([n, vocab], or [1, vocab] with
// --positions last), to compare against transformers or another backend offline.
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"
#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"
#include "longctx/core/npy.h"
#include "longctx/engine/executor_session.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/engine/reference_forward.h"
#include "longctx/models/model.h"
#include "model_options.h"
#include "token_ids.h"

namespace longctx::cli {
namespace {

struct Options {
  ModelOptions model;
  std::string ids;
  std::string ids_file;
  std::string out;
  std::string positions = "all";
};

// "1,2,3", "1 2 3" or a mix of commas and whitespace.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& where) {
  std::vector<int32_t> ids;
  std::string tok;
  for (char ch : text + " ") {
    if (ch == ',' || std::isspace(static_cast<unsigned char>(ch))) {
      if (!tok.empty()) ids.push_back(parse_token_id(tok, where));
      tok.clear();
    } else {
      tok += ch;
    }
  }
  return ids;
}

// A JSON array of ints, or comma/whitespace-separated ids.
std::vector<int32_t> read_ids_file(const std::string& path) {
  std::ifstream f(path);
  LONGCTX_CHECK(f, ErrorCode::kNotFound, "--ids-file {}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    check_json_depth(text, "--ids-file " + path);  // messages and parsing recurse per level
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    LONGCTX_CHECK(j.is_array(), ErrorCode::kInvalidArgument, "--ids-file {}: not a JSON array",
                  path);
    std::vector<int32_t> ids;
    for (const auto& v : j) {
      LONGCTX_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
                    ErrorCode::kInvalidArgument, "--ids-file {}: {} is not a token id", path,
                    json_excerpt(v));
      ids.push_back(v.get<int32_t>());
    }
    return ids;
  }
  return parse_id_list(text, "--ids-file " + path);
}

void run(const Options& o) {
  LONGCTX_CHECK(o.ids.empty() != o.ids_file.empty(), ErrorCode::kInvalidArgument,
                "give exactly one of --ids and --ids-file");
  std::vector<int32_t> ids =
      o.ids.empty() ? read_ids_file(o.ids_file) : parse_id_list(o.ids, "--ids");
  LONGCTX_CHECK(!ids.empty(), ErrorCode::kInvalidArgument, "no token ids given");
  std::shared_ptr<const Checkpoint> checkpoint = o.model.load();
  std::shared_ptr<Model> model = o.model.create(checkpoint);
  const int64_t n = static_cast<int64_t>(ids.size());
  const bool last = o.positions == "last";
  Tensor logits;
  std::chrono::steady_clock::time_point t0;
  if (model->device().is_cuda()) {
    GpuRunnerOptions gpu = o.model.runner_options();
    gpu.max_model_len = n;
    gpu.enforce_eager = true;  // a prompt's steps are prefill chunks: no decode graphs to capture
    ExecutorSession session = make_gpu_session(std::make_shared<GpuRunner>(model, gpu));
    t0 = std::chrono::steady_clock::now();
    logits = session.prompt_logits(ids);
    if (last) logits = logits.slice(0, n - 1, n).contiguous();
  } else {
    std::vector<int64_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    auto cache = std::make_unique<KVCache>(model->config(), n);
    t0 = std::chrono::steady_clock::now();
    logits = reference_forward(*model, ids, positions, *cache, last);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_npy(o.out, logits);
  std::fprintf(stderr, "forward: %lld tokens in %.3f s, wrote logits %s to %s\n",
               static_cast<long long>(n), secs, logits.shape_str().c_str(), o.out.c_str());
}

CommandRegistration reg("forward", [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "forward",
      "Run token ids through the model (GPU or CPU reference); write f32 logits as .npy");
  o->model.add_to(cmd, kModelFlags | kEngineFlags | kOffloadFlags | kTuningFlags);
  cmd->add_option("--ids", o->ids, "token ids, e.g. 1,2,3");
  cmd->add_option("--ids-file", o->ids_file,
                  "file of token ids: comma/whitespace separated, or a JSON array");
  cmd->add_option("--out,-o", o->out, "output .npy file (float32 [n, vocab] or [1, vocab])")
      ->required();
  cmd->add_option("--positions", o->positions, "logits of all positions or only the last")
      ->check(CLI::IsMember({"all", "last"}));
  cmd->callback([o] { run(*o); });
});

}  // namespace
}  // namespace longctx::cli
