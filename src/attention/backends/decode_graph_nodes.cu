#include <utility>

#include "attention/backends/decode_graph_nodes.h"
#include "kernels/cuda/decode.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

// The noted nodes, each set to its plan's grid when that grid changed since the last update (a
// grid padded to a fixed size was 19-22% slower, see decode.cu).
class DecodeNodeLaunches final : public GraphLaunches {
 public:
  struct Node {
    cudaGraphNode_t node;
    size_t group;
  };
  DecodeNodeLaunches(std::vector<Node> nodes, std::function<int64_t(size_t)> grid,
                     std::vector<int64_t> ctas)
      : nodes_(std::move(nodes)), grid_(std::move(grid)), ctas_(std::move(ctas)) {}

  bool update(void* graph_exec) override {
    bool changed = false;
    auto exec = static_cast<cudaGraphExec_t>(graph_exec);
    for (size_t g = 0; g < ctas_.size(); ++g) {
      const int64_t ctas = grid_(g);
      if (ctas == ctas_[g]) continue;
      LONGCTX_CHECK(ctas >= 1 && ctas <= 0x7fffffff, ErrorCode::kInternal,
                    "decode graphs: a decode grid of {} CTAs for a graph with {} decode nodes",
                    ctas, nodes_.size());
      for (const Node& n : nodes_) {
        if (n.group != g) continue;
        cudaKernelNodeParams p{};
        LONGCTX_CUDA_CHECK(cudaGraphKernelNodeGetParams(n.node, &p));
        p.gridDim = dim3(static_cast<unsigned>(ctas));
        LONGCTX_CUDA_CHECK(cudaGraphExecKernelNodeSetParams(exec, n.node, &p));
      }
      ctas_[g] = ctas;
      changed = true;
    }
    return changed;
  }

 private:
  std::vector<Node> nodes_;
  std::function<int64_t(size_t)> grid_;
  std::vector<int64_t> ctas_;  // [groups] their grids in the instantiated graph now
};

}  // namespace

void DecodeGraphNodes::note(cudaStream_t stream, size_t group) {
  if (stream == nullptr) return;  // the legacy default stream is never captured
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  size_t n = 0;
  LONGCTX_CUDA_CHECK(
      cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, nullptr, &n));
  if (status == cudaStreamCaptureStatusActive && n == 1) nodes_.push_back({deps[0], group});
}

std::unique_ptr<GraphLaunches> DecodeGraphNodes::finish(std::function<int64_t(size_t)> grid,
                                                        size_t num_groups, size_t want) {
  std::vector<DecodeNodeLaunches::Node> nodes;
  for (const Node& c : std::exchange(nodes_, {})) {
    cudaKernelNodeParams p{};
    LONGCTX_CUDA_CHECK(cudaGraphKernelNodeGetParams(c.node, &p));
    LONGCTX_CHECK(kernels::cuda::is_decode_kernel(p.func), ErrorCode::kInternal,
                  "decode graphs: a recorded decode node runs another kernel");
    nodes.push_back({c.node, c.group});
  }
  LONGCTX_CHECK(nodes.size() == want, ErrorCode::kInternal,
                "decode graphs: the captured step holds {} decode kernels, expected {}",
                nodes.size(), want);
  if (nodes.empty()) return nullptr;
  std::vector<int64_t> ctas(num_groups);
  for (size_t g = 0; g < num_groups; ++g) ctas[g] = grid(g);
  return std::make_unique<DecodeNodeLaunches>(std::move(nodes), std::move(grid), std::move(ctas));
}

}  // namespace longctx
