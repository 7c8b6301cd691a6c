// CUDA twins of the linear-attention ops: argument checks shared with the CPU twins
// (linear_attention_args.h); the per-call arrays (qo_indptr, the per-sequence state pointers)
// uploaded to the device in one copy before the kernels (kernels/cuda/linear_attention.h),
// through a ring of pinned buffers; or, given SeqDeviceArrays (the paged backend's per-step
// copy), no upload at all, which is what a CUDA graph can replay. delta_rule_gates and
// rms_norm_gated are row kernels here.
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/linear_attention.h"
#include "longctx/core/stream.h"
#include "ops/linear_attention.h"
#include "ops/linear_attention_args.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

// The device copy of one call's sequence arrays: the state pointers, then qo_indptr.
struct DeviceSeqs {
  Tensor bytes;  // keeps the copy alive until the op returns (stream-ordered reuse after)
  const int32_t* qo_indptr = nullptr;
  float* const* states = nullptr;
};

// The host side of the uploads: kRing pinned buffers per (thread, device), each reused once the
// copy out of it has run (the event recorded behind it), so the host waits on the device only
// when it is kRing calls ahead (from pageable memory every copy would wait for the stream).
class SeqStaging {
 public:
  explicit SeqStaging(Device device) : device_(device) {}

  void upload(const std::vector<unsigned char>& bytes, void* dst, cudaStream_t stream) {
    Slot& s = ring_[next_];
    next_ = (next_ + 1) % kRing;
    if (!s.done) s.done.emplace(device_);
    if (s.recorded) s.done->synchronize();
    if (!s.pinned.defined() || s.pinned.numel() < int64_t(bytes.size()))
      s.pinned = Tensor::empty_pinned({std::max<int64_t>(int64_t(bytes.size()), 4096)}, DType::kU8);
    std::memcpy(s.pinned.data_ptr(), bytes.data(), bytes.size());
    LONGCTX_CUDA_CHECK(
        cudaMemcpyAsync(dst, s.pinned.data_ptr(), bytes.size(), cudaMemcpyHostToDevice, stream));
    s.done->record_on(stream);
    s.recorded = true;
  }

 private:
  static constexpr int kRing = 64;
  struct Slot {
    Tensor pinned;              // u8, grown to the largest call
    std::optional<Event> done;  // recorded after the copy out of `pinned`
    bool recorded = false;
  };
  Device device_;
  std::array<Slot, kRing> ring_;
  int next_ = 0;
};

SeqStaging& staging(Device device) {
  thread_local std::unordered_map<int, std::unique_ptr<SeqStaging>> per_device;
  std::unique_ptr<SeqStaging>& s = per_device[device.index];
  if (s == nullptr) s = std::make_unique<SeqStaging>(device);
  return *s;
}

DeviceSeqs upload_seqs(std::span<const int32_t> qo, const std::vector<float*>& states,
                       Device device, cudaStream_t stream) {
  const size_t ptr_bytes = states.size() * sizeof(float*);
  const size_t total = ptr_bytes + qo.size() * sizeof(int32_t);
  std::vector<unsigned char> host(total);
  std::memcpy(host.data(), states.data(), ptr_bytes);
  std::memcpy(host.data() + ptr_bytes, qo.data(), qo.size() * sizeof(int32_t));
  DeviceSeqs d;
  // Stream-ordered: freed when the op returns, reused only by work queued after its kernels.
  d.bytes = Tensor::empty({int64_t(total)}, DType::kU8, device);
  staging(device).upload(host, d.bytes.data_ptr(), stream);
  auto* base = static_cast<unsigned char*>(d.bytes.data_ptr());
  d.states = reinterpret_cast<float* const*>(base);
  d.qo_indptr = reinterpret_cast<const int32_t*>(base + ptr_bytes);
  return d;
}

// The caller's device arrays as they are, else an upload of the host ones.
DeviceSeqs on_device(std::span<const int32_t> qo, const std::vector<float*>& states,
                     const SeqDeviceArrays& given, Device device, cudaStream_t stream) {
  if (!given.defined()) return upload_seqs(qo, states, device, stream);
  DeviceSeqs d;
  d.qo_indptr = given.qo_indptr;
  d.states = given.states;
  return d;
}

Device device_of(const Tensor& t, const char* op) {
  LONGCTX_CHECK(t.defined() && t.device().is_cuda(), ErrorCode::kInvalidArgument,
                "{}_cuda: tensors are not on a CUDA device", op);
  return t.device();
}

// beta = sigmoid(b), g = a_neg softplus(a + dt_bias), a thread per (row, head).
template <typename T>
struct GatesRow {
  DeltaRuleGatesParams p;
  __device__ void operator()(int64_t r, int64_t h) const {
    const float b = to_f32(row_of<const T>(p.b, r)[h]);
    const float a = to_f32(row_of<const T>(p.a, r)[h]);
    const int64_t i = r * p.b.cols + h;
    p.beta[i] = 1.f / (1.f + expf(-b));
    const float x = a + p.dt_bias[h];
    p.g[i] = p.a_neg[h] * (x > 20.f ? x : log1pf(expf(x)));  // torch's softplus threshold
  }
};

