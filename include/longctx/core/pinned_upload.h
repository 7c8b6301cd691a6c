// Weight upload from pageable host memory (e.g. an mmap of a safetensors file) to the GPU at
// close to PCIe speed: each chunk is memcpy'd (over a few threads) into one of a small ring of
// pinned buffers and sent with cudaMemcpyAsync on the uploader's own stream, so the host fills
// the next buffer while the previous one is on the wire. A buffer is reused only after the event
// recorded behind its copy has completed.
#pragma once

#include <cstddef>
#include <memory>

namespace longctx {

class PinnedUploader {
 public:
  // Throws Error(kUnsupported) in a build without CUDA, Error(kInvalidArgument) for a bad device,
  // chunk_bytes == 0 or num_buffers < 1.
  explicit PinnedUploader(int device, size_t chunk_bytes = 64 << 20, int num_buffers = 3);
  ~PinnedUploader();  // waits for the copies in flight
  PinnedUploader(const PinnedUploader&) = delete;
  PinnedUploader& operator=(const PinnedUploader&) = delete;

  // Copies `bytes` from host_src (any host memory) to device_dst (device memory of `device`).
  // May return before the copy is done: device_dst must not be read, nor freed, before finish();
  // host_src may be reused at once.
  void upload(const void* host_src, void* device_dst, size_t bytes);
  // Waits for everything uploaded so far.
  void finish();
  // Bytes uploaded so far.
  size_t bytes() const;
  // Wall time from the first upload() after a finish() (or construction) to that finish(),
  // summed over such rounds; a round in progress counts up to now.
  double seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longctx
