// `longctx bench offload` (bench_offload.cpp), a subcommand of `longctx bench`.
#pragma once

#include <CLI/CLI.hpp>

namespace longctx::cli {

void add_bench_offload(CLI::App* bench);

}  // namespace longctx::cli
