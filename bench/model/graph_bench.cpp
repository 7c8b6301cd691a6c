#include "graph_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <string>

#include "attention/backends/paged_backend.h"
#include "common/bench_util.h"
#include "common/op_profile.h"
#include "decode_profile.h"
#include "engine/cuda_graphs.h"
#include "kernels/cuda/decode.h"
#include "kv/paged_kv_pool.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"
#include "ops/linear.h"

namespace longctx::bench {

namespace {

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int64_t cached = 0;  // tokens whose K/V are in the pool
};

// The forward of each sequence's tokens [cached, size), at most max_new of them (logits of each
// one's last), with blocks from `pool`; the caller advances `cached` after the forward.
ForwardBatch make_batch(std::span<Seq> seqs, PagedKVPool& pool,
                        int64_t max_new = std::numeric_limits<int64_t>::max()) {
  ForwardBatch b;
  b.block_table_indptr.push_back(0);
  const int64_t bs = pool.block_size();
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = seqs[i];
    const int64_t n = std::min(static_cast<int64_t>(s.tokens.size()) - s.cached, max_new);
    const int64_t need = (s.cached + n + bs - 1) / bs;
    if (need > static_cast<int64_t>(s.blocks.size())) {
      auto more = pool.allocate(need - static_cast<int64_t>(s.blocks.size()));
      s.blocks.insert(s.blocks.end(), more.begin(), more.end());
    }
    b.add_sequence(uint64_t(i), s.tokens.data() + s.cached, n, s.cached, true);
    b.block_tables.insert(b.block_tables.end(), s.blocks.begin(), s.blocks.begin() + need);
    b.block_table_indptr.push_back(static_cast<int32_t>(b.block_tables.size()));
    for (int64_t j = s.cached; j < s.cached + n; ++j)
      b.slot_mapping.push_back(int64_t(s.blocks[j / bs]) * bs + j % bs);
  }
  return b;
}

// Copies the K/V of blocks src[i] to dst[i] in every layer, runs of consecutive ids at once.
void copy_blocks(PagedKVPool& pool, const std::vector<int32_t>& src,
                 const std::vector<int32_t>& dst) {
  for (size_t i = 0; i < src.size();) {
    size_t j = i + 1;
    while (j < src.size() && src[j] == src[j - 1] + 1 && dst[j] == dst[j - 1] + 1) ++j;
    const int64_t n = static_cast<int64_t>(j - i);
    for (int64_t l = 0; l < pool.config().num_layers; ++l) {
      pool.k(l).slice(0, dst[i], dst[i] + n).copy_from(pool.k(l).slice(0, src[i], src[i] + n));
      pool.v(l).slice(0, dst[i], dst[i] + n).copy_from(pool.v(l).slice(0, src[i], src[i] + n));
    }
    i = j;
  }
}

struct Times {
  std::vector<double> s;
  void add(double t) { s.push_back(t); }
  double mean() const {
    double t = 0;
    for (double x : s) t += x;
    return s.empty() ? 0 : 1e3 * t / double(s.size());
  }
  double median() {
    std::sort(s.begin(), s.end());
    return s.empty() ? 0 : 1e3 * s[s.size() / 2];
  }
  double min() {
    std::sort(s.begin(), s.end());
    return s.empty() ? 0 : 1e3 * s.front();
  }
};

