// Split-KV batch decode (see decode.h). Layout of one CTA (128 threads):
//   a token's head_dim is spread over LPT = D / 8 lanes (16-byte loads, 8 elements per lane), so
//   a warp covers 32 / LPT tokens at once; each such lane group walks kTile consecutive tokens per
//   step (independent loads in flight), and keeps its own online-softmax state for every q head
//   of the CTA's kv group. The groups' states are merged through shared memory at the end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/decode.h"
#include "kernels/cuda/merge_device.cuh"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kTile = 4;       // tokens per lane group per step
constexpr int kMaxGroup = 8;   // q heads per CTA (larger GQA groups take several CTAs)
constexpr int kCtasPerSm = 8;  // split target: about this many CTAs per SM
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct DecodeArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  const int32_t* kv_indptr;
  const int32_t* kv_indices;
  const int32_t* work;  // [num_work, 4]
  float* partial_o;
  float* partial_lse;
  int num_qo_heads, num_kv_heads, group, head_tiles, page_size;
  float scale_log2;  // sm_scale * log2(e): scores live in the log2 domain
};

__device__ __forceinline__ void unpack8(const uint4& r, float* f, const __nv_bfloat16*) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack8(const uint4& r, float* f, const __half*) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h = *reinterpret_cast<const __half2*>(&w[i]);
    float2 x = __half22float2(h);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

template <typename T, int D, int GT>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(DecodeArgs a) {
  constexpr int LPT = D / 8;                 // lanes per token
  constexpr int TPW = 32 / LPT;              // lane groups per warp
  constexpr int NG = (kThreads / 32) * TPW;  // lane groups per CTA
  constexpr int STEP = NG * kTile;           // tokens per CTA step
  __shared__ float s_m[NG][GT];
  __shared__ float s_l[NG][GT];
  __shared__ float s_acc[NG][GT][D];

  const int4 item = reinterpret_cast<const int4*>(a.work)[blockIdx.x];
  const int b = item.x, kv_begin = item.y, kv_end = item.z, slot = item.w;
  if (b < 0) return;  // padding item
  const int kvh = blockIdx.y / a.head_tiles;
  const int tile = blockIdx.y % a.head_tiles;
  const int h0 = kvh * a.group + tile * GT;
  const int nh = min(GT, a.group - tile * GT);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int li = lane % LPT;
  const int grp = warp * TPW + lane / LPT;
  const T* q = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);

  float qf[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    if (g < nh) {
      uint4 r =
          *reinterpret_cast<const uint4*>(q + (int64_t(b) * a.num_qo_heads + h0 + g) * D + li * 8);
      unpack8(r, qf[g], q);
#pragma unroll
      for (int e = 0; e < 8; ++e) qf[g][e] *= a.scale_log2;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) qf[g][e] = 0.f;
    }
  }
  float m[GT], l[GT], acc[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }

  const int32_t* pages = a.kv_indices + a.kv_indptr[b];
  const int ps = a.page_size;
  // The loop bound is warp-uniform (the warp's first token), so every lane reaches the
  // shuffles below; lane groups past kv_end just see masked tokens.
  const int warp_first = kv_begin + warp * TPW * kTile;
  const int grp_off = (lane / LPT) * kTile;
  for (int tw = warp_first; tw < kv_end; tw += STEP) {
    const int t0 = tw + grp_off;
    uint4 kr[kTile], vr[kTile];
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      const int t = t0 + i;
      if (t < kv_end) {
        const int64_t page = pages[t / ps];
        const int64_t off = ((page * ps + t % ps) * a.num_kv_heads + kvh) * D + li * 8;
        kr[i] = __ldg(reinterpret_cast<const uint4*>(kc + off));
        vr[i] = __ldg(reinterpret_cast<const uint4*>(vc + off));
      } else {
        kr[i] = make_uint4(0, 0, 0, 0);
        vr[i] = make_uint4(0, 0, 0, 0);
      }
    }
    float s[GT][kTile];
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      float kf[8];
      unpack8(kr[i], kf, q);
