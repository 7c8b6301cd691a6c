#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "longctx/core/cuda_check.h"
#include "longctx/core/parallel.h"
#include "longctx/core/pinned_upload.h"
#include "longctx/core/stream.h"

namespace longctx {

namespace {
using Clock = std::chrono::steady_clock;
// Host memcpy pieces: big enough that the thread pool's hand-off is noise, small enough that a
// 64 MiB chunk spreads over several threads (one thread reads pageable memory at ~5-10 GB/s,
// below what PCIe takes).
constexpr size_t kCopyPiece = 4 << 20;
}  // namespace

struct PinnedUploader::Impl {
  int device = 0;
  size_t chunk_bytes = 0;
  Stream stream;
  std::vector<void*> buffers;   // [num_buffers] pinned, chunk_bytes each
  std::vector<Event> done;      // [num_buffers] recorded after each buffer's copy
  std::vector<bool> in_flight;  // [num_buffers]
  int next = 0;
  size_t total_bytes = 0;
  bool round_open = false;
  Clock::time_point round_start;
  double closed_seconds = 0;

  Impl(int dev, size_t chunk, int n) : device(dev), chunk_bytes(chunk), stream(Device::cuda(dev)) {
    for (int i = 0; i < n; ++i) done.emplace_back(Device::cuda(dev));
    in_flight.assign(n, false);
    try {
      for (int i = 0; i < n; ++i) {
        void* p = nullptr;
        LONGCTX_CUDA_CHECK(cudaMallocHost(&p, chunk));
        buffers.push_back(p);
      }
    } catch (...) {
      release_buffers();
      throw;
    }
  }
  ~Impl() {
    // Buffers may be freed only once no copy reads them.
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle()));
    release_buffers();
  }
  void release_buffers() {
    for (void* p : buffers) cudaFreeHost(p);
    buffers.clear();
  }
};

PinnedUploader::PinnedUploader(int device, size_t chunk_bytes, int num_buffers) {
  LONGCTX_CHECK(chunk_bytes > 0, ErrorCode::kInvalidArgument,
                "PinnedUploader: chunk_bytes must be > 0");
  LONGCTX_CHECK(num_buffers >= 1, ErrorCode::kInvalidArgument,
                "PinnedUploader: num_buffers must be >= 1, got {}", num_buffers);
  LONGCTX_CHECK(device >= 0 && device < cuda_device_count(), ErrorCode::kInvalidArgument,
                "PinnedUploader: cuda:{} does not exist ({} CUDA device(s))", device,
                cuda_device_count());
  impl_ = std::make_unique<Impl>(device, chunk_bytes, num_buffers);
}

PinnedUploader::~PinnedUploader() = default;

void PinnedUploader::upload(const void* host_src, void* device_dst, size_t bytes) {
  if (bytes == 0) return;
  Impl& m = *impl_;
  LONGCTX_CHECK(host_src && device_dst, ErrorCode::kInvalidArgument,
                "PinnedUploader::upload: null pointer (src {}, dst {})", host_src, device_dst);
  cudaPointerAttributes attr{};
  LONGCTX_CUDA_CHECK(cudaPointerGetAttributes(&attr, device_dst));
  LONGCTX_CHECK(attr.type == cudaMemoryTypeDevice && attr.device == m.device,
                ErrorCode::kInvalidArgument,
                "PinnedUploader::upload: destination {} is not device memory of cuda:{}",
                device_dst, m.device);
  if (!m.round_open) {
    m.round_open = true;
    m.round_start = Clock::now();
  }
  DeviceGuard g(m.device);
  cudaStream_t s = static_cast<cudaStream_t>(m.stream.handle());
  const auto* src = static_cast<const char*>(host_src);
  auto* dst = static_cast<char*>(device_dst);
  for (size_t off = 0; off < bytes; off += m.chunk_bytes) {
    const size_t n = std::min(m.chunk_bytes, bytes - off);
    const int b = m.next;
    m.next = (m.next + 1) % static_cast<int>(m.buffers.size());
    if (m.in_flight[b]) m.done[b].synchronize();
    char* pinned = static_cast<char*>(m.buffers[b]);
    const int64_t pieces = static_cast<int64_t>((n + kCopyPiece - 1) / kCopyPiece);
    parallel_for(pieces, [&](int64_t begin, int64_t end) {
      const size_t lo = static_cast<size_t>(begin) * kCopyPiece;
      const size_t hi = std::min(n, static_cast<size_t>(end) * kCopyPiece);
      std::memcpy(pinned + lo, src + off + lo, hi - lo);
    });
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dst + off, pinned, n, cudaMemcpyHostToDevice, s));
    m.done[b].record(m.stream);
    m.in_flight[b] = true;
    m.total_bytes += n;
  }
}

void PinnedUploader::finish() {
  Impl& m = *impl_;
  m.stream.synchronize();
  std::fill(m.in_flight.begin(), m.in_flight.end(), false);
  if (m.round_open) {
    m.closed_seconds += std::chrono::duration<double>(Clock::now() - m.round_start).count();
    m.round_open = false;
  }
}

size_t PinnedUploader::bytes() const { return impl_->total_bytes; }

double PinnedUploader::seconds() const {
  const Impl& m = *impl_;
  double s = m.closed_seconds;
  if (m.round_open) s += std::chrono::duration<double>(Clock::now() - m.round_start).count();
  return s;
}

}  // namespace longctx
