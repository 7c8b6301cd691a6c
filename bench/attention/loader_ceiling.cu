#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "kernels/cuda/mma_device.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/tma_device.cuh"
#include "loader_ceiling.h"
#include "longctx/core/cuda_check.h"

namespace longctx::bench {

namespace {

using kernels::cuda::detail::cp_async_16;
using kernels::cuda::detail::mbar_arrive_cp_async;
using kernels::cuda::detail::mbar_arrive_expect_tx;
using kernels::cuda::detail::mbar_init;
using kernels::cuda::detail::mbar_init_fence;
using kernels::cuda::detail::mbar_wait;
using kernels::cuda::detail::smem_addr;
using kernels::cuda::detail::tma_load_3d;

constexpr int kHeads = 8;
constexpr int kRowBytes = 256;                   // one kv head's token row (128 dims of bf16)
constexpr int kTokenBytes = kHeads * kRowBytes;  // a whole token row of the cache
constexpr int kMaxStages = 8;
constexpr int kMaxCtasPerSm = 32;  // the SM's limit; sizes the sink

enum class Kind { kTma, kBulk, kCpa, kCpaWhole, kRegs };
constexpr struct {
  const char* name;
  Kind kind;
} kKinds[] = {{"tma", Kind::kTma},
              {"bulk", Kind::kBulk},
              {"cpa", Kind::kCpa},
              {"cpaw", Kind::kCpaWhole},
              {"regs", Kind::kRegs}};

// The kind named `name`; false for none.
bool kind_of(const std::string& name, Kind* out) {
  for (const auto& k : kKinds)
    if (name == k.name) {
      *out = k.kind;
      return true;
    }
  return false;
}

struct LoaderArgs {
  const uint8_t* k;  // [slots, 8, 128] bf16, the whole buffer
  const uint8_t* v;  // same
  int64_t slot0;     // the window's first slot
  int64_t slots;     // slots in the window
  int tile, stages;
  uint32_t* sink;  // [grid]
};

__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}

// The CTA's tiles: per-head kinds split each head's tiles over gridDim / 8 CTAs, whole-row kinds
// split all tiles over the grid.
__device__ __forceinline__ bool cta_range(bool per_head, int64_t n_tiles, int& head, int64_t& t0,
                                          int64_t& t1) {
  const int groups = per_head ? int(gridDim.x) / kHeads : int(gridDim.x);
  const int g = per_head ? int(blockIdx.x) / kHeads : int(blockIdx.x);
  head = per_head ? int(blockIdx.x) % kHeads : 0;
  if (g >= groups) return false;
  t0 = n_tiles * g / groups;
  t1 = n_tiles * (g + 1) / groups;
  return true;
}

template <Kind K>
__global__ void ring_kernel(const LoaderArgs a, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v) {
#ifdef LONGCTX_TMA_DEVICE
  constexpr bool kPerHead = K == Kind::kTma || K == Kind::kCpa;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const int tile = a.tile, stages = a.stages;
  const int half = tile * (kPerHead ? kRowBytes : kTokenBytes);  // K (or V) bytes of a stage
  const uint32_t base = smem_addr(smem);
  auto bar = [&](int st) { return smem_addr(&full[st]); };
  if (threadIdx.x == 0) {
    for (int st = 0; st < stages; ++st)
      mbar_init(bar(st), K == Kind::kCpa || K == Kind::kCpaWhole ? int(blockDim.x) : 1);
    mbar_init_fence();
  }
  __syncthreads();
  int head = 0;
  int64_t t0 = 0, t1 = 0;
  if (!cta_range(kPerHead, a.slots / tile, head, t0, t1)) return;
  const int64_t n = t1 - t0;
  auto issue = [&](int64_t t) {
    const int st = int(t % stages);
    const uint32_t dk = base + uint32_t(st) * 2 * half, dv = dk + half;
    const int64_t slot = a.slot0 + (t0 + t) * tile;
    if constexpr (K == Kind::kTma) {
      if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar(st), 2 * half);
        for (int h = 0; h < 2; ++h) {
          tma_load_3d(dk + h * tile * 128, &tm_k, bar(st), h * 64, head, int(slot));
          tma_load_3d(dv + h * tile * 128, &tm_v, bar(st), h * 64, head, int(slot));
        }
      }
    } else if constexpr (K == Kind::kBulk) {
      if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar(st), 2 * half);
        bulk_load(dk, a.k + slot * kTokenBytes, half, bar(st));
        bulk_load(dv, a.v + slot * kTokenBytes, half, bar(st));
      }
    } else {
      const int chunks = 2 * half / 16;
      for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        const int kv = c >= chunks / 2, cc = kv ? c - chunks / 2 : c;
        const uint8_t* src = kv ? a.v : a.k;
        if constexpr (K == Kind::kCpa)
          src += (slot + cc / 16) * kTokenBytes + head * kRowBytes + (cc % 16) * 16;
        else
          src += slot * kTokenBytes + int64_t(cc) * 16;
        cp_async_16(dk + uint32_t(c) * 16, src, 16);
      }
      mbar_arrive_cp_async(bar(st));
    }
  };
  for (int st = 0; st < stages - 1 && st < n; ++st) issue(st);
  uint32_t acc = 0;
  for (int64_t it = 0; it < n; ++it) {
    __syncthreads();  // every thread is done with tile it - 1: its stage can be refilled
    if (it + stages - 1 < n) issue(it + stages - 1);
    const int st = int(it % stages);
    mbar_wait(bar(st), uint32_t(it / stages) & 1);
    acc ^= reinterpret_cast<const uint32_t*>(smem + size_t(st) * 2 * half)[threadIdx.x];
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0) atomicXor(a.sink + blockIdx.x, acc);
#else
  __trap();