#pragma unroll
      for (int g = 0; g < GT; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(qf[g][e], kf[e], dot);
        s[g][i] = dot;
      }
    }
#pragma unroll
    for (int g = 0; g < GT; ++g) {
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
#pragma unroll
        for (int off = LPT / 2; off > 0; off >>= 1)
          s[g][i] += __shfl_xor_sync(0xffffffffu, s[g][i], off);
        if (t0 + i >= kv_end) s[g][i] = -INFINITY;
      }
    }
    float vf[kTile][8];
#pragma unroll
    for (int i = 0; i < kTile; ++i) unpack8(vr[i], vf[i], q);
#pragma unroll
    for (int g = 0; g < GT; ++g) {
      float mx = m[g];
#pragma unroll
      for (int i = 0; i < kTile; ++i) mx = fmaxf(mx, s[g][i]);
      // -inf when this group has seen no token yet (all masked): keep exp2 away from NaN.
      const float base = mx == -INFINITY ? 0.f : mx;
      const float scale = exp2f(m[g] - base);
      m[g] = mx;
      float p[kTile];
      float psum = 0.f;
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
        p[i] = exp2f(s[g][i] - base);
        psum += p[i];
      }
      l[g] = l[g] * scale + psum;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float x = acc[g][e] * scale;
#pragma unroll
        for (int i = 0; i < kTile; ++i) x = fmaf(p[i], vf[i][e], x);
        acc[g][e] = x;
      }
    }
  }

  // Merge the lane groups' states.
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    if (li == 0) {
      s_m[grp][g] = m[g];
      s_l[grp][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) s_acc[grp][g][li * 8 + e] = acc[g][e];
  }
  __syncthreads();
  T* o = static_cast<T*>(a.o);
  for (int idx = threadIdx.x; idx < nh * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NG; ++j) mx = fmaxf(mx, s_m[j][g]);
    float sum = 0.f, out = 0.f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int j = 0; j < NG; ++j) {
        const float w = exp2f(s_m[j][g] - mx);  // empty groups: exp2(-inf) = 0
        sum += s_l[j][g] * w;
        out += s_acc[j][g][d] * w;
      }
      out /= sum;
    }
    const float lse = mx == -INFINITY ? -INFINITY : (mx + log2f(sum)) * kLn2;
    const int h = h0 + g;
    if (slot < 0) {
      o[(int64_t(b) * a.num_qo_heads + h) * D + d] = detail::from_f32<T>(out);
      if (d == 0 && a.lse) a.lse[int64_t(b) * a.num_qo_heads + h] = lse;
    } else {
      a.partial_o[(int64_t(slot) * a.num_qo_heads + h) * D + d] = out;
      if (d == 0) a.partial_lse[int64_t(slot) * a.num_qo_heads + h] = lse;
    }
  }
}

