// KernelTuning: the defaults are the measured choices the plans made before tuning was data (the
// environment knobs unset), and the benchmark flags reach every field.
#include "longctx/kernels/kernel_tuning.h"

#include <gtest/gtest.h>

#include <string>

#include "kernels/decode_schedule.h"
#include "kernels/prefill_schedule.h"

namespace longctx::kernels {
namespace {

TEST(KernelTuning, DefaultsAreTheMeasuredChoices) {
  const KernelTuning t;
  EXPECT_EQ(t.prefill.kernel, PrefillKernel::kSm90);
  EXPECT_EQ(t.prefill.variant, PrefillSm90Variant::kPingpong);
  EXPECT_TRUE(t.prefill.tma);
  EXPECT_EQ(t.prefill.lean, PrefillLean::kAuto);
  EXPECT_EQ(t.prefill.head_dim64_rows, 192);
  EXPECT_EQ(t.prefill.split, PrefillSplitMode::kAuto);
  EXPECT_EQ(t.prefill.unit_heads, 0);
  EXPECT_EQ(t.prefill.fp8_stage_mib, 512);  // 128K keys of an 8 x 128 layer, staged
  EXPECT_EQ(t.decode.loader, DecodeLoader::kAuto);
  EXPECT_EQ(t.decode.copy, DecodeStageCopy::kAuto);
  EXPECT_EQ(t.decode.fp8_kernel, DecodeFp8Kernel::kAuto);
  EXPECT_EQ(t.decode.slots, 0);
  EXPECT_EQ(t.decode.overhead, 64);
  EXPECT_EQ(t.decode.max_q_len, 1);  // verify steps take the paged prefill (measured faster)
  EXPECT_EQ(t.attention, AttentionKernel::kAuto);
  EXPECT_TRUE(t.pdl);
}

// The Hopper prefill's tiling under the default tuning, for representative calls.
TEST(KernelTuning, DefaultPrefillTiling) {
  const PrefillTuning t;
  EXPECT_EQ(prefill_tile_rows(64, /*sm90_path=*/true, t), 192);
  EXPECT_EQ(prefill_tile_rows(128, true, t), 128);
  EXPECT_EQ(prefill_tile_rows(64, /*sm90_path=*/false, t), 128);  // the mma.sync kernel
  // Dense: the lean tiling, 3 stages only at head_dim 128 under cp.async.
  EXPECT_EQ(prefill_lean_stages(/*block_mask=*/false, 128, /*tma=*/true, t.lean), 2);
  EXPECT_EQ(prefill_lean_stages(false, 128, /*tma=*/false, t.lean), 3);
  EXPECT_EQ(prefill_lean_stages(false, 64, true, t.lean), 2);
  EXPECT_EQ(prefill_lean_stages(false, 64, false, t.lean), 2);
  // Block-sparse calls keep the full tiling whatever the tuning says.
  EXPECT_EQ(prefill_lean_stages(/*block_mask=*/true, 128, false, t.lean), 0);
  EXPECT_EQ(prefill_lean_stages(true, 128, false, PrefillLean::kLean3), 0);
  // Pins.
  PrefillTuning rows;
  rows.head_dim64_rows = 128;
  EXPECT_EQ(prefill_tile_rows(64, true, rows), 128);
  EXPECT_EQ(prefill_lean_stages(false, 128, false, PrefillLean::kFull), 0);
  EXPECT_EQ(prefill_lean_stages(false, 128, false, PrefillLean::kLean2), 2);
  EXPECT_EQ(prefill_lean_stages(false, 64, true, PrefillLean::kLean3), 3);
}

// Head_dim 256 on the Hopper kernel: 128-row tiles of 64-key K/V tiles, two stages whatever the
// tuning asks (a third passes the 227 KB), the full tiling for block masks.
TEST(KernelTuning, HeadDim256PrefillTiling) {
  const PrefillTuning t;
  EXPECT_EQ(prefill_tile_rows(256, /*sm90_path=*/true, t), 128);
  EXPECT_EQ(prefill_sm90_tile_keys(256), 64);
  EXPECT_EQ(prefill_sm90_tile_keys(128), 128);
  EXPECT_EQ(prefill_sm90_tile_keys(64), 128);
  for (bool tma : {false, true}) {
    EXPECT_EQ(prefill_lean_stages(false, 256, tma, t.lean), 2);
    EXPECT_EQ(prefill_lean_stages(false, 256, tma, PrefillLean::kLean3), 2);
    EXPECT_EQ(prefill_lean_stages(false, 256, tma, PrefillLean::kLean2), 2);
    EXPECT_EQ(prefill_lean_stages(false, 256, tma, PrefillLean::kFull), 0);
    EXPECT_EQ(prefill_lean_stages(/*block_mask=*/true, 256, tma, t.lean), 0);
  }
}

// The split-KV decode's loader and stage fill under the default tuning at the engine's pages.
TEST(KernelTuning, DefaultDecodeLoader) {
  const DecodeTuning t;
  EXPECT_EQ(decode_loader(128, 128, /*tma=*/true, t), 2);
  EXPECT_EQ(decode_loader(128, 64, true, t), 1);
  EXPECT_EQ(decode_loader(16, 128, true, t), 0);
  EXPECT_EQ(decode_loader(128, 128, /*tma=*/false, t), 0);
  EXPECT_TRUE(decode_cp_async_stages(2, 128, 128, 2048, t));
  EXPECT_FALSE(decode_cp_async_stages(2, 128, 128, 512, t));
}

TEST(KernelTuning, FlagsSetEveryField) {
  KernelTuning t;
  std::string err;
  auto set = [&](const char* name, const char* value) {
    return parse_kernel_tuning_flag(name, value, &t, &err);
  };
  ASSERT_TRUE(set("prefill-kernel", "fa2")) << err;
  ASSERT_TRUE(set("prefill-variant", "grid")) << err;
  ASSERT_TRUE(set("prefill-tma", "0")) << err;
  ASSERT_TRUE(set("prefill-lean", "3")) << err;
  ASSERT_TRUE(set("prefill-rows", "128")) << err;
  ASSERT_TRUE(set("prefill-split", "1")) << err;
  ASSERT_TRUE(set("prefill-unit-heads", "2")) << err;
  ASSERT_TRUE(set("prefill-fp8-stage", "0")) << err;
  ASSERT_TRUE(set("decode-loader", "0")) << err;
  ASSERT_TRUE(set("decode-copy", "1")) << err;
  ASSERT_TRUE(set("decode-fp8-kernel", "0")) << err;
  ASSERT_TRUE(set("decode-slots", "3")) << err;
  ASSERT_TRUE(set("decode-overhead", "96")) << err;
  ASSERT_TRUE(set("decode-max-q", "9")) << err;
  ASSERT_TRUE(set("attention-kernel", "generic")) << err;
  ASSERT_TRUE(set("pdl", "0")) << err;
  EXPECT_EQ(t.prefill.kernel, PrefillKernel::kFa2);
  EXPECT_EQ(t.prefill.variant, PrefillSm90Variant::kGrid);
  EXPECT_FALSE(t.prefill.tma);
  EXPECT_EQ(t.prefill.lean, PrefillLean::kLean3);
  EXPECT_EQ(t.prefill.head_dim64_rows, 128);
  EXPECT_EQ(t.prefill.split, PrefillSplitMode::kAlways);
  EXPECT_EQ(t.prefill.unit_heads, 2);
  EXPECT_EQ(t.prefill.fp8_stage_mib, 0);
  EXPECT_EQ(t.decode.loader, DecodeLoader::kCpAsync);
  EXPECT_EQ(t.decode.copy, DecodeStageCopy::kCpAsync);
  EXPECT_EQ(t.decode.fp8_kernel, DecodeFp8Kernel::kConvertTile);
  EXPECT_EQ(t.decode.slots, 3);
  EXPECT_EQ(t.decode.overhead, 96);
  EXPECT_EQ(t.decode.max_q_len, 9);
  EXPECT_EQ(t.attention, AttentionKernel::kGeneric);
  EXPECT_FALSE(t.pdl);
  ASSERT_TRUE(set("prefill-split", "auto")) << err;
  EXPECT_EQ(t.prefill.split, PrefillSplitMode::kAuto);
  ASSERT_TRUE(set("decode-fp8-kernel", "2")) << err;
  EXPECT_EQ(t.decode.fp8_kernel, DecodeFp8Kernel::kRegistersDeep);
}

TEST(KernelTuning, FlagsRefuseUnknownNamesAndValues) {
  KernelTuning t;
  std::string err;
  EXPECT_FALSE(parse_kernel_tuning_flag("prefill-kernel", "sm80", &t, &err));
  EXPECT_NE(err.find("sm90|fa2"), std::string::npos) << err;
  EXPECT_FALSE(parse_kernel_tuning_flag("prefill-rows", "64", &t, &err));
  EXPECT_FALSE(parse_kernel_tuning_flag("decode-slots", "x", &t, &err));
  EXPECT_FALSE(parse_kernel_tuning_flag("decode-overhead", "0", &t, &err));
  EXPECT_FALSE(parse_kernel_tuning_flag("decode-max-q", "0", &t, &err));
  EXPECT_FALSE(parse_kernel_tuning_flag("decode-max-q", "17", &t, &err));  // kDecodeMaxQLen
  EXPECT_FALSE(parse_kernel_tuning_flag("decode-fp8-kernel", "3", &t, &err));
  EXPECT_EQ(t.decode.fp8_kernel, DecodeFp8Kernel::kAuto);
  EXPECT_EQ(t.decode.max_q_len, 1);
  EXPECT_FALSE(parse_kernel_tuning_flag("no-such-flag", "1", &t, &err));
  EXPECT_FALSE(is_kernel_tuning_flag("no-such-flag"));
  EXPECT_TRUE(is_kernel_tuning_flag("decode-loader"));
  EXPECT_EQ(t.prefill.kernel, PrefillKernel::kSm90);  // untouched by refused values
  EXPECT_NE(kernel_tuning_flags_help().find("--prefill-kernel"), std::string::npos);
}

}  // namespace
}  // namespace longctx::kernels
