// bench_model's per-op decode profile, shared by its two paths (graph_bench.cpp's hand-made bf16
// pool, and the GpuRunner's session, which runs any model the runner does: linear-attention
// state, MoE, quantized weights, FP8 KV): a timer over the model's OpTimer marks and the table of
// a step's ops over many steps. An op's time is the span from the mark before it; the clock is
// the timer's: CUDA events on the current stream (EventOpTimer), or the steady clock for the CPU
// reference, whose ops run synchronously (HostOpTimer; tests/models/test_op_profile.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "longctx/core/device.h"
#include "longctx/core/stream.h"
#include "longctx/models/model.h"

namespace longctx::bench {

// One op's part of a step: its calls (e.g. one per layer), their summed time and the bytes they
// must read at least.
struct OpStat {
  int calls = 0;
  double ms = 0, bytes = 0;
};

// A step's ops by name, in the order each first ran.
struct StepOps {
  std::vector<std::string> order;
  std::map<std::string, OpStat> ops;
  double total_ms() const;
};

// The model's marks, timestamped: start() before the step, finish() after it.
class MarkTimer : public OpTimer {
 public:
  void start();
  void mark(const char* op, double bytes) override;
  // The step's ops (waits for the last timestamp). Throws Error(kInvalidArgument) without a
  // start().
  StepOps finish();

 protected:
  virtual void record(size_t i) = 0;  // takes timestamp i (0, 1, ... within a step)
  virtual void wait(size_t last) { (void)last; }
  virtual double elapsed_ms(size_t from, size_t to) = 0;  // after wait()

 private:
  std::vector<std::pair<std::string, double>> marks_;  // [next_] the step's (op, bytes)
  size_t next_ = 0;
};

// Timestamps on the steady clock: the CPU model, whose ops are done when they return.
class HostOpTimer : public MarkTimer {
 protected:
  void record(size_t i) override;
  double elapsed_ms(size_t from, size_t to) override;

 private:
  std::vector<double> seconds_;
};

// Timing events on the device's current stream, kept across steps. An event between every two
// ops also keeps programmatic dependent launches from overlapping them, so a profiled step is
// slower than a graph replay of it.
class EventOpTimer : public MarkTimer {
 public:
  explicit EventOpTimer(Device device) : device_(device) {}

 protected:
  void record(size_t i) override;
  void wait(size_t last) override;
  double elapsed_ms(size_t from, size_t to) override;

 private:
  Device device_;
  std::vector<Event> events_;
};

// Many steps' ops: each op's median ms per step against its bytes at a given peak rate.
class OpProfile {
 public:
  void add(const StepOps& step);
  int steps() const { return static_cast<int>(totals_.size()); }

  struct Row {
    std::string op;
    int calls = 0;        // per step (the last step's)
    double ms = 0;        // median over the steps of the op's ms per step
    double bytes = 0;     // per step (the last step's)
    double bound_ms = 0;  // bytes at the peak rate (0 without bytes or a peak)
  };
  // In the order the ops first ran. peak_gbs: GB/s (0: no bound).
  std::vector<Row> rows(double peak_gbs) const;
  double median_step_ms() const;  // the median of the steps' sums
  // The column heads, one line per op (ms/step, us/call, MB/step, bound, x bound, GB/s) and the
  // step's sums: what bench_model prints.
  std::string table(double peak_gbs) const;

 private:
  std::vector<std::string> order_;
  std::map<std::string, std::vector<double>> ms_;  // op -> ms of each step it ran in
  std::map<std::string, OpStat> last_;             // op -> its stat in the latest step
  std::vector<double> totals_;                     // each step's sum
};

// Adds to the step's "attention" op the K and V it reads: `keys` cached keys per call (summed
// over the step's sequences), kv_heads x head_dim elements of `element_bytes` each in K and in V
// (an FP8 cache's per-block scales left out). Every attention layer is taken to read every key,
// which overcounts a sliding-window layer.
void add_attention_kv_bytes(StepOps& ops, double keys, int64_t kv_heads, int64_t head_dim,
                            double element_bytes);

// steps + 1 calls of `step` with `timer` set on `model` (the first warms up and is left out);
// `add_bytes` adds to a step's ops what the model cannot count (attention's KV, whose lengths
// the caller knows) before it joins the profile. The model's timer is unset on return, also
// when a step throws.
OpProfile profile_steps(Model& model, MarkTimer& timer, int steps,
                        const std::function<void()>& step,
                        const std::function<void(StepOps&)>& add_bytes = {});

}  // namespace longctx::bench