// Folds the partial states of every split request into o/lse: one CTA per (request, q head).
// Requests split into many chunks have tens of states, so the states are spread over the CTA's
// threads (each of kParts partitions of the threads sums a strided subset of the states for its
// head_dim slice) instead of one long dependent loop per lane.
template <typename T>
__global__ void __launch_bounds__(128)
    decode_merge_kernel(const float* partial_o, const float* partial_lse,
                        const int32_t* merge_indptr, T* o, float* lse, int num_heads,
                        int head_dim) {
  __shared__ float s_part[128];
  __shared__ float s_red[2];
  const int b = blockIdx.x / num_heads, h = blockIdx.x % num_heads;
  const int s0 = merge_indptr[b], n = merge_indptr[b + 1] - s0;
  if (n == 0) return;  // written directly by the split kernel
  const int tid = threadIdx.x;
  auto lse_at = [&](int s) { return partial_lse[int64_t(s0 + s) * num_heads + h]; };
  if (tid < 32) {  // max and sum of weights over the states, one warp
    float mx = -INFINITY;
    for (int s = tid; s < n; s += 32) mx = fmaxf(mx, lse_at(s));
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    if (mx != -INFINITY)
      for (int s = tid; s < n; s += 32) sum += __expf(lse_at(s) - mx);
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (tid == 0) {
      s_red[0] = mx;
      s_red[1] = sum;
    }
  }
  __syncthreads();
  const float mx = s_red[0], sum = s_red[1];
  const int parts = 128 / head_dim;  // 1 (D = 128) or 2 (D = 64)
  const int part = tid / head_dim, d = tid % head_dim;
  float acc = 0.f;
  if (mx != -INFINITY && part < parts) {
#pragma unroll 8
    for (int s = part; s < n; s += parts) {
      const float l = lse_at(s);
      if (l != -INFINITY)
        acc += __expf(l - mx) * partial_o[(int64_t(s0 + s) * num_heads + h) * head_dim + d];
    }
  }
  s_part[tid] = acc;
  __syncthreads();
  if (tid < head_dim) {
    float total = 0.f;
    for (int q = 0; q < parts; ++q) total += s_part[q * head_dim + tid];
    const int64_t row = int64_t(b) * num_heads + h;
    o[row * head_dim + tid] = detail::from_f32<T>(mx == -INFINITY ? 0.f : total / sum);
    if (tid == 0 && lse) lse[row] = mx == -INFINITY ? -INFINITY : mx + __logf(sum);
  }
}

int current_sm_count() {
  int dev = 0, sms = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&dev));
  LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

int head_tiles_of(int group) { return (group + kMaxGroup - 1) / kMaxGroup; }

// Work items the plan may create: sum_b ceil(len_b / chunk) <= batch + total / chunk, and the
// chunk is chosen so that total / chunk <= target.
int64_t max_work_items(int max_batch, int num_kv_heads, int group, int num_sms) {
  int64_t ctas_per_item = int64_t(num_kv_heads) * head_tiles_of(group);
  int64_t target = (int64_t(num_sms) * kCtasPerSm + ctas_per_item - 1) / ctas_per_item;
  return int64_t(max_batch) + target;
}

size_t align_up(size_t x) { return (x + 255) & ~size_t(255); }

struct WorkspaceLayout {
  size_t work = 0, merge = 0, po = 0, plse = 0, total = 0;
};

WorkspaceLayout layout_of(int batch, int64_t max_items, int num_qo_heads, int head_dim) {
  WorkspaceLayout w;
  w.work = 0;
  w.merge = align_up(w.work + sizeof(int32_t) * 4 * max_items);
  w.po = align_up(w.merge + sizeof(int32_t) * (batch + 1));
  w.plse = align_up(w.po + sizeof(float) * max_items * num_qo_heads * head_dim);
  w.total = align_up(w.plse + sizeof(float) * max_items * num_qo_heads);
  return w;
}

void check_shape(int num_qo_heads, int num_kv_heads, int head_dim) {
  LONGCTX_CHECK(num_qo_heads > 0 && num_kv_heads > 0 && num_qo_heads % num_kv_heads == 0,
                ErrorCode::kUnsupported,
                "decode: num_qo_heads {} is not a positive multiple of num_kv_heads {}",
                num_qo_heads, num_kv_heads);
  LONGCTX_CHECK(head_dim == 64 || head_dim == 128, ErrorCode::kUnsupported,
                "decode: head_dim {} not supported (64 or 128)", head_dim);
}

template <typename T, int D>
void launch_split(const DecodeArgs& a, dim3 grid, int group, cudaStream_t stream) {
  const int gt = std::min(group, kMaxGroup);
  if (gt <= 1)
    decode_split_kernel<T, D, 1><<<grid, kThreads, 0, stream>>>(a);
  else if (gt <= 2)
    decode_split_kernel<T, D, 2><<<grid, kThreads, 0, stream>>>(a);
  else if (gt <= 4)
    decode_split_kernel<T, D, 4><<<grid, kThreads, 0, stream>>>(a);
  else
    decode_split_kernel<T, D, 8><<<grid, kThreads, 0, stream>>>(a);
  LONGCTX_CUDA_CHECK_LAUNCH("decode_split_kernel");
}

