// Internal: the caching device-memory pool behind cuda_allocator(i), written over a small
// backend interface so its logic is plain C++ and unit-tested on the CPU with a fake backend.
//
// Layout. The pool takes segments from the backend (cudaMalloc) and carves blocks out of them.
// Requests are rounded to 512 B. Two free lists are kept apart so that thousands of small
// activation tensors never fragment the big segments of a KV pool:
//  - small (rounded < 1 MiB): carved from 2 MiB segments of their own;
//  - large (rounded >= 1 MiB): a segment of the request rounded up to 2 MiB, or a split of a
//    cached large free block (the tail stays cached when at least 1 MiB is left).
// Both lists are best-fit (smallest free block that fits, lowest address on ties), and a freed
// block merges with its free neighbours in the same segment, so the same sequence of requests
// gets the same addresses (stable buffers for CUDA graphs).
//
// Budget. reserved (bytes held from the backend) never exceeds the budget: a request that needs
// a new segment past it first returns wholly free cached segments to the backend, then throws
// Error(kOutOfMemory) naming the request, what is in use and cached, and where the budget comes
// from. A backend failure (cudaMalloc out of memory) does the same after one retry.
//
// Stream order. free() makes a block reusable at once, without waiting for the GPU: correct only
// when every use of the memory is ordered on the stream that will reuse it (one compute stream
// per device). Memory another stream still reads must be kept alive by its owner until an event
// says that stream is done.
//
// CUDA-graph pools (as PyTorch's graph memory pools). A captured graph keeps the addresses of
// every buffer its kernels touched, so that memory must never be handed to anyone else while the
// graph lives. While a private pool is active on a thread (begin_private .. end_private), that
// thread's allocations come from segments of the private pool only; a private block goes back to
// its own pool's free lists whenever it is freed (during or after the capture), and
// release_cached() never returns a private segment to the backend. Graphs captured one after
// another may share a pool when they never run at the same time. Private segments count in the
// budget like any other. release_private_pool() turns the pool's segments into ordinary ones
// (blocks still live stay valid) and returns the wholly free ones to the backend.
//
// Thread-safe: one mutex per pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

#include "longctx/core/device_memory.h"

namespace longctx::detail {

// Where segments come from (cudaMalloc/cudaFree of one device, or a fake in tests).
class DevicePoolBackend {
 public:
  virtual ~DevicePoolBackend() = default;
  // nullptr when the device is out of memory; other failures throw.
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  virtual int64_t total_memory() = 0;     // bytes
  virtual int64_t free_memory() = 0;      // bytes free on the device now (for stats)
  virtual std::string device_name() = 0;  // "cuda:0", for messages
};

class DevicePool {
 public:
  static constexpr size_t kAlignment = 512;          // every block size is a multiple
  static constexpr size_t kSmallLimit = 1 << 20;     // rounded sizes below go to small segments
  static constexpr size_t kSmallSegment = 2 << 20;   // size of a small segment
  static constexpr size_t kLargeRounding = 2 << 20;  // large segments are multiples

  // Takes ownership of nothing: `backend` must outlive the pool.
  explicit DevicePool(DevicePoolBackend* backend);
  ~DevicePool();  // returns every segment to the backend (live blocks included)
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A block of at least `bytes` (512-byte aligned); nullptr for 0 bytes.
  void* allocate(size_t bytes);
  // `ptr` must come from allocate() and not be freed yet; nullptr is ignored.
  void free(void* ptr);

  // See configure_device_memory(): limit_bytes 0 = none, utilization in (0, 1].
  void configure(int64_t limit_bytes, double utilization);
  DeviceMemoryStats stats();
  // Returns every wholly free segment to the backend.
  void release_cached();

  // Size of the block handed out at ptr (the rounded size); 0 when ptr is not live.
  size_t block_size(const void* ptr);
  int64_t num_segments();

  // A new, empty private pool (see the header comment); ids are never reused.
  uint64_t create_private_pool();
  // Routes the calling thread's allocations to private pool `id` until end_private(). One private
  // pool is active at a time; throws Error(kInvalidArgument) for an unknown or released id, or
  // while another pool (or thread) is active.
  void begin_private(uint64_t id);
  // Ends the active private pool of the calling thread (no-op when there is none).
  void end_private();
  // See the header comment; unknown ids are ignored.
  void release_private_pool(uint64_t id);
  // Bytes of segments private pool `id` holds from the backend.
  int64_t private_reserved(uint64_t id);
  // The private pool ptr's block belongs to (0: the shared pool or not live).
  uint64_t owner_of(const void* ptr);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    bool allocated = false;
    bool small = false;     // from a small segment
    uint64_t owner = 0;     // private pool of its segment (0: shared)
    Block* prev = nullptr;  // neighbours in the same segment, by address
    Block* next = nullptr;
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeList = std::set<Block*, BlockLess>;
  struct FreeLists {
    FreeList small, large;
  };
  struct Segment {
    Block* first = nullptr;  // lowest-address block; the chain covers the whole segment
    size_t size = 0;
    uint64_t owner = 0;  // private pool (0: shared)
  };

  static size_t round_size(size_t bytes);
  int64_t budget_locked();  // computes and caches the device total on first use
  std::string budget_origin_locked();
  Block* take_free_locked(FreeList& list, size_t size);
  Block* new_segment_locked(size_t segment_bytes, size_t request, bool small, uint64_t owner);
  void split_locked(Block* b, size_t size, FreeList& list);
  FreeList& list_of_locked(uint64_t owner, bool small);
  uint64_t allocation_owner_locked() const;
  size_t release_cached_locked();
  [[noreturn]] void throw_oom_locked(size_t request, const std::string& why);

  DevicePoolBackend* backend_;
  std::mutex mu_;
  FreeLists shared_;
  std::unordered_map<uint64_t, FreeLists> private_;  // live private pools by id
  uint64_t next_private_ = 1;
  uint64_t active_private_ = 0;  // 0: none
  std::thread::id active_thread_;
  std::unordered_map<void*, Block*> live_;  // allocated blocks by address
  std::map<char*, Segment> segments_;       // by base address
  int64_t limit_bytes_ = 0;
  double utilization_ = 0.9;
  int64_t total_memory_ = -1;  // -1 until asked
  int64_t reserved_ = 0, in_use_ = 0, peak_in_use_ = 0;
};

// The pool of cuda:`device` (created on first use, never destroyed: tensors freed during static
// destruction still find it). Throws Error(kInvalidArgument) for an index past the table.
DevicePool& device_pool(int device);

}  // namespace longctx::detail
