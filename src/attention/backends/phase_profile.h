// Where a step's time goes, per phase of the attention layer's calls (a measurement mode of
// `longctx bench offload --profile-phases`; off unless a runner enables it). A PhaseRecorder
// takes marks in the order the step issues its work: each mark closes the phase that ran since
// the previous one, and charges it both the host's wall time between the two marks and the GPU
// time between two events recorded on the compute stream at them. Marks come from a wrapper
// around the runner's backend (plan, store_kv, attend: PhaseProfilingBackend) and from inside the
// backends that split their work further (the offload planner, Quest's select / gather / decode).
// A mark also notes whether the GPU had already finished everything before the previous mark when
// the host got there ("starved": the GPU waited for the host during that phase).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "longctx/attention/forward_batch.h"
#include "longctx/core/device.h"
#include "longctx/core/stream.h"

namespace longctx {

enum class AttentionPhase : uint8_t {
  kBetweenSteps,  // the last layer's attention -> the next plan(): lm_head, sampling, the engine
  kPlanOffload,   // the offload planner and the ring's begin_step (uploads of its indices)
  kPlanSparse,    // the sparse reader's / policy's plan (Quest: touched pages, tables, uploads)
  kPlan,          // the rest of plan()
  kLayerRest,     // attention -> the next layer's store_kv: o_proj, MLP, norms, QKV, RoPE
  kStore,         // store_kv: the cache write and a policy's metadata
  kSelect,        // Quest: scores and the page lists
  kGather,        // Quest: the selected pages into the compact buffers (host pages over the link)
  kDecode,        // Quest: the split-KV decode over the compact buffers
  kAttendOther,   // the rest of attend() (all of it for a backend that does not split it)
};
inline constexpr int kNumAttentionPhases = 10;
const char* attention_phase_name(AttentionPhase phase);

// Sums over the steps since the last reset; ms.
struct PhaseTotals {
  int64_t steps = 0;  // plan() calls
  std::array<double, kNumAttentionPhases> host_ms{};
  std::array<double, kNumAttentionPhases> gpu_ms{};
  std::array<int64_t, kNumAttentionPhases> marks{};
  std::array<int64_t, kNumAttentionPhases> starved{};
  // One line per phase with marks: per step host ms, GPU ms, marks, starved marks; then the sums.
  std::string table() const;
};

class PhaseRecorder {
 public:
  explicit PhaseRecorder(Device device);

  // Closes `phase` (the work issued since the previous mark) on the device's current stream.
  void mark(AttentionPhase phase);
  // plan()'s first call: closes kBetweenSteps and counts a step.
  void begin_step();
  // The totals so far (synchronizes with the last mark).
  PhaseTotals totals();
  void reset();

 private:
  struct Mark {
    AttentionPhase phase = AttentionPhase::kBetweenSteps;
    double host_s = 0;
    bool starved = false;
  };
  // Waits for the last mark, adds every closed interval and keeps the last mark as the base.
  void collect();

  Device device_;
  std::vector<Event> events_;  // [marks taken since the base], the base first
  std::vector<Mark> marks_;
  size_t count_ = 0;
  PhaseTotals totals_;
};

// Forwards every call to `inner`, marking the recorder around plan(), store_kv() and attend()
// (the runner hands the recorder to the backends that mark their own phases).
class PhaseProfilingBackend final : public AttentionBackend {
 public:
  PhaseProfilingBackend(std::unique_ptr<AttentionBackend> inner,
                        std::shared_ptr<PhaseRecorder> recorder);

  void plan(const ForwardBatch& batch) override;
  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override;
  Tensor attend(int64_t layer, const Tensor& q) override;
  LinearLayerStates linear_states(int64_t layer) override { return inner_->linear_states(layer); }
  void copy_blocks(std::span<const KVBlockCopy> copies) override { inner_->copy_blocks(copies); }
  SparsePrefillCounters sparse_prefill_counters() const override {
    return inner_->sparse_prefill_counters();
  }
  void begin_graph_capture() override { inner_->begin_graph_capture(); }
  std::unique_ptr<GraphLaunches> end_graph_capture() override {
    return inner_->end_graph_capture();
  }
  void end_graph_step() override { inner_->end_graph_step(); }
  AttentionBackend& inner() { return *inner_; }

 private:
  std::unique_ptr<AttentionBackend> inner_;
  std::shared_ptr<PhaseRecorder> recorder_;
};

}  // namespace longctx