// A warp per row: sum of squares, then out = w * x * inv_rms * silu(z). A lane rereads in pass 2
// exactly the x elements it read in pass 1, before writing them, so out may be x.
constexpr int kNormThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kNormThreads) rms_norm_gated_kernel(RmsNormGatedParams p) {
  const int64_t row = int64_t(blockIdx.x) * (kNormThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.x.rows) return;
  const int64_t d = p.x.cols;
  const T* x = row_of<const T>(p.x, row);
  const T* z = row_of<const T>(p.z, row);
  T* out = row_of<T>(p.out, row);
  float ss = 0.f;
  for (int64_t i = lane; i < d; i += 32) {
    const float v = to_f32(x[i]);
    ss += v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = 1.f / sqrtf(ss / float(d) + p.eps);
  for (int64_t i = lane; i < d; i += 32) {
    const float zi = to_f32(z[i]);
    out[i] = from_f32<T>(p.weight[i] * (to_f32(x[i]) * inv) * (zi / (1.f + expf(-zi))));
  }
}

// The chunked form with its workspace from the stream-ordered allocator (freed when the op
// returns; reused only by work queued after the kernels).
void chunked(const kernels::GatedDeltaRuleParams& p, int64_t rows, Device device,
             cudaStream_t stream) {
  const int64_t floats = kernels::cuda::gated_delta_rule_chunked_workspace(p, rows);
  Tensor workspace;
  if (floats > 0) workspace = Tensor::empty({floats}, DType::kF32, device);
  kernels::cuda::gated_delta_rule_chunked(
      p, rows, floats > 0 ? static_cast<float*>(workspace.data_ptr()) : nullptr, floats, stream);
}

}  // namespace

void gated_delta_rule_cuda(const GatedDeltaRuleArgs& a) {
  const Device device = device_of(a.q, "gated_delta_rule");
  DeltaRuleCall call = check_gated_delta_rule(a, device);
  DeviceGuard guard(device.index);
  cudaStream_t stream = op_stream(device, "gated_delta_rule");
  if (a.q.size(0) == 0) return;
  DeviceSeqs seqs = on_device(a.qo_indptr, call.states, a.device, device, stream);
  call.params.qo_indptr = seqs.qo_indptr;
  call.params.states = seqs.states;
  if (a.form == DeltaRuleForm::kRecurrent && a.recurrent_kernel == RecurrentKernel::kPerHead)
    kernels::cuda::gated_delta_rule_recurrent_per_head(call.params, stream);
  else if (a.form == DeltaRuleForm::kRecurrent)
    kernels::cuda::gated_delta_rule_recurrent(call.params, stream);
  else
    chunked(call.params, a.q.size(0), device, stream);
}

void causal_conv1d_cuda(const CausalConv1dArgs& a) {
  const Device device = device_of(a.x, "causal_conv1d");
  ConvCall call = check_causal_conv1d(a, device);
  DeviceGuard guard(device.index);
  cudaStream_t stream = op_stream(device, "causal_conv1d");
  if (a.x.size(0) == 0) return;
  DeviceSeqs seqs = on_device(a.qo_indptr, call.states, a.device, device, stream);
  call.params.qo_indptr = seqs.qo_indptr;
  call.params.states = seqs.states;
  kernels::cuda::causal_conv1d(call.params, a.x.size(0), stream);
}

void delta_rule_gates_cuda(const Tensor& b, const Tensor& a, const Tensor& a_neg,
                           const Tensor& dt_bias, const Tensor& g, const Tensor& beta) {
  const Device device = device_of(b, "delta_rule_gates");
  const DeltaRuleGatesParams p = check_delta_rule_gates(b, a, a_neg, dt_bias, g, beta, device);
  DeviceGuard guard(device.index);
  cudaStream_t stream = op_stream(device, "delta_rule_gates");
  visit_float(p.b.dtype, "delta_rule_gates", [&](auto tag) {
    using T = decltype(tag);
    launch_rows(GatesRow<T>{p}, p.b.rows, p.b.cols, stream);
  });
}

void rms_norm_gated_cuda(const Tensor& x, const Tensor& z, const Tensor& weight, float eps,
                         const Tensor& out) {
  const Device device = device_of(x, "rms_norm_gated");
  const RmsNormGatedParams p = check_rms_norm_gated(x, z, weight, eps, out, device);
  DeviceGuard guard(device.index);
  cudaStream_t stream = op_stream(device, "rms_norm_gated");
  if (p.x.rows == 0) return;
  const int64_t blocks = (p.x.rows + kNormThreads / 32 - 1) / (kNormThreads / 32);
  LONGCTX_CHECK(blocks <= 0x7fffffff, ErrorCode::kInvalidArgument, "rms_norm_gated: {} rows",
                p.x.rows);
  visit_float(p.x.dtype, "rms_norm_gated", [&](auto tag) {
    using T = decltype(tag);
    rms_norm_gated_kernel<T><<<unsigned(blocks), kNormThreads, 0, stream>>>(p);
    LONGCTX_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace longctx::ops
