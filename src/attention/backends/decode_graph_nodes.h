// The split-KV decode kernel nodes of a captured CUDA graph step (engine/cuda_graphs.h), for a
// backend whose decode grid follows its plan: while the engine captures a step, the backend notes
// each decode launch (note() right after it), tagged with the plan it belongs to (a KV group's);
// after the capture, finish() hands the engine a GraphLaunches that, after each later plan(),
// points those nodes at that plan's grid (every other launch shape and address depends on the
// batch size alone: kernels/cuda/decode.h). The resident paged backend (per KV group) and the
// CUDA offload's sparse reader (quest's compact decode) use it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "longctx/attention/forward_batch.h"

namespace longctx {

class DecodeGraphNodes {
 public:
  // Forgets the nodes noted so far (a capture begins).
  void clear() { nodes_.clear(); }
  // Right after a decode launch on `stream`: when the stream is being captured, that launch is
  // the capture's one current dependency, noted as a node of plan `group`.
  void note(cudaStream_t stream, size_t group);
  // After the capture ended: the noted nodes (Error(kInternal) unless `want` of them, each a
  // decode kernel) as the graph's GraphLaunches; grid(g) gives plan g's CTAs after each plan()
  // (num_groups plans; 0: no decode launch). nullptr when no node was noted.
  std::unique_ptr<GraphLaunches> finish(std::function<int64_t(size_t)> grid, size_t num_groups,
                                        size_t want);

 private:
  struct Node {
    cudaGraphNode_t node;  // of the captured graph, which the engine keeps
    size_t group;
  };
  std::vector<Node> nodes_;
};

}  // namespace longctx
