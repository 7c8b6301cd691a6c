// The benchmark flags of KernelTuning (longctx/kernels/kernel_tuning.h). The values keep the
// spellings of the environment knobs they replace (LONGCTX_PREFILL_KERNEL=fa2 ->
// --prefill-kernel fa2, LONGCTX_DECODE_LOADER=0 -> --decode-loader 0, ...), so the commands in
// docs/benchmarks.md translate one to one.
#include "longctx/kernels/kernel_tuning.h"

#include <charconv>
#include <initializer_list>
#include <utility>

namespace longctx::kernels {

namespace {

template <typename E>
using Choices = std::initializer_list<std::pair<std::string_view, E>>;

template <typename E>
bool pick(std::string_view value, Choices<E> choices, E* out) {
  for (const auto& [name, e] : choices)
    if (value == name) {
      *out = e;
      return true;
    }
  return false;
}

bool positive_int(std::string_view value, int lo, int hi, int* out) {
  int x = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  if (ec != std::errc() || end != value.data() + value.size() || x < lo || x > hi) return false;
  *out = x;
  return true;
}

struct Flag {
  std::string_view name, values, help;
  bool (*apply)(std::string_view, KernelTuning*);
};

const Flag kFlags[] = {
    {"prefill-kernel", "sm90|fa2", "paged prefill kernel (sm90: where available; default sm90)",
     [](std::string_view v, KernelTuning* t) {
       return pick<PrefillKernel>(v, {{"sm90", PrefillKernel::kSm90}, {"fa2", PrefillKernel::kFa2}},
                                  &t->prefill.kernel);
     }},
    {"prefill-variant", "pingpong|persistent|grid", "Hopper prefill variant (default pingpong)",
     [](std::string_view v, KernelTuning* t) {
       return pick<PrefillSm90Variant>(v,
                                       {{"pingpong", PrefillSm90Variant::kPingpong},
                                        {"persistent", PrefillSm90Variant::kPersistent},
                                        {"grid", PrefillSm90Variant::kGrid}},
                                       &t->prefill.variant);
     }},
    {"prefill-tma", "1|0", "Hopper prefill: TMA boxes where pages allow (default 1)",
     [](std::string_view v, KernelTuning* t) {
       return pick<bool>(v, {{"1", true}, {"0", false}}, &t->prefill.tma);
     }},
    {"prefill-lean", "auto|0|2|3",
     "Hopper prefill tiling without a block mask: lean with 2 / 3 stages, 0 the full one "
     "(default auto)",
     [](std::string_view v, KernelTuning* t) {
       return pick<PrefillLean>(v,
                                {{"auto", PrefillLean::kAuto},
                                 {"0", PrefillLean::kFull},
                                 {"2", PrefillLean::kLean2},
                                 {"3", PrefillLean::kLean3}},
                                &t->prefill.lean);
     }},
    {"prefill-rows", "192|128", "Hopper prefill rows per work item at head_dim 64 (default 192)",
     [](std::string_view v, KernelTuning* t) {
       return pick<int>(v, {{"192", 192}, {"128", 128}}, &t->prefill.head_dim64_rows);
     }},
    {"prefill-split", "auto|0|1", "Hopper prefill stream-K split (default auto)",
     [](std::string_view v, KernelTuning* t) {
       return pick<PrefillSplitMode>(v,
                                     {{"auto", PrefillSplitMode::kAuto},
                                      {"0", PrefillSplitMode::kNever},
                                      {"1", PrefillSplitMode::kAlways}},
                                     &t->prefill.split);
     }},
    {"prefill-unit-heads", "N", "Hopper prefill kv heads per unit block (default 0: the plan's)",
     [](std::string_view v, KernelTuning* t) {
       return positive_int(v, 0, 1 << 16, &t->prefill.unit_heads);
     }},
    {"prefill-fp8-stage", "MiB",
     "FP8 KV prefill: staging pool cap; calls that fit run the 16-bit kernel over converted "
     "pages, 0 converts in the kernel (default 512)",
     [](std::string_view v, KernelTuning* t) {
       return positive_int(v, 0, 1 << 20, &t->prefill.fp8_stage_mib);
     }},
    {"decode-loader", "auto|0|1",
     "split-KV decode loader: 0 the cp.async ring, 1 TMA stages of one tile (default auto)",
     [](std::string_view v, KernelTuning* t) {
       return pick<DecodeLoader>(v,
                                 {{"auto", DecodeLoader::kAuto},
                                  {"0", DecodeLoader::kCpAsync},
                                  {"1", DecodeLoader::kTmaTile}},
                                 &t->decode.loader);
     }},
    {"decode-copy", "auto|0|1",
     "split-KV decode TMA stages filled by: 0 TMA boxes, 1 cp.async (default auto)",
     [](std::string_view v, KernelTuning* t) {
       return pick<DecodeStageCopy>(v,
                                    {{"auto", DecodeStageCopy::kAuto},
                                     {"0", DecodeStageCopy::kTmaBoxes},
                                     {"1", DecodeStageCopy::kCpAsync}},
                                    &t->decode.copy);
     }},
    {"decode-fp8-kernel", "auto|0|1|2",
     "split-KV decode over FP8 KV: 0 a converted 16-bit tile, 1 conversion in registers, 2 the "
     "same with a deeper ring (default auto: 1)",
     [](std::string_view v, KernelTuning* t) {
       return pick<DecodeFp8Kernel>(v,
                                    {{"auto", DecodeFp8Kernel::kAuto},
                                     {"0", DecodeFp8Kernel::kConvertTile},
                                     {"1", DecodeFp8Kernel::kRegisters},
                                     {"2", DecodeFp8Kernel::kRegistersDeep}},
                                    &t->decode.fp8_kernel);
     }},
    {"decode-slots", "N", "split-KV decode wave model CTAs per SM (default 0: its own)",
     [](std::string_view v, KernelTuning* t) {
       return positive_int(v, 0, 1 << 10, &t->decode.slots);
     }},
    {"decode-overhead", "N", "split-KV decode wave model CTA cost in keys (default 64)",
     [](std::string_view v, KernelTuning* t) {
       return positive_int(v, 1, 1 << 20, &t->decode.overhead);
     }},
    {"decode-max-q", "N",
     "most queries per sequence the split-KV decode takes (1..16; default 16: verify steps)",
     [](std::string_view v, KernelTuning* t) {
       return positive_int(v, 1, 16, &t->decode.max_q_len);
     }},
    {"attention-kernel", "auto|generic",
     "paged backends' kernel (generic: fp32 P and sums, every call; default auto)",
     [](std::string_view v, KernelTuning* t) {
       return pick<AttentionKernel>(
           v, {{"auto", AttentionKernel::kAuto}, {"generic", AttentionKernel::kGeneric}},
           &t->attention);
     }},
    {"pdl", "1|0", "programmatic dependent launch on sm_90 (default 1)",
     [](std::string_view v, KernelTuning* t) {
       return pick<bool>(v, {{"1", true}, {"0", false}}, &t->pdl);
     }},
};

}  // namespace

bool parse_kernel_tuning_flag(std::string_view name, std::string_view value, KernelTuning* tuning,
                              std::string* error) {
  for (const Flag& f : kFlags) {
    if (f.name != name) continue;
    if (f.apply(value, tuning)) return true;
    if (error)
      *error = "--" + std::string(name) + " " + std::string(value) + ": expected " +
               std::string(f.values);
    return false;
  }
  if (error) *error = "--" + std::string(name) + ": not a kernel tuning flag";
  return false;
}

bool is_kernel_tuning_flag(std::string_view name) {
  for (const Flag& f : kFlags)
    if (f.name == name) return true;
  return false;
}

std::vector<KernelTuningFlag> kernel_tuning_flags() {
  std::vector<KernelTuningFlag> v;
  for (const Flag& f : kFlags) v.push_back({f.name, f.values, f.help});
  return v;
}

std::string kernel_tuning_flags_help() {
  std::string s;
  for (const Flag& f : kFlags) {
    s += "  --" + std::string(f.name) + " " + std::string(f.values) + "\n      " +
         std::string(f.help) + "\n";
  }
  return s;
}

}  // namespace longctx::kernels
