// DecodeGraphs (see cuda_graphs.h): capture per bucket, replay per step.
#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "core/cuda_stream.h"
#include "core/device_pool.h"
#include "core/stream_limits.h"
#include "engine/cuda_graphs.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"
#include "longctx/models/model.h"

namespace longctx {

namespace {

// One capture stream per device for the whole process: cuBLASLt keeps a workspace per stream
// (ops/linear_cuda.cu) that the captured GEMMs use, so a stream per DecodeGraphs would leave a
// workspace behind for each. Never destroyed, as the cuBLASLt contexts: process exit tears the
// CUDA context down first.
const Stream& capture_stream(int device) {
  static std::mutex mu;
  static Stream* streams[kMaxCudaDevices] = {};
  LONGCTX_CHECK(device >= 0 && device < kMaxCudaDevices, ErrorCode::kInvalidArgument,
                "decode graphs: device index {} out of range", device);
  std::lock_guard<std::mutex> lock(mu);
  if (!streams[device]) streams[device] = new Stream(Device::cuda(device));
  return *streams[device];
}

// The calling thread's allocations go to a private pool for the scope.
class PrivatePoolScope {
 public:
  PrivatePoolScope(int device, uint64_t id) : pool_(detail::device_pool(device)) {
    pool_.begin_private(id);
  }
  ~PrivatePoolScope() { pool_.end_private(); }
  PrivatePoolScope(const PrivatePoolScope&) = delete;
  PrivatePoolScope& operator=(const PrivatePoolScope&) = delete;

 private:
  detail::DevicePool& pool_;
};

// One bucket's graph. Launches whose shape follows the step's plan (the split-KV decode kernel's
// grid) are the attention backend's to update after each plan (AttentionBackend::
// end_graph_capture).
struct BucketGraph {
  cudaGraph_t graph = nullptr;  // kept: the backend's recorded nodes are its nodes
  cudaGraphExec_t exec = nullptr;
  std::unique_ptr<GraphLaunches> launches;  // nullptr: nothing follows the plan
};

}  // namespace

struct DecodeGraphs::Impl {
  Model& model;
  AttentionBackend& attention;
  PagedKVPool* pool;  // the resident KV (null: the KV is another's, e.g. offloaded)
  int64_t block_size = 0;
  std::vector<int64_t> buckets;
  int64_t max_blocks = 0;
  int32_t scratch = -1;
  bool own_scratch = false;  // taken from the pool's free list: given back at destruction
  KvGroups groups;           // the model's (which of them keep per-sequence states)
  int32_t scratch_state = -1;
  Device device;
  uint64_t private_pool = 0;  // device-pool id of the graphs' memory
  Tensor ids;                 // [max bucket] i32: the graphs' input ids
  Tensor positions;           // [max bucket] i64
  Tensor rows;                // [max bucket] i32: 0, 1, ... (every row's logits)
  Tensor logits;              // [max bucket, vocab] f32: the graphs' output
  Tensor host_ids;            // [max bucket] i32 pinned staging of ids
  Tensor host_positions;      // [max bucket] i64 pinned staging of positions
  Event staged;               // recorded after the last copies out of the staging buffers
  std::map<int64_t, BucketGraph> graphs;  // by bucket
  int64_t grid_updates = 0;
  double capture_seconds = 0;

  Impl(Model& m, AttentionBackend& a, PagedKVPool* p, int64_t bs, Device d)
      : model(m),
        attention(a),
        pool(p),
        block_size(bs),
        groups(KvGroups::from_config(m.config(), DType::kBF16)),
        device(d),
        staged(d) {}

  DecodePadding padding() const { return {scratch, block_size, &groups, scratch_state}; }

  ~Impl() {
    drop_graphs();
    // Views of `logits` the caller still holds keep their block; it turns into an ordinary one.
    ids = positions = rows = logits = Tensor();
    if (private_pool != 0) detail::device_pool(device.index).release_private_pool(private_pool);
    if (own_scratch) pool->free({scratch});
  }

  void drop_graphs() {
    for (auto& [b, g] : graphs) {
      if (g.exec) cudaGraphExecDestroy(g.exec);
      if (g.graph) cudaGraphDestroy(g.graph);
    }
    graphs.clear();
  }

  // The ids and positions of a padded batch into the graphs' input buffers, on `stream`.
  void upload(const ForwardBatch& padded, cudaStream_t stream) {
    const int64_t b = padded.num_tokens();
    staged.synchronize();  // the previous step's copies out of the staging buffers are done
    std::memcpy(host_ids.data_ptr(), padded.input_ids.data(), b * sizeof(int32_t));
    std::memcpy(host_positions.data_ptr(), padded.positions.data(), b * sizeof(int64_t));
    ids.slice(0, 0, b).copy_from_async(host_ids.slice(0, 0, b), stream);
    positions.slice(0, 0, b).copy_from_async(host_positions.slice(0, 0, b), stream);
    staged.record_on(stream);
  }