// Median over `reps` of the GPU time (ms) of `launch`, each timed by events around 10 launches.
template <typename F>
double gpu_ms(F&& launch, int reps = 7) {
  const Device dev = Device::cuda(0);
  cudaStream_t s = static_cast<cudaStream_t>(current_stream(0));
  Event start(dev, true), stop(dev, true);
  launch();  // warm-up
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    start.record_on(s);
    for (int i = 0; i < 10; ++i) launch();
    stop.record_on(s);
    stop.synchronize();
    ms.push_back(stop.elapsed_ms_since(start) / 10);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Where a batch-1 decode step's GPU time goes, part by part (the same kernels the model runs):
// the split-KV decode kernel over kv_len keys (random K/V, pages of `page`) and the GEMV of each
// projection (copies of each weight rotated so that L2 holds none). Prints ms per step.
void time_parts(const ModelConfig& c, int64_t kv_len, int page) {
  const Device dev = Device::cuda(0);
  const int hq = int(c.num_attention_heads), hkv = int(c.num_key_value_heads), d = int(c.head_dim);
  const int64_t layers = c.num_hidden_layers;
  double attn_ms = 0;
  if (d == 64 || d == 128) {
    const int64_t pages = (kv_len + page - 1) / page;
    const int64_t page_elems = int64_t(page) * hkv * d;
    Tensor k = Tensor::empty({pages * page_elems}, DType::kBF16, dev);
    Tensor v = Tensor::empty({pages * page_elems}, DType::kBF16, dev);
    std::mt19937 rng(3);
    std::vector<uint16_t> h(page_elems);
    for (uint16_t& x : h) x = uint16_t(0x3c00 + rng() % 0x200);  // bf16 in [0.0078, 0.03)
    Tensor one = Tensor::from_blob(h.data(), {page_elems}, DType::kBF16);
    for (int64_t p = 0; p < pages; ++p) {
      k.slice(0, p * page_elems, (p + 1) * page_elems).copy_from(one);
      v.slice(0, p * page_elems, (p + 1) * page_elems).copy_from(one);
    }
    Tensor q = k.slice(0, 0, int64_t(hq) * d).contiguous();
    Tensor o = Tensor::empty({int64_t(hq) * d}, DType::kBF16, dev);
    std::vector<int32_t> indptr = {0, int32_t(pages)}, last = {int32_t((kv_len - 1) % page + 1)},
                         ids(pages);
    for (int64_t p = 0; p < pages; ++p) ids[p] = int32_t(p);
    Tensor d_indptr = Tensor::from_blob(indptr.data(), {2}, DType::kI32).to(dev);
    Tensor d_ids = Tensor::from_blob(ids.data(), {pages}, DType::kI32).to(dev);
    Tensor d_last = Tensor::from_blob(last.data(), {1}, DType::kI32).to(dev);
    const size_t ws_bytes = kernels::cuda::decode_workspace_bytes(1, hq, hkv, d);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::kU8, dev);
    cudaStream_t s = static_cast<cudaStream_t>(current_stream(0));
    const kernels::cuda::DecodePlan plan = kernels::cuda::decode_plan(
        indptr.data(), last.data(), 1, page, hq, hkv, d, ws.data_ptr(), ws_bytes, s);
    kernels::DecodeParams prm;
    prm.q = q.data_ptr();
    prm.k_cache = k.data_ptr();
    prm.v_cache = v.data_ptr();
    prm.o = o.data_ptr();
    prm.kv_indptr = d_indptr.data<int32_t>();
    prm.kv_indices = d_ids.data<int32_t>();
    prm.kv_last_page_len = d_last.data<int32_t>();
    prm.batch_size = 1;
    prm.num_qo_heads = hq;
    prm.num_kv_heads = hkv;
    prm.head_dim = d;
    prm.page_size = page;
    prm.dtype = DType::kBF16;
    prm.sm_scale = 1.f / std::sqrt(float(d));
    const double ms = gpu_ms([&] { kernels::cuda::decode_run(prm, plan, s); });
    attn_ms = ms * double(layers);
    std::printf(
        "  attention (split-KV decode, %d work items): %.1f us x %lld layers = %.3f ms "
        "(%.0f GB/s of K+V)\n",
        plan.num_work_items, 1e3 * ms, (long long)layers, attn_ms,
        2.0 * double(kv_len) * hkv * d * 2 / (ms * 1e6));
  }
  const int64_t h = c.hidden_size, qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * d;
  struct Shape2 {
    const char* name;
    int64_t out, in, count;  // count: per step
    DType out_dtype;
  };
  const Shape2 shapes[] = {{"qkv_proj", qkv, h, layers, DType::kBF16},
                           {"o_proj", h, int64_t(hq) * d, layers, DType::kBF16},
                           {"gate_up_proj", 2 * c.intermediate_size, h, layers, DType::kBF16},
                           {"down_proj", h, c.intermediate_size, layers, DType::kBF16},
                           {"lm_head", c.vocab_size, h, 1, DType::kF32}};
  double gemv_ms = 0, bytes = 0;
  for (const Shape2& sh : shapes) {
    const int copies = int(std::max<int64_t>(2, (400ll << 20) / (sh.out * sh.in * 2) + 1));
    std::vector<Tensor> w;
    for (int i = 0; i < copies; ++i) w.push_back(Tensor::empty({sh.out, sh.in}, DType::kBF16, dev));
    Tensor x = w[0].slice(0, 0, 1).contiguous();
    Tensor out = Tensor::empty({1, sh.out}, sh.out_dtype, dev);
    int next = 0;
    const double ms = gpu_ms([&] { ops::linear(x, w[next++ % copies], Tensor(), out); });
    gemv_ms += ms * double(sh.count);
    bytes += double(sh.out * sh.in * 2) * double(sh.count);
    std::printf("  %-12s [%lld, %lld] (%s): %.1f us x %lld = %.3f ms (%.0f GB/s)\n", sh.name,
                (long long)sh.out, (long long)sh.in,
                ops::linear_cuda_plan(x, w[0], Tensor(), out).c_str(), 1e3 * ms,
                (long long)sh.count, ms * double(sh.count), sh.out * sh.in * 2 / (ms * 1e6));
  }
  std::printf(
      "  GEMVs %.3f ms (%.2f GB of weights, %.0f GB/s) + attention %.3f ms = %.3f ms per "
      "token before the row-wise kernels\n",
      gemv_ms, bytes / 1e9, bytes / (gemv_ms * 1e6), attn_ms, gemv_ms + attn_ms);
}

