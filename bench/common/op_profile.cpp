#include "common/op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "longctx/core/error.h"

namespace longctx::bench {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

double StepOps::total_ms() const {
  double t = 0;
  for (const auto& [name, o] : ops) t += o.ms;
  return t;
}

void MarkTimer::start() {
  next_ = 0;
  mark("start", 0);
}

void MarkTimer::mark(const char* op, double bytes) {
  record(next_);
  if (next_ >= marks_.size()) marks_.resize(next_ + 1);
  marks_[next_] = {op, bytes};
  ++next_;
}

StepOps MarkTimer::finish() {
  LONGCTX_CHECK(next_ > 0, ErrorCode::kInvalidArgument, "op profile: finish() without start()");
  wait(next_ - 1);
  StepOps step;
  for (size_t i = 1; i < next_; ++i) {
    const std::string& name = marks_[i].first;
    OpStat& o = step.ops[name];
    if (o.calls == 0) step.order.push_back(name);
    ++o.calls;
    o.ms += elapsed_ms(i - 1, i);
    o.bytes += marks_[i].second;
  }
  next_ = 0;
  return step;
}

void HostOpTimer::record(size_t i) {
  if (i >= seconds_.size()) seconds_.resize(i + 1);
  seconds_[i] =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double HostOpTimer::elapsed_ms(size_t from, size_t to) {
  return 1e3 * (seconds_[to] - seconds_[from]);
}

void EventOpTimer::record(size_t i) {
  if (i == events_.size()) events_.emplace_back(device_, true);
  events_[i].record_on(current_stream(device_.index));
}

void EventOpTimer::wait(size_t last) { events_[last].synchronize(); }

double EventOpTimer::elapsed_ms(size_t from, size_t to) {
  return events_[to].elapsed_ms_since(events_[from]);
}

void OpProfile::add(const StepOps& step) {
  for (const std::string& name : step.order) {
    if (!ms_.count(name)) order_.push_back(name);
    const OpStat& o = step.ops.at(name);
    ms_[name].push_back(o.ms);
    last_[name] = o;
  }
  totals_.push_back(step.total_ms());
}

std::vector<OpProfile::Row> OpProfile::rows(double peak_gbs) const {
  std::vector<Row> r;
  for (const std::string& name : order_) {
    const OpStat& o = last_.at(name);
    Row row;
    row.op = name;
    row.calls = o.calls;
    row.ms = median(ms_.at(name));
    row.bytes = o.bytes;
    row.bound_ms = peak_gbs > 0 ? o.bytes / (peak_gbs * 1e6) : 0;
    r.push_back(row);
  }
  return r;
}

double OpProfile::median_step_ms() const { return median(totals_); }

std::string OpProfile::table(double peak_gbs) const {
  std::string s = fmt::format("  {:<20} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}\n", "op", "calls",
                              "ms/step", "us/call", "MB/step", "bound ms", "x bound", "GB/s");
  double sum_ms = 0, sum_bound = 0, small_ms = 0;
  int small_calls = 0;
  for (const Row& r : rows(peak_gbs)) {
    sum_ms += r.ms;
    sum_bound += r.bound_ms;
    if (r.bytes == 0) small_ms += r.ms, small_calls += r.calls;
    s += fmt::format("  {:<20} {:>6} {:>9.4f} {:>9.2f} {:>9.1f} {:>9.4f} {:>8} {:>8}\n", r.op,
                     r.calls, r.ms, 1e3 * r.ms / std::max(r.calls, 1), r.bytes / 1e6, r.bound_ms,
                     r.bound_ms > 0 ? fmt::format("{:.2f}", r.ms / r.bound_ms) : "-",
                     r.bytes > 0 && r.ms > 0 ? fmt::format("{:.0f}", r.bytes / (r.ms * 1e6)) : "-");
  }
  s += fmt::format(
      "  step (sum of ops) {:.3f} ms (median of the step totals {:.3f}); bound {:.3f} ms; ops that "
      "read no weights or KV: {} calls, {:.3f} ms ({:.2f} us each)\n",
      sum_ms, median_step_ms(), sum_bound, small_calls, small_ms,
      small_calls > 0 ? 1e3 * small_ms / small_calls : 0.0);
  return s;
}

void add_attention_kv_bytes(StepOps& ops, double keys, int64_t kv_heads, int64_t head_dim,
                            double element_bytes) {
  auto it = ops.ops.find("attention");
  if (it == ops.ops.end()) return;
  it->second.bytes +=
      double(it->second.calls) * 2.0 * keys * double(kv_heads * head_dim) * element_bytes;
}

OpProfile profile_steps(Model& model, MarkTimer& timer, int steps,
                        const std::function<void()>& step,
                        const std::function<void(StepOps&)>& add_bytes) {
  struct Unset {  // the timer outlives no step
    Model& m;
    ~Unset() { m.set_op_timer(nullptr); }
  } unset{model};
  model.set_op_timer(&timer);
  OpProfile profile;
  for (int i = 0; i < steps + 1; ++i) {  // step 0 warms up
    timer.start();
    step();
    StepOps ops = timer.finish();
    if (add_bytes) add_bytes(ops);
    if (i > 0) profile.add(ops);
  }
  return profile;
}

}  // namespace longctx::bench