template <typename T>
void run_typed(const DecodeParams& p, const DecodePlan& plan, cudaStream_t stream) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  // With GT < group (group not a multiple of 8 above 8), head_tiles covers the rest.
  const int gt = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : kMaxGroup;
  DecodeArgs a{p.q,
               p.k_cache,
               p.v_cache,
               p.o,
               p.lse,
               p.kv_indptr,
               p.kv_indices,
               plan.work_items,
               plan.partial_o,
               plan.partial_lse,
               p.num_qo_heads,
               p.num_kv_heads,
               group,
               (group + gt - 1) / gt,
               p.page_size,
               p.sm_scale * kLog2e};
  dim3 grid(unsigned(plan.num_work_items), unsigned(p.num_kv_heads * a.head_tiles));
  if (p.head_dim == 64)
    launch_split<T, 64>(a, grid, group, stream);
  else
    launch_split<T, 128>(a, grid, group, stream);
  if (plan.num_partials > 0) {
    const int64_t items = int64_t(p.batch_size) * p.num_qo_heads;
    decode_merge_kernel<T><<<unsigned(items), 128, 0, stream>>>(
        plan.partial_o, plan.partial_lse, plan.merge_indptr, static_cast<T*>(p.o), p.lse,
        p.num_qo_heads, p.head_dim);
    LONGCTX_CUDA_CHECK_LAUNCH("decode_merge_kernel");
  }
}

}  // namespace

size_t decode_workspace_bytes(int max_batch, int num_qo_heads, int num_kv_heads, int head_dim,
                              int num_sms) {
  check_shape(num_qo_heads, num_kv_heads, head_dim);
  if (num_sms <= 0) num_sms = current_sm_count();
  int64_t items = max_work_items(max_batch, num_kv_heads, num_qo_heads / num_kv_heads, num_sms);
  return layout_of(max_batch, items, num_qo_heads, head_dim).total;
}

