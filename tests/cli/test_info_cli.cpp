// `longctx info` prints the GPU memory plan: of the GPU it would run on, or, on a machine without
// one, of a GPU of --gpu-memory-limit bytes. Bad device options fail with a message.
#include <gtest/gtest.h>

#include "cli/cli_runner.h"

namespace longctx::testing {
namespace {

TEST(InfoCli, PlansForAGpuOfTheGivenSize) {
  CliResult r = run_cli(
      "info --load-format dummy --preset llama-3.1-8b --device cpu --gpu-memory-limit 100GiB");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("GPU memory plan:    (no GPU here) budget 100.0 GiB: weights 15.0 GiB"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("blocks of 128 tokens"), std::string::npos) << r.out;
  // A 24 GiB card cannot hold a 131072-token sequence of this model next to its weights.
  r = run_cli(
      "info --load-format dummy --preset llama-3.1-8b --device cpu --gpu-memory-limit 24GiB");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("does not fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max_model_len 131072"), std::string::npos) << r.out;
}

TEST(InfoCli, WithoutALimitOnTheCpuThereIsNoPlan) {
  CliResult r = run_cli("info --load-format dummy --preset qwen3-0.6b --device cpu");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("GPU memory plan:    none"), std::string::npos) << r.out;
}

TEST(InfoCli, BadDeviceOptionsAreClearErrors) {
  CliResult r = run_cli("info --load-format dummy --preset qwen3-0.6b --device tpu");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("unknown device 'tpu'"), std::string::npos) << r.err;
  r = run_cli("info --load-format dummy --preset qwen3-0.6b --gpu-memory-limit 12parsecs");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--gpu-memory-limit '12parsecs'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace longctx::testing
