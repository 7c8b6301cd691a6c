#include "attention/backends/phase_profile.h"

#include <fmt/format.h>

#include <chrono>
#include <utility>

#include "longctx/core/error.h"

namespace longctx {

namespace {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

const char* attention_phase_name(AttentionPhase phase) {
  switch (phase) {
    case AttentionPhase::kBetweenSteps:
      return "between steps";
    case AttentionPhase::kPlanOffload:
      return "plan: offload";
    case AttentionPhase::kPlanSparse:
      return "plan: sparse";
    case AttentionPhase::kPlan:
      return "plan: rest";
    case AttentionPhase::kLayerRest:
      return "layer rest";
    case AttentionPhase::kStore:
      return "store_kv";
    case AttentionPhase::kSelect:
      return "select";
    case AttentionPhase::kGather:
      return "gather";
    case AttentionPhase::kDecode:
      return "decode";
    case AttentionPhase::kAttendOther:
      return "attend: rest";
  }
  LONGCTX_THROW(ErrorCode::kInternal, "attention phase {}", static_cast<int>(phase));
}

std::string PhaseTotals::table() const {
  const double n = steps > 0 ? static_cast<double>(steps) : 1.0;
  std::string s = fmt::format("  {:<14} {:>9} {:>9} {:>7} {:>8}   (per step, {} steps)\n", "phase",
                              "host ms", "GPU ms", "marks", "starved", steps);
  double host = 0, gpu = 0;
  for (int p = 0; p < kNumAttentionPhases; ++p) {
    if (marks[p] == 0) continue;
    s += fmt::format("  {:<14} {:>9.3f} {:>9.3f} {:>7.1f} {:>8.1f}\n",
                     attention_phase_name(static_cast<AttentionPhase>(p)), host_ms[p] / n,
                     gpu_ms[p] / n, static_cast<double>(marks[p]) / n,
                     static_cast<double>(starved[p]) / n);
    host += host_ms[p];
    gpu += gpu_ms[p];
  }
  s += fmt::format("  {:<14} {:>9.3f} {:>9.3f}\n", "sum", host / n, gpu / n);
  return s;
}

PhaseRecorder::PhaseRecorder(Device device) : device_(device) {}

void PhaseRecorder::mark(AttentionPhase phase) {
  const bool gpu = device_.is_cuda();
  if (count_ == events_.size() && gpu) events_.emplace_back(device_, /*enable_timing=*/true);
  if (count_ == marks_.size()) marks_.emplace_back();
  Mark& m = marks_[count_];
  m.phase = phase;
  // Whether the GPU had run dry before the host reached this mark.
  m.starved = gpu && count_ > 0 && events_[count_ - 1].query();
  if (gpu) events_[count_].record_on(current_stream(device_.index));
  m.host_s = now_seconds();
  ++count_;
}

void PhaseRecorder::begin_step() {
  collect();
  mark(AttentionPhase::kBetweenSteps);
  ++totals_.steps;
}

void PhaseRecorder::collect() {
  if (count_ == 0) return;
  const bool gpu = device_.is_cuda();
  if (gpu) events_[count_ - 1].synchronize();
  for (size_t i = 1; i < count_; ++i) {
    const int p = static_cast<int>(marks_[i].phase);
    totals_.host_ms[p] += 1e3 * (marks_[i].host_s - marks_[i - 1].host_s);
    if (gpu) totals_.gpu_ms[p] += events_[i].elapsed_ms_since(events_[i - 1]);
    ++totals_.marks[p];
    totals_.starved[p] += marks_[i].starved ? 1 : 0;
  }
  if (gpu) std::swap(events_[0], events_[count_ - 1]);
  marks_[0] = marks_[count_ - 1];
  count_ = 1;
}

PhaseTotals PhaseRecorder::totals() {
  collect();
  return totals_;
}

void PhaseRecorder::reset() {
  collect();
  totals_ = PhaseTotals{};
}

PhaseProfilingBackend::PhaseProfilingBackend(std::unique_ptr<AttentionBackend> inner,
                                             std::shared_ptr<PhaseRecorder> recorder)
    : inner_(std::move(inner)), recorder_(std::move(recorder)) {
  LONGCTX_CHECK(inner_ != nullptr && recorder_ != nullptr, ErrorCode::kInvalidArgument,
                "phase profile: a backend and a recorder are needed");
}

void PhaseProfilingBackend::plan(const ForwardBatch& batch) {
  recorder_->begin_step();
  inner_->plan(batch);
  recorder_->mark(AttentionPhase::kPlan);
}

void PhaseProfilingBackend::store_kv(int64_t layer, const Tensor& k, const Tensor& v) {
  recorder_->mark(AttentionPhase::kLayerRest);
  inner_->store_kv(layer, k, v);
  recorder_->mark(AttentionPhase::kStore);
}

Tensor PhaseProfilingBackend::attend(int64_t layer, const Tensor& q) {
  Tensor o = inner_->attend(layer, q);
  recorder_->mark(AttentionPhase::kAttendOther);
  return o;
}

}  // namespace longctx