#endif
}

// One kv head's rows straight into registers: `u` 16-byte loads in flight per thread, a batch of
// u * blockDim / 32 tokens (K and V) per iteration.
template <int U>
__global__ void regs_kernel(const LoaderArgs a) {
  const int rows = U * int(blockDim.x) / 32;  // tokens per batch
  int head = 0;
  int64_t t0 = 0, t1 = 0;
  if (!cta_range(true, a.slots / rows, head, t0, t1)) return;
  uint32_t acc = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t slot = a.slot0 + t * rows;
    uint4 v[U];
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int c = threadIdx.x + j * blockDim.x;
      const int kv = c >= rows * 16, cc = kv ? c - rows * 16 : c;
      const uint8_t* src =
          (kv ? a.v : a.k) + (slot + cc / 16) * kTokenBytes + head * kRowBytes + (cc % 16) * 16;
      v[j] = __ldcs(reinterpret_cast<const uint4*>(src));
    }
#pragma unroll
    for (int j = 0; j < U; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0) atomicXor(a.sink + blockIdx.x, acc);
}

size_t smem_bytes(Kind k, const LoaderSpec& s) {
  if (k == Kind::kRegs) return 0;
  const bool per_head = k == Kind::kTma || k == Kind::kCpa;
  return size_t(s.stages) * 2 * s.tile * (per_head ? kRowBytes : kTokenBytes) + 1024;
}

