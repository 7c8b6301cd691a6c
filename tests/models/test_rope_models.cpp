// The RoPE variants through the model (tiny-llama dummy weights): a step of several sequences
// gives each what it gets alone (longrope's table and dynamic NTK's base are chosen per
// sequence), and a sequence's choice follows the length its step reaches: a prompt past the
// switch in one forward differs from the same prompt prefilled short and decoded past it (the
// cached keys keep the short rotation, as in transformers), where fixed ropes agree.
#include <gtest/gtest.h>

#include <cmath>

#include "attention/backends/cpu_backend.h"
#include "longctx/engine/reference_forward.h"
#include "longctx/loader/checkpoint.h"
#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

std::unique_ptr<Model> tiny_model(const RopeConfig& rope) {
  ModelConfig c = dummy_preset_config("tiny-llama");
  c.rope = rope;
  c.max_position_embeddings = 4096;
  if (rope.type == RopeType::kDynamic) c.max_position_embeddings = rope.max_position_embeddings;
  auto ck = std::make_shared<Checkpoint>(make_dummy_checkpoint(c, 11));
  return create_model(std::move(ck));
}

RopeConfig longrope(double partial) {
  RopeConfig r;
  r.type = RopeType::kLongrope;
  r.theta = 10000;
  r.original_max_position_embeddings = 16;
  r.factor = 4096.0 / 16;
  r.partial_rotary_factor = partial;
  const int64_t half = int64_t(16 * partial) / 2;
  for (int64_t i = 0; i < half; ++i) {
    r.short_factor.push_back(1.0 + 0.1 * i);
    r.long_factor.push_back(1.0 + 8.0 * i);
  }
  return r;
}

RopeConfig dynamic() {
  RopeConfig r;
  r.type = RopeType::kDynamic;
  r.theta = 10000;
  r.factor = 8;
  r.max_position_embeddings = 16;
  return r;
}

RopeConfig yarn() {
  RopeConfig r;
  r.type = RopeType::kYarn;
  r.theta = 10000;
  r.factor = 4;
  r.original_max_position_embeddings = 16;
  return r;
}

struct Variant {
  const char* name;
  RopeConfig rope;
  bool length_dependent;
};

std::vector<Variant> variants() {
  return {{"longrope", longrope(1.0), true},
          {"longrope partial 0.5", longrope(0.5), true},
          {"dynamic", dynamic(), true},
          {"yarn", yarn(), false}};
}

TEST(RopeModels, MixedBatchEqualsOneAtATime) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    auto model = tiny_model(v.rope);
    const int64_t vocab = model->config().vocab_size;
    // (cached, new): a prompt past the switch, a decode past it, a short prompt, a chunk that
    // crosses it after a short prefix, one token.
    const std::vector<std::pair<int64_t, int64_t>> shapes = {
        {0, 37}, {20, 1}, {0, 9}, {10, 12}, {0, 1}};
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::unique_ptr<KVCache>> caches, alone_caches;
    for (size_t s = 0; s < shapes.size(); ++s) {
      const auto [cached, n] = shapes[s];
      ids.push_back(make_ids(cached + n, s, 500));
      caches.push_back(std::make_unique<KVCache>(model->config(), cached + n));
      alone_caches.push_back(std::make_unique<KVCache>(model->config(), cached + n));
      if (cached > 0) {
        std::span<const int32_t> prefix(ids[s].data(), cached);
        reference_forward(*model, prefix, iota_positions(0, cached), *caches[s]);
        reference_forward(*model, prefix, iota_positions(0, cached), *alone_caches[s]);
      }
    }
    ForwardBatch batch;
    std::vector<KVCache*> ptrs;
    for (size_t s = 0; s < shapes.size(); ++s) {
      const auto [cached, n] = shapes[s];
      batch.add_sequence(s, ids[s].data() + cached, n, cached, true);
      ptrs.push_back(caches[s].get());
    }
    CpuAttentionBackend attention(ptrs, model->attention_scale());
    Tensor together = model->forward(batch, attention);
    attention.commit();
    for (size_t s = 0; s < shapes.size(); ++s) {
      const auto [cached, n] = shapes[s];
      std::span<const int32_t> news(ids[s].data() + cached, n);
      Tensor alone =
          reference_forward(*model, news, iota_positions(cached, n), *alone_caches[s], true);
      EXPECT_LE(max_abs_diff(alone.data<float>(), together.data<float>() + s * vocab, vocab), 1e-4)
          << "sequence " << s;
    }
  }
}

TEST(RopeModels, ChoiceFollowsTheStepsLength) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    auto model = tiny_model(v.rope);
    const int64_t vocab = model->config().vocab_size, n = 30, head = 10;
    std::vector<int32_t> ids = make_ids(n, 3, 500);
    auto one_cache = std::make_unique<KVCache>(model->config(), n);
    Tensor one = reference_forward(*model, ids, iota_positions(0, n), *one_cache, true);
    auto inc_cache = std::make_unique<KVCache>(model->config(), n);
    Tensor inc = reference_forward(*model, std::span<const int32_t>(ids.data(), head),
                                   iota_positions(0, head), *inc_cache, true);
    for (int64_t p = head; p < n; ++p) {
      std::vector<int32_t> tok = {ids[p]};
      std::vector<int64_t> pos = {p};
      inc = reference_forward(*model, tok, pos, *inc_cache, true);
    }
    const double d = max_abs_diff(one.data<float>(), inc.data<float>(), vocab);
    if (v.length_dependent)
      EXPECT_GT(d, 1e-4) << "the prefix decoded short must differ from a one-shot long prompt";
    else
      EXPECT_LE(d, 1e-5) << "a fixed rope must not depend on how the prompt was split";
    std::printf("%s: one-shot vs incremental max |logit diff| %.3g\n", v.name, d);
  }
}

TEST(RopeModels, PositionsPastTheNativeContext) {
  // yarn reaches factor x original; past max_positions() is an error naming the limit.
  RopeConfig r = yarn();
  ModelConfig c = dummy_preset_config("tiny-llama");
  c.rope = r;
  c.max_position_embeddings = 32;  // 4 x 16 = 64 with yarn
  EXPECT_EQ(c.max_positions(), 64);
  auto model = create_model(std::make_shared<Checkpoint>(make_dummy_checkpoint(c, 12)));
  auto cache = std::make_unique<KVCache>(model->config(), 70);
  std::vector<int32_t> ids = make_ids(64, 1, 500);
  EXPECT_NO_THROW(reference_forward(*model, ids, iota_positions(0, 64), *cache, true));
  std::vector<int32_t> one = {1};
  std::vector<int64_t> pos = {64};
  EXPECT_THROW(reference_forward(*model, one, pos, *cache, true), Error);
}

}  // namespace
}  // namespace longctx::testing
