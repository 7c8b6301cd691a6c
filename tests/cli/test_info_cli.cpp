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

// --dummy-layers keeps a preset's first N layers with their kinds: a quarter of Qwen3-Next-80B
// keeps its one full-attention layer in four; more layers than the preset has is refused.
TEST(InfoCli, DummyLayersKeepThePresetsFirstLayers) {
  CliResult r = run_cli(
      "info --load-format dummy --preset qwen3-next-80b-a3b --device cpu --dummy-layers 12");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("layers:             12\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV group 0: full, 3 layers (3,7,11), bf16, 6144 B/token"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("KV group 1: state, 9 layers (0-2,4-6,8-10)"), std::string::npos) << r.out;
  r = run_cli("info --load-format dummy --preset qwen3-0.6b --device cpu --dummy-layers 29");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--dummy-layers 29: preset qwen3-0.6b has 28 layers"), std::string::npos)
      << r.err;
}

TEST(InfoCli, Qwen3NextPrintsItsFullAndStateGroups) {
  CliResult r = run_cli("info --load-format dummy --preset qwen3-next-80b-a3b --device cpu");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("architecture:       Qwen3NextForCausalLM"), std::string::npos) << r.out;
  // 12 gated attention layers (2 KV heads of 256): K + V in bf16 per token.
  EXPECT_NE(r.out.find("KV bytes per token: 24576 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV group 0: full, 12 layers (3,7,11,15,19,23,27,31,35,39,43,47), bf16, "
                       "24576 B/token"),
            std::string::npos)
      << r.out;
  // 36 Gated DeltaNet layers: [32, 128, 128] recurrent + 3 x 8192 conv inputs each, in fp32
  // (75.4 MiB a sequence), and the prefix cache's 64 snapshots of as many bytes.
  EXPECT_NE(r.out.find("KV group 1: state, 36 layers (0-2,4-6,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::to_string(36LL * (32 * 128 * 128 + 3 * 8192) * 4) + " B/sequence"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("f32, 79036416 B/sequence"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("state snapshots:    64 for prefix hits, 75.3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("states): 4.71 GiB"), std::string::npos) << r.out;
  // Without prefix caching there are none.
  CliResult off = run_cli(
      "info --load-format dummy --preset qwen3-next-80b-a3b --device cpu "
      "--no-enable-prefix-caching");
  ASSERT_EQ(off.rc, 0) << off.err;
  EXPECT_NE(off.out.find("state snapshots:    0 for prefix hits"), std::string::npos) << off.out;
  CliResult eight = run_cli(
      "info --load-format dummy --preset qwen3-next-80b-a3b --device cpu --max-state-snapshots 8 "
      "--gpu-memory-limit 200GiB");
  ASSERT_EQ(eight.rc, 0) << eight.err;
  EXPECT_NE(eight.out.find("state snapshots:    8 for prefix hits, 75.3"), std::string::npos)
      << eight.out;
  EXPECT_NE(eight.out.find("state snapshots 603.0 MiB (8 for prefix hits)"), std::string::npos)
      << eight.out;
  EXPECT_NE(run_cli("info --load-format dummy --preset qwen3-next-80b-a3b --device cpu "
                    "--max-state-snapshots -3")
                .rc,
            0);
  // Qwen3-Next-80B-A3B: 80 billion parameters (79.7 B without the MTP head).
  EXPECT_NE(r.out.find("(79."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("512 routed, top 10 (renormalized), expert ffn 512, shared expert ffn 512"),
            std::string::npos)
      << r.out;
}

// Gemma-3-12B offloaded: the GPU cache and the host pool hold the 8 global layers' blocks (8 MiB
// each at 128 tokens), the sliding windows a resident pool of their own: 4 sequences' windows
// (8 + 2 blocks each) and a 16384-token step (128 blocks), in each of the 5 sliding groups.
TEST(InfoCli, OffloadedGemmaPlansItsWindowsApart) {
  CliResult r = run_cli(
      "info --load-format dummy --preset gemma-3-12b --device cpu --kv-offload --gpu-memory-limit "
      "40GiB --host-kv-budget 64GiB --max-num-seqs 4");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("8.0 MiB per block"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the full group offloaded, sliding windows resident 6.6 GiB (840 blocks, "
                       "8.0 MiB per block)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("host KV pool 64.0 GiB (pinned, 8192 blocks"), std::string::npos) << r.out;
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