DecodePlan decode_plan(const int32_t* kv_indptr, const int32_t* last_page_len, int batch,
                       int page_size, int num_qo_heads, int num_kv_heads, int head_dim,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream, int num_sms,
                       int min_chunk_tokens) {
  check_shape(num_qo_heads, num_kv_heads, head_dim);
  LONGCTX_CHECK(batch >= 0 && page_size >= 1, ErrorCode::kInvalidArgument,
                "decode_plan: batch {} / page_size {} invalid", batch, page_size);
  if (num_sms <= 0) num_sms = current_sm_count();
  const int group = num_qo_heads / num_kv_heads;
  std::vector<int64_t> len(batch);
  int64_t total = 0;
  for (int b = 0; b < batch; ++b) {
    const int32_t pages = kv_indptr[b + 1] - kv_indptr[b];
    LONGCTX_CHECK(pages >= 0, ErrorCode::kInvalidArgument, "decode_plan: kv_indptr decreases at {}",
                  b);
    LONGCTX_CHECK(pages == 0 || (last_page_len[b] >= 1 && last_page_len[b] <= page_size),
                  ErrorCode::kInvalidArgument,
                  "decode_plan: kv_last_page_len[{}] = {} not in [1, {}]", b, last_page_len[b],
                  page_size);
    len[b] = pages == 0 ? 0 : int64_t(pages - 1) * page_size + last_page_len[b];
    total += len[b];
  }
  const int64_t max_items = max_work_items(batch, num_kv_heads, group, num_sms);
  const int64_t target = max_items - batch;
  // Chunk: spread the total KV over ~target work items, but never below min_chunk_tokens (a
  // chunk's fixed cost: q load, state merge, partial write) and in whole CTA steps.
  int64_t chunk =
      std::max<int64_t>(min_chunk_tokens, (total + target - 1) / std::max<int64_t>(target, 1));
  chunk = (chunk + 63) / 64 * 64;
  LONGCTX_ASSERT(total / chunk <= target, "decode chunking exceeds its bound");

  std::vector<int32_t> work;
  std::vector<int32_t> merge_indptr(batch + 1, 0);
  int32_t slots = 0;
  for (int b = 0; b < batch; ++b) {
    // Even splits of this request (not chunk, chunk, ..., remainder): same count, no straggler.
    int64_t splits = std::max<int64_t>(1, (len[b] + chunk - 1) / chunk);
    const int64_t sub = std::max<int64_t>(64, ((len[b] + splits - 1) / splits + 63) / 64 * 64);
    splits = std::max<int64_t>(1, (len[b] + sub - 1) / sub);
    for (int64_t s = 0; s < splits; ++s) {
      work.push_back(b);
      work.push_back(int32_t(s * sub));
      work.push_back(int32_t(std::min(len[b], (s + 1) * sub)));
      work.push_back(splits == 1 ? -1 : slots + int32_t(s));
    }
    if (splits > 1) slots += int32_t(splits);
    merge_indptr[b + 1] = slots;
  }
  const int64_t items = int64_t(work.size()) / 4;
  LONGCTX_ASSERT(items <= max_items, "decode work items {} exceed the bound {}", items, max_items);
  const WorkspaceLayout w = layout_of(batch, max_items, num_qo_heads, head_dim);
  LONGCTX_CHECK(workspace != nullptr && workspace_bytes >= w.total, ErrorCode::kInvalidArgument,
                "decode_plan: workspace of {} bytes, need {} (decode_workspace_bytes)",
                workspace_bytes, w.total);
  char* base = static_cast<char*>(workspace);
  if (items > 0)
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(base + w.work, work.data(), sizeof(int32_t) * work.size(),
                                       cudaMemcpyHostToDevice, stream));
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(base + w.merge, merge_indptr.data(),
                                     sizeof(int32_t) * merge_indptr.size(), cudaMemcpyHostToDevice,
                                     stream));
  DecodePlan plan;
  plan.batch_size = batch;
  plan.num_qo_heads = num_qo_heads;
  plan.num_kv_heads = num_kv_heads;
  plan.head_dim = head_dim;
  plan.page_size = page_size;
  plan.chunk_tokens = int(chunk);
  plan.num_work_items = int(items);
  plan.num_partials = slots;
  plan.work_items = reinterpret_cast<const int32_t*>(base + w.work);
  plan.merge_indptr = reinterpret_cast<const int32_t*>(base + w.merge);
  plan.partial_o = reinterpret_cast<float*>(base + w.po);
  plan.partial_lse = reinterpret_cast<float*>(base + w.plse);
  return plan;
}

void decode_run(const DecodeParams& p, const DecodePlan& plan, cudaStream_t stream) {
  LONGCTX_CHECK(p.batch_size == plan.batch_size && p.num_qo_heads == plan.num_qo_heads &&
                    p.num_kv_heads == plan.num_kv_heads && p.head_dim == plan.head_dim &&
                    p.page_size == plan.page_size,
                ErrorCode::kInvalidArgument,
                "decode_run: params (batch {}, heads {}/{}, dim {}, page {}) differ from the plan",
                p.batch_size, p.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size);
  if (plan.num_work_items == 0) return;
  switch (p.dtype) {
    case DType::kBF16:
      return run_typed<__nv_bfloat16>(p, plan, stream);
    case DType::kF16:
      return run_typed<__half>(p, plan, stream);
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "decode_run: dtype {} not bf16/f16",
                    dtype_name(p.dtype));
  }
}

}  // namespace longctx::kernels::cuda