template <Kind K>
void launch_ring(int grid, int threads, size_t smem, cudaStream_t stream, const LoaderArgs& a,
                 const CUtensorMap& tm_k, const CUtensorMap& tm_v) {
  LONGCTX_CUDA_CHECK(
      cudaFuncSetAttribute(ring_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  ring_kernel<K><<<grid, threads, smem, stream>>>(a, tm_k, tm_v);
}

}  // namespace

bool parse_loader_spec(const std::string& text, LoaderSpec* out) {
  std::stringstream ss(text);
  std::string kind;
  if (!std::getline(ss, kind, ':')) return false;
  Kind k;
  if (!kind_of(kind, &k)) return false;
  LoaderSpec s;
  s.kind = kind;
  const std::string rest = text.substr(kind.size());
  const int got =
      std::sscanf(rest.c_str(), ":%d:%d:%d:%d", &s.tile, &s.stages, &s.ctas_per_sm, &s.threads);
  if (got < 3 || s.tile < 1 || s.stages < 2 || s.stages > kMaxStages || s.ctas_per_sm < 1 ||
      s.ctas_per_sm > kMaxCtasPerSm || s.threads < 32 || s.threads % 32 != 0 || s.threads > 1024)
    return false;
  if (kind == "regs" && s.tile != 4 && s.tile != 8 && s.tile != 16) return false;
  if (kind == "tma" && (s.tile > 256 || s.tile % 8 != 0)) return false;
  *out = s;
  return true;
}

void loader_table(const std::vector<LoaderSpec>& specs, cudaStream_t stream,
                  const TimeFn& time_ms) {
  int dev = 0, sms = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&dev));
  LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t total_slots = int64_t(1) << 21;  // 2M slots: 4.3 GB each of K and V
  uint8_t *k = nullptr, *v = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&k, total_slots * kTokenBytes));
  LONGCTX_CUDA_CHECK(cudaMalloc(&v, total_slots * kTokenBytes));
  LONGCTX_CUDA_CHECK(cudaMemset(k, 1, total_slots * kTokenBytes));
  LONGCTX_CUDA_CHECK(cudaMemset(v, 2, total_slots * kTokenBytes));
  uint32_t* sink = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&sink, sizeof(uint32_t) * sms * kMaxCtasPerSm));
  LONGCTX_CUDA_CHECK(cudaMemset(sink, 0, sizeof(uint32_t) * sms * kMaxCtasPerSm));
  std::printf(
      "# loader ceilings: K+V of [slots, 8 kv heads, 128 dims] bf16 through each loader,"
      " no compute\n");
  std::printf("| loader | smem/CTA KB | CTAs | slots | isolated ms | GB/s | stream ms | GB/s |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const LoaderSpec& s : specs) {
    Kind kind = Kind::kRegs;
    kind_of(s.kind, &kind);  // parse_loader_spec checked the name
    const size_t smem = smem_bytes(kind, s);
    if (smem > 227 * 1024) {
      std::printf("| %s:%d:%d:%d:%d | %zu | | | too much shared memory | | | |\n", s.kind.c_str(),
                  s.tile, s.stages, s.ctas_per_sm, s.threads, smem / 1024);
      continue;
    }
    const int box = kind == Kind::kTma ? s.tile : 64;
    const CUtensorMap tm_k =
        kernels::cuda::kv_cache_tensor_map(k, total_slots, kHeads, 128, box, DType::kBF16);
    const CUtensorMap tm_v =
        kernels::cuda::kv_cache_tensor_map(v, total_slots, kHeads, 128, box, DType::kBF16);
    const int grid = sms * s.ctas_per_sm;
    for (int64_t slots : {int64_t(32768), int64_t(1) << 20}) {
      const int64_t windows = total_slots / slots;
      int64_t w = 0;
      auto launch = [&] {
        LoaderArgs a{k, v, w * slots, slots, s.tile, s.stages, sink};
        w = (w + 1) % windows;
        switch (kind) {
          case Kind::kTma:
            launch_ring<Kind::kTma>(grid, s.threads, smem, stream, a, tm_k, tm_v);
            break;
          case Kind::kBulk:
            launch_ring<Kind::kBulk>(grid, s.threads, smem, stream, a, tm_k, tm_v);
            break;
          case Kind::kCpa:
            launch_ring<Kind::kCpa>(grid, s.threads, smem, stream, a, tm_k, tm_v);
            break;
          case Kind::kCpaWhole:
            launch_ring<Kind::kCpaWhole>(grid, s.threads, smem, stream, a, tm_k, tm_v);
            break;
          case Kind::kRegs:
            if (s.tile == 4) regs_kernel<4><<<grid, s.threads, 0, stream>>>(a);
            if (s.tile == 8) regs_kernel<8><<<grid, s.threads, 0, stream>>>(a);
            if (s.tile == 16) regs_kernel<16><<<grid, s.threads, 0, stream>>>(a);
            break;
        }
        LONGCTX_CUDA_CHECK_LAUNCH("loader ceiling kernel");
      };
      const double bytes = double(slots) * kTokenBytes * 2;
      const auto [iso, burst] = time_isolated_and_stream(launch, time_ms, 30, 5);
      std::printf("| %s:%d:%d:%d:%d | %zu | %d | %lld | %.4f | %.0f | %.4f | %.0f |\n",
                  s.kind.c_str(), s.tile, s.stages, s.ctas_per_sm, s.threads, smem / 1024, grid,
                  static_cast<long long>(slots), iso, bytes / (iso * 1e6), burst,
                  bytes / (burst * 1e6));
      std::fflush(stdout);
    }
  }
  cudaFree(sink);
  cudaFree(v);
  cudaFree(k);
}

}  // namespace longctx::bench
