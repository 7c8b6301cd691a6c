// `longctx quantize` writes a checkpoint that `longctx info` loads and describes; bad options are
// clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "cli/cli_runner.h"
#include "common/test_data.h"

namespace longctx::testing {
namespace {

namespace fs = std::filesystem;

TEST(QuantizeCli, WritesACheckpointThatLoads) {
  const fs::path out = fs::temp_directory_path() / ("longctx_qcli_" + std::to_string(getpid()));
  fs::remove_all(out);
  const std::string model = test_data_dir() + "/fixtures/tiny-qwen3";
  CliResult r = run_cli("quantize --model '" + model + "' --output '" + out.string() +
                        "' --method gptq --asym");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("gptq, 21 linear weights quantized"), std::string::npos) << r.out;
  r = run_cli("info --model '" + out.string() + "' --device cpu");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("quantization:       gptq: the decoder's Linears dequantized to bf16"),
            std::string::npos)
      << r.out;
  // The checkpoint as loaded and counted: its Linears packed, the other tensors bf16.
  EXPECT_NE(r.out.find("dtypes:             bf16 ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", gptq ("), std::string::npos) << r.out;
  // The output folder is not overwritten.
  r = run_cli("quantize --model '" + model + "' --output '" + out.string() + "' --method awq");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("exists and is not an empty folder"), std::string::npos) << r.err;
  fs::remove_all(out);
}

TEST(QuantizeCli, BadOptionsAreClearErrors) {
  const std::string model = test_data_dir() + "/fixtures/tiny-qwen3";
  CliResult r = run_cli("quantize --model '" + model + "' --output /nonexistent/x --method int3");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("int3"), std::string::npos) << r.err;
  r = run_cli("quantize --model '" + model + "' --output /nonexistent/x --method awq --asym");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--asym applies to --method gptq only"), std::string::npos) << r.err;
  r = run_cli("quantize --model '" + model +
              "' --output /nonexistent/x --method awq "
              "--group-size 0");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--group-size must be positive"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace longctx::testing
