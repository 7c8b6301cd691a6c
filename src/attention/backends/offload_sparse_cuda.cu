// The CUDA offload device's sparse reader (offload_sparse.h): the policy's CUDA twin (from the
// registry) over the device's memory, selecting before anything is loaded. A decode policy
// (quest, streaming) attends the decode-only steps: its select kernel picks the pages and its
// gather reads them where they are, host pages from the pinned pool in place (mapped memory); a
// prefill policy (xattention, streaming) attends the steps with a prefill whose host blocks fit
// the staging, over host keys staged on the GPU (xattention_offload_cuda.h). The policy keeps its
// metadata on every step (copy-on-write, the stored keys).
#include <cuda_runtime.h>

#include <memory>

#include "attention/backends/decode_graph_nodes.h"
#include "attention/backends/offload_sparse_cuda.h"
#include "attention/backends/xattention_offload_cuda.h"
#include "attention/sparse/sparse_policy_cuda.h"
#include "core/cuda_stream.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

class CudaOffloadSparse final : public OffloadSparseReader {
 public:
  CudaOffloadSparse(const OffloadDeviceConfig& c, const XAttnStaging& staging,
                    const CudaOffloadMemory& memory, const sparse::SparseCudaConfig& sc,
                    std::unique_ptr<sparse::SparsePolicyCuda> policy)
      : c_(c), g_(c.geometry), mem_(memory), policy_(std::move(policy)) {
    const sparse::PolicyDef& def = sparse::policy_def(c.sparse.policy);
    esize_ = c.fp8() ? 1 : static_cast<int64_t>(dtype_size(c.dtype));
    page_ = c.page_elems();
    block_bytes_ = 2 * page_ * esize_;  // the codes' (FP8 scales are in their own buffers)
    decodes_ = def.decode;
    // The policies read host pages in place: the pool's device view (UVA maps pinned memory).
    void* host_dev = nullptr;
    LONGCTX_CUDA_CHECK(cudaHostGetDevicePointer(&host_dev, const_cast<char*>(mem_.host), 0));
    host_dev_ = static_cast<char*>(host_dev);
    if (c.fp8()) {
      void* scales_dev = nullptr;
      LONGCTX_CUDA_CHECK(
          cudaHostGetDevicePointer(&scales_dev, const_cast<float*>(mem_.host_scales), 0));
      host_scales_dev_ = static_cast<const float*>(scales_dev);
    }
    if (def.prefill) {
      XAttnOffloadConfig x;
      x.xattn = sc;
      x.num_layers = g_.num_layers;
      x.num_gpu_blocks = g_.num_gpu_blocks;
      x.num_host_blocks = g_.num_host_blocks;
      x.block_size = g_.block_size;
      x.num_kv_heads = c.num_kv_heads;
      x.head_dim = c.head_dim;
      x.dtype = c.dtype;
      x.staging_blocks = staging.blocks;
      x.num_buffers = static_cast<int>(staging.buffers);
      x.prefill_tuning = c.tuning.prefill;
      staged_ = std::make_unique<XAttnOffloadCuda>(
          x, XAttnOffloadMemory{mem_.gpu, mem_.host, host_dev_}, *policy_);
    }
  }

  ~CudaOffloadSparse() override {
    // Staged key copies in flight write the device's staging: let them land first.
    mem_.h2d->synchronize();
  }

  bool takes_step(const ForwardBatch& batch, std::span<const int32_t> block_loc) const override {
    bool prefill = false;
    for (int64_t s = 0; s < batch.num_seqs(); ++s) prefill = prefill || batch.q_len(s) > 1;
    if (!prefill) return decodes_;
    if (staged_ == nullptr) return false;
    // Steps with a prefill whose host blocks fit the staging; others run dense through the ring.
    if (staged_->fits(batch, block_loc)) return true;
    if (!staging_warned_) warn_xattn_staging_full();
    staging_warned_ = true;
    return false;
  }

  void plan(const ForwardBatch& batch, const OffloadStepPlan& plan,
            std::span<const int32_t> block_loc, std::span<const KVBlockCopy> copies) override {
    cudaStream_t compute = stream();
    policy_->copy_blocks(copies, compute);
    prefill_step_ = false;
    if (!block_loc.empty() && staged_ != nullptr) {
      for (int64_t s = 0; s < batch.num_seqs(); ++s)
        prefill_step_ = prefill_step_ || batch.q_len(s) > 1;
    }
    if (prefill_step_) {
      // Host blocks are read by both streams: after write-backs of them still in flight.
      if (plan.load_wait_ticket) {
        mem_.wait_write_back(compute, plan.load_wait_ticket);
        mem_.wait_write_back(cuda_handle(*mem_.h2d), plan.load_wait_ticket);
      }
      staged_->plan(batch, block_loc, compute, *mem_.h2d);
      return;
    }
    // A decode policy keeps its metadata on every step; it attends decode steps (block_loc).
    if (decodes_) policy_->plan(batch, plan.slots, block_loc, compute);
    // Host pages are read by the compute stream: after write-backs of them still in flight.
    if (!block_loc.empty() && plan.load_wait_ticket)
      mem_.wait_write_back(compute, plan.load_wait_ticket);
  }

  void on_keys_stored(int64_t layer, const Tensor&) override {
    policy_->on_keys_stored(layer, gpu_memory(layer), stream());
  }

  Tensor attend(int64_t layer, const Tensor& q) override {
    if (prefill_step_) return staged_->attend(layer, q, stream(), *mem_.h2d);
    q_ = q.contiguous();
    Tensor out = Tensor::empty({q.size(0), c_.num_qo_heads * c_.head_dim}, c_.dtype, c_.device);
    const sparse::PageMemory mem[2] = {gpu_memory(layer), host_memory(layer)};
    policy_->attend_decode(layer, q_.data_ptr(), out.data_ptr(), nullptr, mem, stream());
    if (policy_->decode_grid() > 0) decode_nodes_.note(stream(), 0);  // its last launch
    return out;
  }

