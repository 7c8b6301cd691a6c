// `longctx bench throughput | latency | offload` on the CPU with the embedded needle model: the
// workload runs to the end and the numbers are printed; bad shapes are clear errors.
#include <gtest/gtest.h>

#include <string>

#include "cli/cli_runner.h"

namespace longctx {
namespace {

using testing::run_cli;

const std::string kModel =
    std::string("--device cpu --model '") + LONGCTX_SOURCE_DIR + "/models/needle' ";

TEST(BenchCli, ThroughputRunsNanoVllmsWorkload) {
  auto r = run_cli("bench throughput " + kModel +
                   "--num-seqs 6 --min-input-len 10 --max-input-len 40 --min-output-len 3 "
                   "--max-output-len 9 --max-num-seqs 4 --max-num-batched-tokens 64");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("throughput: 6 requests"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("output tok/s"), std::string::npos) << r.out;
}

TEST(BenchCli, LatencyPrintsTtftAndTpot) {
  auto r = run_cli("bench latency " + kModel +
                   "--input-len 50 --output-len 4 --batch-size 2 --num-iters 1 --num-warmup 0");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("TTFT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TPOT"), std::string::npos) << r.out;
}

TEST(BenchCli, LatencyWithAStructuredOutputCountsItsTokens) {
  const std::string schema = std::string(LONGCTX_SOURCE_DIR) + "/bench/engine/latency_schema.json";
  auto r = run_cli("bench latency " + kModel +
                   "--input-len 20 --output-len 12 --num-iters 1 --num-warmup 0 --json-schema '" +
                   schema + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  // The schema's 50 required strings outlast 12 tokens: the output runs to max_tokens.
  EXPECT_NE(r.out.find("structured output: 12.0 tokens per request"), std::string::npos) << r.out;
  r = run_cli("bench latency " + kModel +
              "--input-len 20 --output-len 4 --num-iters 1 --json-object --regex 'a+'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("are exclusive"), std::string::npos) << r.err;
  r = run_cli("bench latency " + kModel + "--input-len 20 --json-schema /no/such/schema.json");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("neither a JSON object nor a readable file"), std::string::npos) << r.err;
}

TEST(BenchCli, BadWorkloadIsAClearError) {
  auto r = run_cli("bench throughput " + kModel + "--min-input-len 50 --max-input-len 10");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("min <= max"), std::string::npos) << r.err;
}

TEST(BenchCli, OffloadOnTheCpuIsAClearError) {
  auto r = run_cli("bench offload " + kModel + "--context-len 64");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("CUDA device"), std::string::npos) << r.err;
  r = run_cli("generate " + kModel + "--kv-offload --prompt hi --max-tokens 2");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--kv-offload needs a CUDA device"), std::string::npos) << r.err;
}

TEST(BenchCli, SparsePoliciesRunAndBadOnesAreClearErrors) {
  auto r = run_cli("generate " + kModel +
                   "--sparse-policy quest --sparse-budget 64 --sparse-sink 16 --sparse-window 32 "
                   "--ids 1,2,3,4,5,6,7,8,9,10 --max-tokens 4");
  EXPECT_EQ(r.rc, 0) << r.err;
  r = run_cli("generate " + kModel +
              "--sparse-policy streaming --sparse-sink 2 --sparse-window 4 --sparse-page 1 "
              "--ids 1,2,3,4,5,6,7,8,9,10 --max-tokens 4");
  EXPECT_EQ(r.rc, 0) << r.err;
  // Page reuse across decode steps is exact: the same tokens, two prompts of 80 and 70 tokens
  // (past the 64-token budget) decoding side by side.
  auto ids = [](int n, int seed) {
    std::string list;
    for (int i = 0; i < n; ++i) list += (i ? "," : "") + std::to_string((i * 7 + seed) % 50 + 1);
    return list;
  };
  const std::string quest = "generate " + kModel +
                            "--sparse-policy quest --sparse-budget 64 --sparse-sink 16 "
                            "--sparse-window 16 --sparse-page 4 --temperature 0 --max-tokens 12 "
                            "--ids " +
                            ids(80, 3) + " --ids " + ids(70, 11);
  r = run_cli(quest);
  ASSERT_EQ(r.rc, 0) << r.err;
  auto reused = run_cli(quest + " --quest-reuse");
  ASSERT_EQ(reused.rc, 0) << reused.err;
  EXPECT_EQ(reused.out, r.out);
  r = run_cli(quest + " --quest-reuse --quest-reuse-seqs 0");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--quest-reuse-seqs 0 must be at least 1"), std::string::npos) << r.err;
  r = run_cli("generate " + kModel + "--sparse-policy magic --prompt hi --max-tokens 2");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--sparse-policy 'magic' is unknown (known: full, quest, xattention, "
                       "streaming)"),
            std::string::npos)
      << r.err;
  r = run_cli("generate " + kModel + "--sparse-policy quest --sparse-budget 0 --prompt hi");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--sparse-budget 0 must be more than"), std::string::npos) << r.err;
  r = run_cli("generate " + kModel + "--sparse-policy quest --sparse-page 0 --prompt hi");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--sparse-page 0 must be >= 1"), std::string::npos) << r.err;
  // forward runs the model directly: it has no sparse flags to take.
  r = run_cli("forward " + kModel + "--sparse-policy quest --ids 1,2,3 --out /dev/null");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("The following arguments were not expected: quest --sparse-policy"),
            std::string::npos)
      << r.err;
}

TEST(BenchCli, TensorParallelRanksRunAsThreadsOnTheCpu) {
  auto one = run_cli("generate " + kModel + "--ids 1,2,3,4,5,6,7,8 --max-tokens 6");
  auto two = run_cli("generate " + kModel +
                     "--tensor-parallel-size 2 --ids 1,2,3,4,5,6,7,8 "
                     "--max-tokens 6");
  ASSERT_EQ(one.rc, 0) << one.err;
  ASSERT_EQ(two.rc, 0) << two.err;
  EXPECT_EQ(two.out, one.out);
  auto r = run_cli("forward " + kModel + "--tensor-parallel-size 2 --ids 1,2,3 --out /dev/null");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("tensor parallelism runs in the engine's commands"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace longctx
