// Collectives among the ranks of a tensor-parallel model (docs/tensor_parallel.md). A rank's
// model calls them in the same order on every rank; each call returns when every rank has made
// it. make_thread_communicators() gives ranks that are threads of one process over CPU tensors:
// the CPU reference of a sharded forward (tests and CI); an NCCL communicator is the GPU's.
#pragma once

#include <memory>
#include <vector>

#include "longctx/core/tensor.h"

namespace longctx {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x (contiguous) becomes the sum of every rank's x, the same bits on every rank.
  virtual void all_reduce_sum(const Tensor& x) = 0;
  // local [rows, cols_r] of each rank into out [rows, sum of cols_r], rank 0's columns first, on
  // every rank.
  virtual void all_gather_columns(const Tensor& local, const Tensor& out) = 0;
};

// `size` communicators of one group, rank i at [i], for `size` threads (one each) over f32 CPU
// tensors. Sums run in rank order, so every rank gets the same bits.
std::vector<std::shared_ptr<Communicator>> make_thread_communicators(int size);

// One NCCL communicator per GPU of `devices` (rank i on devices[i]), for one thread per GPU of one
// process; collectives on the calling thread's current stream of the rank's device. f32, bf16 and
// f16 tensors; all_gather_columns needs equal column counts on every rank. NVLink multicast is
// off (NCCL_NVLS_ENABLE=0 unless set). Throws Error(kUnsupported) in a build without NCCL.
std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices);

}  // namespace longctx
