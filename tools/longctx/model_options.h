// The options every model-running subcommand shares: --model DIR, or
// --load-format dummy --preset NAME (random weights of a real model's shapes).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx::cli {

struct ModelOptions {
  std::string model;                        // checkpoint folder
  std::string load_format = "auto";         // auto | dummy
  std::string preset;                       // dummy preset name
  uint64_t seed = 0;                        // dummy weights' seed
  std::string rope_inv_freq_dtype = "f32";  // f32 | checkpoint

  void add_to(CLI::App* cmd);
  // Loads (or makes) the checkpoint; throws Error naming what is wrong with the options.
  std::shared_ptr<const Checkpoint> load() const;
  // The model's numerics options for this checkpoint.
  ModelBuildOptions build_options(const Checkpoint& checkpoint) const;
};

}  // namespace longctx::cli