  void begin_graph_capture() override { decode_nodes_.clear(); }
  std::unique_ptr<GraphLaunches> end_graph_capture() override {
    // Every layer's compact decode follows the plan's grid (none on the generic kernel).
    const size_t want = policy_->decode_grid() > 0 ? static_cast<size_t>(g_.num_layers) : 0;
    return decode_nodes_.finish([this](size_t) { return policy_->decode_grid(); }, 1, want);
  }

  int64_t host_bytes_read() const override {
    return (staged_ != nullptr ? staged_->host_bytes_read() : 0) + policy_->memory1_bytes_read();
  }
  int64_t pages_reused() const override { return policy_->pages_reused(); }
  SparsePrefillCounters prefill_counters() const override {
    return staged_ != nullptr ? staged_->counters() : SparsePrefillCounters{};
  }
  void set_phase_recorder(PhaseRecorder* recorder) override {
    policy_->set_phase_recorder(recorder);
  }

 private:
  cudaStream_t stream() const { return current_cuda_stream(c_.device.index); }
  // Layer `layer`'s GPU cache block 0 / host pool block 0 (its device address).
  char* gpu_at(int64_t layer) const { return mem_.gpu + layer * g_.num_gpu_blocks * block_bytes_; }
  char* host_dev_at(int64_t layer) const {
    return host_dev_ + layer * g_.num_host_blocks * block_bytes_;
  }
  // A layer's blocks of the GPU cache / of the host pool (device addresses) as the policy reads
  // them: K and V of a block adjacent; FP8 scales [K, V][Hkv] per block.
  sparse::PageMemory gpu_memory(int64_t layer) const {
    return page_memory(gpu_at(layer), mem_.gpu_scales, layer * g_.num_gpu_blocks);
  }
  sparse::PageMemory host_memory(int64_t layer) const {
    return page_memory(host_dev_at(layer), host_scales_dev_, layer * g_.num_host_blocks);
  }
  sparse::PageMemory page_memory(const char* codes, const float* scales,
                                 int64_t first_block) const {
    sparse::PageMemory m{codes, codes + page_ * esize_, 2 * page_};
    if (scales != nullptr) {
      const int64_t hkv = c_.num_kv_heads;
      m.k_scale = scales + first_block * 2 * hkv;
      m.v_scale = m.k_scale + hkv;
      m.scale_block_stride = 2 * hkv;
    }
    return m;
  }

  OffloadDeviceConfig c_;
  OffloadGeometry g_;
  CudaOffloadMemory mem_;
  int64_t esize_ = 2, block_bytes_ = 0, page_ = 0;
  std::unique_ptr<sparse::SparsePolicyCuda> policy_;  // the policy's twin
  std::unique_ptr<XAttnOffloadCuda> staged_;  // a prefill policy's steps over staged host keys
  bool decodes_ = false;                      // the policy selects decode steps' pages
  bool prefill_step_ = false;                 // this step is a prefill one (staged_)
  char* host_dev_ = nullptr;                  // mem_.host's device address
  const float* host_scales_dev_ = nullptr;    // FP8: mem_.host_scales' device address
  Tensor q_;                                  // the layer's contiguous q [T, Hq, d]
  DecodeGraphNodes decode_nodes_;             // the compact decodes under a capture
  mutable bool staging_warned_ = false;
};

}  // namespace

XAttnStaging cuda_offload_sparse_staging(const OffloadDeviceConfig& c) {
  c.sparse.validate();
  const sparse::PolicyDef& policy = sparse::policy_def(c.sparse.policy);
  LONGCTX_CHECK(!policy.prefill || policy.offload_staging, ErrorCode::kUnsupported,
                "--sparse-policy {} with KV offload: not built", policy.name);
  // A prefill policy stages host keys after the cache's last layer (xattention_offload_cuda.h).
  return policy.offload_staging ? xattn_offload_staging(c.geometry, c.max_model_len)
                                : XAttnStaging{};
}

std::unique_ptr<OffloadSparseReader> make_cuda_offload_sparse(const OffloadDeviceConfig& c,
                                                              const XAttnStaging& staging,
                                                              const CudaOffloadMemory& memory) {
  const OffloadGeometry& g = c.geometry;
  const sparse::PolicyDef& policy = sparse::policy_def(c.sparse.policy);
  const int64_t max_seq_len =
      c.max_model_len > 0 ? c.max_model_len : g.num_host_blocks * g.block_size;
  sparse::SparseCudaConfig sc;
  sc.options = c.sparse;
  sc.num_layers = g.num_layers;
  sc.num_blocks = g.num_host_blocks;  // the engine's block ids
  sc.block_size = g.block_size;
  sc.num_qo_heads = c.num_qo_heads;
  sc.num_kv_heads = c.num_kv_heads;
  sc.head_dim = c.head_dim;
  sc.dtype = c.dtype;
  sc.kv_format = c.kv_format;
  sc.sm_scale = c.sm_scale;
  sc.device = c.device;
  sc.max_tokens = c.max_tokens;
  sc.max_seqs = c.max_seqs;
  sc.max_seq_len = policy.offload_staging ? staging.max_seq_len : max_seq_len;
  sc.tuning = c.tuning;
  std::unique_ptr<sparse::SparsePolicyCuda> twin = sparse::make_sparse_policy_cuda(sc);
  if (twin == nullptr) return nullptr;
  return std::make_unique<CudaOffloadSparse>(c, staging, memory, sc, std::move(twin));
}

}  // namespace longctx
