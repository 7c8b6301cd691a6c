// The seed's block-causal op (include/longctx/attention/block_causal.h) for Python: the layout
// helpers and RaggedBlockCausalAttention over DLPack tensors. longctx.ops wraps these in the
// seed's names and signatures.
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "longctx/attention/block_causal.h"
#include "longctx/core/error.h"

namespace longctx::python {
namespace {

void* as_stream(std::optional<intptr_t> stream) {
  return stream ? reinterpret_cast<void*>(*stream) : nullptr;
}

// The op plus the Python-side handles it must keep alive (the workspace's producer).
class BlockCausalOp {
 public:
  BlockCausalOp(const py::object& workspace, int num_qo_heads, int num_kv_heads, int head_dim,
                int64_t block_size, std::optional<int64_t> max_num_segments,
                std::optional<int64_t> max_total_tokens, const std::string& device, bool graph_mode,
                std::optional<float> sm_scale, const std::string& q_dtype) {
    BlockCausalOptions o;
    o.num_qo_heads = num_qo_heads;
    o.num_kv_heads = num_kv_heads;
    o.head_dim = head_dim;
    o.block_size = block_size;
    o.max_num_segments = max_num_segments;
    o.max_total_tokens = max_total_tokens;
    o.device = resolve_device(device);
    o.graph_mode = graph_mode;
    o.sm_scale = sm_scale;
    o.q_dtype = parse_dtype(q_dtype);
    Tensor ws;
    if (!workspace.is_none()) ws = tensor_from_dlpack(workspace, std::nullopt);
    op_ = std::make_unique<RaggedBlockCausalAttention>(std::move(ws), o);
  }

  void plan(const std::vector<int64_t>& seg_lens, std::optional<intptr_t> stream) {
    py::gil_scoped_release release;
    op_->plan(seg_lens, as_stream(stream));
  }

  py::object run(const py::object& q, const py::object& k, const py::object& v,
                 std::optional<intptr_t> stream) {
    // The views hold the producers' tensors; they are dropped here, with the GIL held.
    Tensor tq = tensor_from_dlpack(q, stream);
    Tensor tk = tensor_from_dlpack(k, stream);
    Tensor tv = tensor_from_dlpack(v, stream);
    Tensor out;
    {
      py::gil_scoped_release release;
      out = op_->run(tq, tk, tv, as_stream(stream));
    }
    return dlpack_object(std::move(out));
  }

  void run_into(const py::object& q, const py::object& k, const py::object& v,
                const py::object& out, std::optional<intptr_t> stream) {
    Tensor tq = tensor_from_dlpack(q, stream);
    Tensor tk = tensor_from_dlpack(k, stream);
    Tensor tv = tensor_from_dlpack(v, stream);
    Tensor to = tensor_from_dlpack(out, stream);
    py::gil_scoped_release release;
    op_->run(tq, tk, tv, to, as_stream(stream));
  }

  const RaggedBlockCausalAttention& op() const { return *op_; }

 private:
  std::unique_ptr<RaggedBlockCausalAttention> op_;
};

// An int32 copy of `v` as a DLPack tensor (the kernels' index type).
py::object int32_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::kI32);
  int32_t* p = t.data<int32_t>();
  for (size_t i = 0; i < v.size(); ++i) {
    LONGCTX_CHECK(v[i] <= INT32_MAX, ErrorCode::kOutOfRange,
                  "block_causal_layout: index {} exceeds int32", v[i]);
    p[i] = int32_t(v[i]);
  }
  return dlpack_object(std::move(t));
}

}  // namespace

void register_ops(py::module_& m) {
  py::module_ ops = m.def_submodule("ops", "The block-causal op (longctx.ops wraps it).");
  ops.def(
      "block_causal_layout",
      [](const std::vector<int64_t>& seg_lens, int64_t block_size) {
        BlockCausalLayout l = block_causal_layout(seg_lens, block_size);
        return py::make_tuple(l.qo_indptr, l.kv_indptr, int32_tensor(l.kv_indices));
      },
      py::arg("seg_lens"), py::arg("block_size"),
      "block_causal_layout(seg_lens, block_size) -> (qo_indptr, kv_indptr, kv_indices int32 "
      "DLPack tensor); spans must be > 0 tokens");
  ops.def("max_blocks", &max_blocks, py::arg("max_segments"), py::arg("max_tokens"),
          py::arg("block_size"));
  ops.def("max_prefix_tokens", &max_prefix_tokens, py::arg("max_tokens"), py::arg("block_size"));
  ops.def("workspace_bytes", &RaggedBlockCausalAttention::workspace_bytes, py::arg("num_qo_heads"),
          py::arg("num_kv_heads"), py::arg("max_total_tokens"), py::arg("block_size"),
          py::arg("max_blocks"));

  py::class_<BlockCausalOp>(ops, "RaggedBlockCausalAttention")
      .def(py::init<const py::object&, int, int, int, int64_t, std::optional<int64_t>,
                    std::optional<int64_t>, const std::string&, bool, std::optional<float>,
                    const std::string&>(),
           py::arg("workspace"), py::arg("num_qo_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("block_size"), py::arg("max_num_segments"),
           py::arg("max_total_tokens"), py::arg("device"), py::arg("graph_mode"),
           py::arg("sm_scale"), py::arg("q_dtype"))
      .def("plan", &BlockCausalOp::plan, py::arg("seg_lens"), py::arg("stream") = py::none())
      .def("run", &BlockCausalOp::run, py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("stream") = py::none())
      .def("run_into", &BlockCausalOp::run_into, py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("out"), py::arg("stream") = py::none())
      .def_property_readonly("num_segments",
                             [](const BlockCausalOp& o) { return o.op().num_segments(); })
      .def_property_readonly("total_tokens",
                             [](const BlockCausalOp& o) { return o.op().total_tokens(); })
      .def_property_readonly("num_blocks",
                             [](const BlockCausalOp& o) { return o.op().num_blocks(); })
      .def_property_readonly("padded_num_blocks",
                             [](const BlockCausalOp& o) { return o.op().padded_num_blocks(); });
}

}  // namespace longctx::python