  // Validates and plans a padded batch exactly as Model::forward does, then uploads its inputs.
  void prepare(const ForwardBatch& padded, cudaStream_t stream) {
    const ModelConfig& c = model.config();
    padded.validate(c.vocab_size, c.max_positions());
    attention.plan(padded);
    upload(padded, stream);
  }

  void forward(int64_t b) {
    model.forward_on_device(ids.slice(0, 0, b), positions.slice(0, 0, b), rows.slice(0, 0, b),
                            attention, logits.slice(0, 0, b));
  }

  void capture_bucket(int64_t b) {
    const Stream& cs = capture_stream(device.index);
    cudaStream_t s = cuda_handle(cs);
    StreamGuard on_capture_stream(cs);
    // Every sequence is padding in the scratch block (the first one "real" as validate() wants):
    // the capture writes no real sequence's KV; shapes are all a graph keeps.
    ForwardBatch one;
    const int32_t zero = 0;
    one.add_sequence(~uint64_t(0), &zero, 1, 0, true);
    one.block_table_indptr = {0, 1};
    one.block_tables = {scratch};
    one.slot_mapping = {int64_t(scratch) * block_size};
    // A model of several KV groups: the scratch block in each group's table too (a state
    // group's: the scratch state slot).
    for (int64_t g = 1; g < groups.size(); ++g) {
      if (groups[g].kind == KvGroupKind::kState)
        one.group_tables.push_back({one.block_table_indptr, {scratch_state}, {}});
      else
        one.group_tables.push_back({one.block_table_indptr, one.block_tables, one.slot_mapping});
    }
    const ForwardBatch padded = pad_decode_batch(one, b, padding());
    prepare(padded, s);
    cudaGraph_t graph = nullptr;
    {
      PrivatePoolScope scope(device.index, private_pool);
      // Warm-up: loads every kernel, makes cuBLASLt's plans (and the capture stream's
      // workspace) and the private pool's segments, so the capture itself allocates nothing
      // from the driver.
      forward(b);
    }
    attention.end_graph_step();
    LONGCTX_CUDA_CHECK(cudaStreamSynchronize(s));
    // Planned again (outside the private pool: a plan's buffers are the backend's): a backend
    // may take one forward per plan (KV offload counts its layers).
    prepare(padded, s);
    {
      PrivatePoolScope scope(device.index, private_pool);
      attention.begin_graph_capture();
      LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      try {
        forward(b);
      } catch (...) {
        // Leave the stream out of capture mode before the error travels on.
        if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        throw;
      }
      LONGCTX_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    }
    // The captured step's after-work (the write-backs its plan named), so the backend's books
    // match what it issued.
    attention.end_graph_step();
    BucketGraph& g = graphs[b];
    g.graph = graph;
    LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
    g.launches = attention.end_graph_capture();
    // The first launch of a fresh graph pays for uploading it: do that now, not in a step.
    LONGCTX_CUDA_CHECK(cudaGraphUpload(g.exec, s));
    LONGCTX_CUDA_CHECK(cudaStreamSynchronize(s));
  }
};

DecodeGraphs::DecodeGraphs(Model& model, AttentionBackend& attention, PagedKVPool& pool,
                           const DecodeGraphOptions& options) {
  LONGCTX_CHECK(pool.config().device == model.device(), ErrorCode::kInvalidArgument,
                "decode graphs: the KV pool is on {}, the model on {}", pool.config().device.str(),
                model.device().str());
  init(model, attention, &pool, {pool.block_size(), pool.num_blocks()}, options);
}

DecodeGraphs::DecodeGraphs(Model& model, AttentionBackend& attention, const DecodeGraphKv& kv,
                           const DecodeGraphOptions& options) {
  LONGCTX_CHECK(options.scratch_block >= 0, ErrorCode::kInvalidArgument,
                "decode graphs: a KV cache other than a pool needs a scratch block");
  init(model, attention, nullptr, kv, options);
}

void DecodeGraphs::init(Model& model, AttentionBackend& attention, PagedKVPool* pool,
                        const DecodeGraphKv& kv, const DecodeGraphOptions& options) {
  LONGCTX_CHECK(model.device().is_cuda(), ErrorCode::kInvalidArgument,
                "decode graphs: the model is on {}, not a CUDA device", model.device().str());
  LONGCTX_CHECK(kv.block_size >= 1, ErrorCode::kInvalidArgument,
                "decode graphs: KV blocks of {} tokens", kv.block_size);
  std::vector<int64_t> buckets =
      options.buckets.empty() ? decode_graph_buckets(options.max_num_seqs) : options.buckets;
  for (size_t i = 0; i < buckets.size(); ++i)
    LONGCTX_CHECK(buckets[i] >= 1 && (i == 0 || buckets[i] > buckets[i - 1]) &&
                      (options.max_num_seqs <= 0 || buckets[i] <= options.max_num_seqs),
                  ErrorCode::kInvalidArgument,
                  "decode graphs: buckets must ascend from >= 1 up to max_num_seqs {} (bucket {} "
                  "is {})",
                  options.max_num_seqs, i, buckets[i]);
  LONGCTX_CHECK(options.scratch_block >= -1 && options.scratch_block < kv.num_blocks,
                ErrorCode::kInvalidArgument,
                "decode graphs: scratch block {} outside the cache's {} blocks",
                options.scratch_block, kv.num_blocks);
  impl_ = std::make_unique<Impl>(model, attention, pool, kv.block_size, model.device());
  Impl& m = *impl_;
  LONGCTX_CHECK(!m.groups.has_kind(KvGroupKind::kState) || options.scratch_state_slot >= 0,
                ErrorCode::kInvalidArgument,
                "decode graphs: a model with linear-attention layers ({}) needs a scratch state "
                "slot for the padding sequences",
                m.groups.summary());
  m.scratch_state = options.scratch_state_slot;
  m.buckets = std::move(buckets);
  m.max_blocks = options.max_blocks;
  if (options.scratch_block >= 0) {
    m.scratch = options.scratch_block;
  } else {
    m.scratch = pool->allocate(1)[0];
    m.own_scratch = true;
  }
  const int64_t n = m.buckets.back();
  m.ids = Tensor::empty({n}, DType::kI32, m.device);
  m.positions = Tensor::empty({n}, DType::kI64, m.device);
  m.logits = Tensor::empty({n, model.config().vocab_size}, DType::kF32, m.device);
  std::vector<int32_t> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = static_cast<int32_t>(i);
  m.rows = Tensor::from_blob(rows.data(), {n}, DType::kI32).to(m.device);
  m.host_ids = Tensor::empty_pinned({n}, DType::kI32);
  m.host_positions = Tensor::empty_pinned({n}, DType::kI64);
}

DecodeGraphs::~DecodeGraphs() = default;

void DecodeGraphs::capture() {
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  m.drop_graphs();
  if (m.private_pool == 0)
    m.private_pool = detail::device_pool(m.device.index).create_private_pool();
  DeviceGuard guard(m.device.index);
  // The capture stream does not wait for the legacy default stream (weights, KV pool set-up).
  device_synchronize(m.device.index);
  // Largest first: the smaller buckets' intermediates fit in the blocks the largest left.
  for (auto it = m.buckets.rbegin(); it != m.buckets.rend(); ++it) {
    try {
      m.capture_bucket(*it);
    } catch (const Error& e) {
      m.drop_graphs();
      LONGCTX_THROW(e.code(), "decode graphs: capturing the batch of {}: {}", *it, e.what());
    }
  }
  device_synchronize(m.device.index);
  m.capture_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool DecodeGraphs::captured() const { return !impl_->graphs.empty(); }

const std::vector<int64_t>& DecodeGraphs::buckets() const { return impl_->buckets; }

int32_t DecodeGraphs::scratch_block() const { return impl_->scratch; }

bool DecodeGraphs::can_run(const ForwardBatch& batch) const {
  return captured() &&
         decode_graph_refusal(batch, impl_->buckets, impl_->padding(), impl_->max_blocks).empty();
}

Tensor DecodeGraphs::run(const ForwardBatch& batch) {
  Impl& m = *impl_;
  LONGCTX_CHECK(captured(), ErrorCode::kInvalidArgument, "decode graphs: run() before capture()");
  const std::string why = decode_graph_refusal(batch, m.buckets, m.padding(), m.max_blocks);
  LONGCTX_CHECK(why.empty(), ErrorCode::kInvalidArgument, "decode graphs: cannot replay {}", why);
  const int64_t s = batch.num_seqs(), b = pick_decode_bucket(m.buckets, s);
  DeviceGuard guard(m.device.index);
  cudaStream_t stream = current_cuda_stream(m.device.index);
  m.prepare(pad_decode_batch(batch, b, m.padding()), stream);
  BucketGraph& g = m.graphs.at(b);
  if (g.launches != nullptr && g.launches->update(g.exec)) ++m.grid_updates;
  LONGCTX_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
  m.attention.end_graph_step();
  return m.logits.slice(0, 0, s);
}

int64_t DecodeGraphs::memory_bytes() const {
  const Impl& m = *impl_;
  const int64_t fixed = m.ids.nbytes() + m.positions.nbytes() + m.rows.nbytes() + m.logits.nbytes();
  return fixed + (m.private_pool
                      ? detail::device_pool(m.device.index).private_reserved(m.private_pool)
                      : 0);
}

double DecodeGraphs::capture_seconds() const { return impl_->capture_seconds; }

int64_t DecodeGraphs::grid_updates() const { return impl_->grid_updates; }

}  // namespace longctx