// One batch-1 eager decode step of `seq` op by op, `steps` times (common/op_profile.h): each op's
// median ms per step (summed over its calls, e.g. the layers'), against the bytes it must read
// at the HBM's peak (the weights; attention the K+V of its keys; 0 for row-wise ops, whose floor
// is a launch). The graph rows below give the real step.
void op_profile(Model& model, AttentionBackend& attn, PagedKVPool& pool, Seq& seq,
                std::mt19937& rng, int steps) {
  const ModelConfig& c = model.config();
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  EventOpTimer timer(model.device());
  const OpProfile profile = profile_steps(
      model, timer, steps,
      [&] {
        seq.tokens.push_back(tok(rng));
        model.forward(make_batch({&seq, 1}, pool), attn);
        seq.cached = static_cast<int64_t>(seq.tokens.size());
      },
      [&](StepOps& ops) {  // the bf16 pool's K and V of every key
        add_attention_kv_bytes(ops, double(seq.tokens.size()), c.num_key_value_heads, c.head_dim,
                               2.0);
      });
  print_op_profile(
      profile, fmt::format("a batch-1 eager decode step after {} tokens", seq.tokens.size() - 1),
      model.device().index);
}

}  // namespace

int run_graph_bench(std::shared_ptr<Model> model, const GraphBenchArgs& a) {
  try {
    const ModelConfig& c = model->config();
    const int64_t bs = a.block_size;
    const int64_t max_b = *std::max_element(a.batches.begin(), a.batches.end());
    // Sequence 0 decodes in every batch size, 2 x decode_steps tokens each (eager + graphs).
    const int64_t max_len = a.context + 2 * int64_t(a.decode_steps) * int64_t(a.batches.size()) +
                            a.op_profile_steps + 2;
    const int64_t per_seq = (max_len + bs - 1) / bs;
    const int64_t warm = std::min<int64_t>(4096, a.context);
    const int64_t num_blocks = max_b * per_seq + std::max<int64_t>(0, (warm + bs - 1) / bs) + 1;
    PagedKVPool pool({c.num_hidden_layers, c.num_key_value_heads, c.head_dim, bs, num_blocks,
                      model->activation_dtype(), model->device()});
    PagedBackendLimits limits;
    limits.max_tokens = std::max(a.max_num_batched_tokens, max_b);
    limits.max_seqs = max_b;
    limits.max_blocks = num_blocks + max_b;
    auto attn = make_paged_attention_backend(pool, c.num_attention_heads, model->attention_scale(),
                                             limits, {}, a.tuning);
    const int32_t scratch = pool.allocate(1)[0];
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));

    auto prefill = [&](Seq& s) {  // chunks of max_num_batched_tokens, logits to the host
      const int64_t n = static_cast<int64_t>(s.tokens.size());
      while (s.cached < n) {
        model->forward(make_batch({&s, 1}, pool, a.max_num_batched_tokens), *attn)
            .to(Device::cpu());
        s.cached = std::min(n, s.cached + a.max_num_batched_tokens);
      }
    };
    {  // Warm-up: kernels' first launch, cuBLASLt heuristics, pool growth.
      Seq w;
      for (int64_t i = 0; i < warm; ++i) w.tokens.push_back(tok(rng));
      prefill(w);
      pool.free(w.blocks);
    }
    std::vector<Seq> seqs(max_b);
    for (int64_t i = 0; i < a.context; ++i) seqs[0].tokens.push_back(tok(rng));
    device_synchronize(0);
    const double t0 = now_seconds();
    prefill(seqs[0]);
    const double t_prefill = now_seconds() - t0;
    std::printf("prefill %lld tokens: %.3f s, %.0f tok/s (chunk %lld, block %lld)\n",
                (long long)a.context, t_prefill, a.context / t_prefill,
                (long long)a.max_num_batched_tokens, (long long)bs);
    // The other sequences decode over their own copies of the prompt's KV.
    for (int64_t i = 1; i < max_b; ++i) {
      seqs[i].tokens = seqs[0].tokens;
      seqs[i].blocks = pool.allocate(static_cast<int64_t>(seqs[0].blocks.size()));
      copy_blocks(pool, seqs[0].blocks, seqs[i].blocks);
      seqs[i].cached = seqs[0].cached;
    }
    device_synchronize(0);

    DecodeGraphOptions go;
    go.max_num_seqs = max_b;
    go.scratch_block = scratch;
    go.max_blocks = limits.max_blocks;
    DecodeGraphs graphs(*model, *attn, pool, go);
    graphs.capture();
    std::printf(
        "CUDA graphs: %zu buckets (up to %lld) captured in %.2f s, %s of device memory "
        "(plan estimate %s)\n",
        graphs.buckets().size(), (long long)graphs.buckets().back(), graphs.capture_seconds(),
        format_bytes(graphs.memory_bytes()).c_str(),
        format_bytes(decode_graph_memory_bytes(c, graphs.buckets().back())).c_str());
    std::fflush(stdout);
    std::printf("parts of a batch-1 decode step after %lld tokens, timed alone:\n",
                (long long)a.context);
    time_parts(c, a.context, int(bs));
    std::fflush(stdout);
    if (a.op_profile_steps > 0) op_profile(*model, *attn, pool, seqs[0], rng, a.op_profile_steps);

    const Device dev = Device::cuda(0);
    Event start(dev, true), stop(dev, true);
    for (int64_t b : a.batches) {
      // Per mode: wall time of the step (batch build to logits on the host), GPU time from
      // before the first copy of plan() to after the last kernel, host time until the forward
      // (eager: every launch) or the replay (graphs: padding, plan, copies, launch) returned.
      Times wall[2], gpu[2], host[2];
      const int64_t updates0 = graphs.grid_updates();
      for (int step = 0; step < 2 * a.decode_steps; ++step) {
        const int mode = step % 2;  // alternate: both modes see the same contexts
        for (int64_t i = 0; i < b; ++i) seqs[i].tokens.push_back(tok(rng));
        const double t1 = now_seconds();
        ForwardBatch batch = make_batch({seqs.data(), size_t(b)}, pool);
        start.record_on(current_stream(0));
        Tensor logits = mode == 1 ? graphs.run(batch) : model->forward(batch, *attn);
        stop.record_on(current_stream(0));
        const double t2 = now_seconds();
        Tensor on_host = logits.to(Device::cpu());
        wall[mode].add(now_seconds() - t1);
        host[mode].add(t2 - t1);
        gpu[mode].add(1e-3 * stop.elapsed_ms_since(start));
        for (int64_t i = 0; i < b; ++i)
          seqs[i].cached = static_cast<int64_t>(seqs[i].tokens.size());
      }
      const double em = wall[0].mean(), gm = wall[1].mean();
      std::printf(
          "decode after %lld tokens, batch %lld (%d steps each): eager %.3f ms/step mean "
          "(%.3f median, %.3f min); CUDA graphs %.3f mean (%.3f median, %.3f min): "
          "%.2fx, %.0f tok/s\n",
          (long long)a.context, (long long)b, a.decode_steps, em, wall[0].median(), wall[0].min(),
          gm, wall[1].median(), wall[1].min(), em / gm, 1e3 * double(b) / gm);
      std::printf(
          "  GPU time per step: eager %.3f ms, graphs %.3f ms; host time until the "
          "forward returned: eager %.3f ms, graphs %.3f ms; %lld decode-grid updates\n",
          gpu[0].mean(), gpu[1].mean(), host[0].mean(), host[1].mean(),
          (long long)(graphs.grid_updates() - updates0));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model --cuda-graphs: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace longctx::bench
