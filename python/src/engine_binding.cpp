// The engine for Python: longctx::LLM (batch generate, chat template, tokenizer) and, for
// streaming and asyncio, an EngineLoop over the same core whose events are queued here and
// drained by Python (longctx/llm.py). The engine thread never touches Python: it appends to
// the queue and writes a byte to a notify descriptor (an asyncio reader wakes on it), so no GIL
// is taken off the Python threads and the engine runs while Python runs.
#include <pybind11/stl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "engine/engine_loop.h"
#include "engine/llm_internal.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/llm.h"
#include "longctx/tokenizer/tokenizer.h"

namespace longctx::python {
namespace {

// ---- engine arguments: one table, keyword -> EngineConfig field (the CLI's flag names with
// underscores; docs/python.md lists them) ----

template <typename T>
T arg_as(const py::handle& value, const char* name, const char* type_name) {
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!py::isinstance<py::bool_>(value)) throw py::cast_error();
    } else if constexpr (std::is_integral_v<T>) {
      if (py::isinstance<py::bool_>(value) || !py::isinstance<py::int_>(value))
        throw py::cast_error();
    }
    return value.cast<T>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string("engine argument '") + name + "' must be " + type_name +
                         ", got " + std::string(py::str(py::type::of(value).attr("__name__"))));
  }
}

// What the keywords build: the config, plus the CLI's --load-format / --preset pair.
struct EngineArgs {
  EngineConfig c;
  std::string load_format = "auto";
  std::string preset;
};

struct EngineArg {
  const char* name;
  std::function<void(EngineArgs&, const py::handle&)> set;
};

#define LONGCTX_INT_ARG(key, field)                                                                \
  {                                                                                                \
    key, [](EngineArgs& a, const py::handle& v) { a.c.field = arg_as<int64_t>(v, key, "an int"); } \
  }
#define LONGCTX_FLOAT_ARG(key, field)                                                              \
  {                                                                                                \
    key, [](EngineArgs& a, const py::handle& v) { a.c.field = arg_as<double>(v, key, "a float"); } \
  }
#define LONGCTX_BOOL_ARG(key, field)                                                            \
  {                                                                                             \
    key, [](EngineArgs& a, const py::handle& v) { a.c.field = arg_as<bool>(v, key, "a bool"); } \
  }
#define LONGCTX_STR_ARG(key, field)                     \
  {                                                     \
    key, [](EngineArgs& a, const py::handle& v) {       \
      a.c.field = arg_as<std::string>(v, key, "a str"); \
    }                                                   \
  }

const std::vector<EngineArg>& engine_args() {
  static const std::vector<EngineArg> table = {
      LONGCTX_STR_ARG("tokenizer", tokenizer),
      LONGCTX_STR_ARG("chat_template", chat_template),
      LONGCTX_INT_ARG("max_model_len", max_model_len),
      LONGCTX_STR_ARG("device", device),
      {"dtype",
       [](EngineArgs& a, const py::handle& v) {
         DType d = parse_dtype(arg_as<std::string>(v, "dtype", "a str"));
         LONGCTX_CHECK(d == DType::kBF16 || d == DType::kF16, ErrorCode::kInvalidArgument,
                       "dtype '{}': the GPU runs bfloat16 or float16 (the CPU reference is "
                       "float32 whatever this says)",
                       std::string(py::str(v)));
         a.c.model_options.activation_dtype = d;
       }},
      {"load_format",
       [](EngineArgs& a, const py::handle& v) {
         a.load_format = arg_as<std::string>(v, "load_format", "a str");
         LONGCTX_CHECK(a.load_format == "auto" || a.load_format == "dummy",
                       ErrorCode::kInvalidArgument,
                       "load_format '{}' is unknown (known: auto, dummy)", a.load_format);
       }},
      {"preset", [](EngineArgs& a,
                    const py::handle& v) { a.preset = arg_as<std::string>(v, "preset", "a str"); }},
      LONGCTX_INT_ARG("gpu_memory_limit", gpu_memory_limit),
      LONGCTX_FLOAT_ARG("gpu_memory_utilization", gpu_memory_utilization),
      LONGCTX_INT_ARG("block_size", block_size),
      LONGCTX_INT_ARG("max_num_batched_tokens", max_num_batched_tokens),
      LONGCTX_INT_ARG("max_num_seqs", max_num_seqs),
      LONGCTX_BOOL_ARG("enable_prefix_caching", enable_prefix_caching),
      LONGCTX_BOOL_ARG("enforce_eager", enforce_eager),
      LONGCTX_INT_ARG("num_gpu_blocks", num_gpu_blocks),
      LONGCTX_INT_ARG("max_state_snapshots", max_state_snapshots),
      LONGCTX_INT_ARG("kv_cache_memory", cpu_kv_cache_bytes),
      {"kv_cache_dtype",
       [](EngineArgs& a, const py::handle& v) {
         a.c.kv_cache_dtype =
             parse_kv_cache_dtype(arg_as<std::string>(v, "kv_cache_dtype", "a str"));
       }},
      LONGCTX_BOOL_ARG("kv_offload", kv_offload),
      LONGCTX_INT_ARG("host_kv_budget", host_kv_budget),
      LONGCTX_INT_ARG("gpu_kv_budget", gpu_kv_budget),
      LONGCTX_INT_ARG("offload_slots", offload_slots),
      LONGCTX_INT_ARG("offload_slot_tokens", offload_slot_tokens),
      {"sparse_policy",
       [](EngineArgs& a, const py::handle& v) {
         a.c.sparse.policy = parse_sparse_policy(arg_as<std::string>(v, "sparse_policy", "a str"));
       }},
      LONGCTX_INT_ARG("sparse_budget", sparse.budget_tokens),
      LONGCTX_INT_ARG("sparse_sink", sparse.sink_tokens),
      LONGCTX_INT_ARG("sparse_window", sparse.window_tokens),
      LONGCTX_BOOL_ARG("sparse_per_head", sparse.per_head),
      LONGCTX_INT_ARG("sparse_page", sparse.page_tokens),
      LONGCTX_FLOAT_ARG("xattn_threshold", sparse.threshold),
      LONGCTX_INT_ARG("xattn_stride", sparse.stride),
      LONGCTX_BOOL_ARG("xattn_per_kv_head", sparse.xattn_per_kv_head),
      LONGCTX_INT_ARG("xattn_dense_tail", sparse.xattn_dense_tail),
      LONGCTX_INT_ARG("xattn_min_len", sparse.xattn_min_len),
      LONGCTX_INT_ARG("tensor_parallel_size", tensor_parallel_size),
      {"speculative_method",
       [](EngineArgs& a, const py::handle& v) {
         a.c.speculative.method =
             parse_speculative_method(arg_as<std::string>(v, "speculative_method", "a str"));
       }},
      LONGCTX_INT_ARG("num_speculative_tokens", speculative.num_speculative_tokens),
      LONGCTX_INT_ARG("prompt_lookup_min", speculative.prompt_lookup_min),
      LONGCTX_INT_ARG("prompt_lookup_max", speculative.prompt_lookup_max),
      {"seed",
       [](EngineArgs& a, const py::handle& v) {
         a.c.seed = uint64_t(arg_as<int64_t>(v, "seed", "an int"));
       }},
  };
  return table;
}

#undef LONGCTX_INT_ARG
#undef LONGCTX_FLOAT_ARG
#undef LONGCTX_BOOL_ARG
#undef LONGCTX_STR_ARG

std::vector<std::string> engine_arg_names() {
  std::vector<std::string> names;
  for (const EngineArg& a : engine_args()) names.push_back(a.name);
  return names;
}

EngineConfig engine_config(const std::optional<std::string>& model, const py::dict& kwargs) {
  EngineArgs a;
  for (auto [key, value] : kwargs) {
    std::string name = py::str(key);
    const EngineArg* arg = nullptr;
    for (const EngineArg& a : engine_args())
      if (name == a.name) arg = &a;
    if (!arg) {
      std::string known;
      for (const std::string& n : engine_arg_names()) known += (known.empty() ? "" : ", ") + n;
      throw py::type_error("LLM() got an unknown engine argument '" + name + "' (known: " + known +
                           ")");
    }
    arg->set(a, value);
  }
  EngineConfig& c = a.c;
  if (a.load_format == "dummy") {
    LONGCTX_CHECK(!a.preset.empty(), ErrorCode::kInvalidArgument,
                  "load_format='dummy' needs preset=NAME (e.g. preset='qwen3-0.6b')");
    c.dummy_preset = a.preset;
  } else {
    LONGCTX_CHECK(a.preset.empty(), ErrorCode::kInvalidArgument,
                  "preset='{}' goes with load_format='dummy'", a.preset);
    LONGCTX_CHECK(model && !model->empty(), ErrorCode::kInvalidArgument,
                  "LLM() needs a model folder (or load_format='dummy', preset=NAME)");
    c.model = *model;
  }
  c.sparse.validate();
  c.speculative = c.speculative.resolved();
  return c;
}

// ---- outputs to Python (plain containers; longctx/outputs.py makes the dataclasses) ----

py::object stop_reason_value(const StopReason& s) {
  switch (s.kind) {
    case StopReason::Kind::kStopToken:
      return py::int_(s.token);
    case StopReason::Kind::kStopString:
      return py::str(s.text);
    default:
      return py::none();
  }
}

py::list logprobs_list(const std::vector<TokenLogprobs>& lps) {
  py::list out;
  for (const TokenLogprobs& t : lps) out.append(py::make_tuple(t.token, t.logprob, t.rank, t.top));
  return out;
}

py::dict output_dict(const RequestOutput& o) {
  py::dict d;
  d["index"] = o.index;
  d["prompt_token_ids"] = o.prompt_token_ids;
  d["token_ids"] = o.token_ids;
  d["text"] = py::bytes(o.text).attr("decode")("utf-8", "replace");
  d["finish_reason"] = o.finish_reason == FinishReason::kNone
                           ? py::object(py::none())
                           : py::object(py::str(finish_reason_name(o.finish_reason)));
  d["stop_reason"] = stop_reason_value(o.stop_reason);
  d["logprobs"] = logprobs_list(o.logprobs);
  py::dict m;
  m["arrival_time"] = o.metrics.arrival;
  m["scheduled_time"] = o.metrics.scheduled;
  m["first_token_time"] = o.metrics.first_token;
  m["finished_time"] = o.metrics.finished;
  m["num_prompt_tokens"] = o.metrics.num_prompt_tokens;
  m["num_cached_tokens"] = o.metrics.num_cached_tokens;
  m["num_generated_tokens"] = o.metrics.num_generated_tokens;
  d["metrics"] = m;
  return d;
}

Prompt to_prompt(const py::handle& p, bool add_special_tokens) {
  Prompt prompt = py::isinstance<py::str>(p)
                      ? Prompt(p.cast<std::string>())
                      : Prompt(p.cast<std::vector<int32_t>>());  // a TypeError names the type
  prompt.add_special_tokens = add_special_tokens;
  return prompt;
}

// One event of a streamed request, queued by the engine thread.
struct QueuedEvent {
  uint64_t id = 0;
  std::string text;
  std::vector<int32_t> new_token_ids;
  std::vector<TokenLogprobs> new_logprobs;
  bool finished = false;
  std::optional<RequestOutput> output;
  std::optional<Error> error;  // a rejected request or an engine failure
};

class EventQueue {
 public:
  void push(QueuedEvent ev) {
    int fd;
    {
      std::lock_guard lk(mu_);
      events_.push_back(std::move(ev));
      fd = notify_fd_;
    }
    cv_.notify_all();
    if (fd >= 0) {
      char byte = 1;
      // A full pipe already wakes the reader; nothing else to do on failure.
      [[maybe_unused]] ssize_t n = ::write(fd, &byte, 1);
    }
  }
  // Waits up to timeout_s (negative: forever) for at least one event; returns what is queued.
  std::deque<QueuedEvent> drain(double timeout_s) {
    std::unique_lock lk(mu_);
    auto ready = [&] { return !events_.empty(); };
    if (timeout_s < 0) {
      cv_.wait(lk, ready);
    } else if (timeout_s > 0) {
      cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), ready);
    }
    return std::exchange(events_, {});
  }
  void set_notify_fd(int fd) {
    std::lock_guard lk(mu_);
    notify_fd_ = fd;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<QueuedEvent> events_;
  int notify_fd_ = -1;
};

class PyEngine {
 public:
  PyEngine(std::optional<std::string> model, const py::dict& kwargs) {
    EngineConfig config = engine_config(model, kwargs);
    py::gil_scoped_release release;
    llm_ = std::make_unique<LLM>(config);
  }
  ~PyEngine() {
    py::gil_scoped_release release;  // the engine thread may be finishing a step
    stop_loop();
  }

  py::list generate(const py::list& prompts, const std::vector<bool>& add_special,
                    const std::vector<SamplingParams>& params, bool use_progress_bar) {
    LONGCTX_CHECK(prompts.size() == params.size() && prompts.size() == add_special.size(),
                  ErrorCode::kInvalidArgument, "generate: {} prompts but {} sampling params",
                  prompts.size(), params.size());
    std::vector<Prompt> ps;
    for (size_t i = 0; i < prompts.size(); ++i) ps.push_back(to_prompt(prompts[i], add_special[i]));
    std::vector<RequestOutput> outs;
    {
      py::gil_scoped_release release;
      std::lock_guard lk(mu_);
      LONGCTX_CHECK(!loop_ || loop_->stats().num_in_flight == 0, ErrorCode::kInvalidArgument,
                    "generate: streamed requests are still running on this engine (finish or "
                    "abort them first)");
      stop_loop();  // generate() drives the core itself
      outs = llm_->generate(ps, params, use_progress_bar);
    }
    py::list result;
    for (const RequestOutput& o : outs) result.append(output_dict(o));
    return result;
  }

  // Queues one request on the engine thread; its events come out of drain(). Returns (id,
  // prompt token ids).
  py::tuple submit(const py::handle& prompt, bool add_special, const SamplingParams& params) {
    Prompt p = to_prompt(prompt, add_special);
    std::vector<int32_t> prompt_ids;
    uint64_t id = submit_ids(p, params, prompt_ids);
    return py::make_tuple(id, prompt_ids);
  }

  uint64_t submit_ids(const Prompt& p, const SamplingParams& params,
                      std::vector<int32_t>& prompt_ids) {
    py::gil_scoped_release release;
    params.validate();
    std::vector<int32_t> ids = llm_->encode(p);
    prompt_ids = ids;
    std::lock_guard lk(mu_);
    if (!loop_) loop_ = std::make_unique<EngineLoop>(engine_core(*llm_));
    std::shared_ptr<EventQueue> queue = queue_;
    std::optional<uint64_t> id = loop_->submit(std::move(ids), params, [queue](const LoopEvent& e) {
      if (e.kind == LoopEvent::Kind::kAccepted) return;
      QueuedEvent q;
      q.id = e.id;
      q.text = std::string(e.text);
      q.new_token_ids.assign(e.new_token_ids.begin(), e.new_token_ids.end());
      q.new_logprobs.assign(e.new_logprobs.begin(), e.new_logprobs.end());
      q.finished = e.finished || e.kind == LoopEvent::Kind::kRejected;
      if (e.output) q.output = *e.output;
      q.error = e.error;
      queue->push(std::move(q));
    });
    LONGCTX_CHECK(id.has_value(), ErrorCode::kInvalidArgument, "the engine is shutting down");
    return *id;
  }

  void abort(uint64_t id) {
    py::gil_scoped_release release;
    std::lock_guard lk(mu_);
    if (loop_) loop_->abort(id);
  }

  // [(id, text, new_token_ids, new_logprobs, finished, output dict or None, exception or None)]
  py::list drain(double timeout_s) {
    std::deque<QueuedEvent> events;
    {
      py::gil_scoped_release release;
      events = queue_->drain(timeout_s);
    }
    py::list out;
    for (QueuedEvent& e : events) {
      out.append(
          py::make_tuple(e.id, py::bytes(e.text).attr("decode")("utf-8", "replace"),
                         e.new_token_ids, logprobs_list(e.new_logprobs), e.finished,
                         e.output ? py::object(output_dict(*e.output)) : py::object(py::none()),
                         e.error ? exception_object(*e.error) : py::object(py::none())));
    }
    return out;
  }

  void set_notify_fd(int fd) { queue_->set_notify_fd(fd); }

  py::dict stats() {
    EngineStats s;
    int64_t in_flight = 0;
    {
      py::gil_scoped_release release;
      std::lock_guard lk(mu_);
      if (loop_) {
        LoopStats ls = loop_->stats();
        s = ls.engine;
        in_flight = ls.num_in_flight;
      } else {
        s = engine_core(*llm_).stats();
      }
    }
    py::dict d;
    d["num_running"] = s.num_running;
    d["num_waiting"] = s.num_waiting;
    d["num_in_flight"] = in_flight;
    d["kv_blocks_total"] = s.kv_blocks_total;
    d["kv_blocks_used"] = s.kv_blocks_used;
    d["kv_block_size"] = s.kv_block_size;
    d["prefix_cache_queries"] = s.prefix_cache_queries;
    d["prefix_cache_hits"] = s.prefix_cache_hits;
    d["num_preemptions"] = s.num_preemptions;
    d["prompt_tokens"] = s.prompt_tokens;
    d["generation_tokens"] = s.generation_tokens;
    // Speculative decoding (zeros without it), as vLLM's spec_decode counters.
    d["spec_decode_num_drafts"] = s.spec_decode.num_drafts;
    d["spec_decode_num_draft_tokens"] = s.spec_decode.num_draft_tokens;
    d["spec_decode_num_accepted_tokens"] = s.spec_decode.num_accepted_tokens;
    d["spec_decode_num_accepted_tokens_per_pos"] = s.spec_decode.num_accepted_tokens_per_pos;
    return d;
  }

  // Aborts what is in flight and stops the engine thread (generate() works again after).
  void shutdown() {
    py::gil_scoped_release release;
    std::lock_guard lk(mu_);
    stop_loop();
  }

  std::string render_chat(const std::string& messages_json, bool add_generation_prompt,
                          const std::string& extra_vars_json) const {
    py::gil_scoped_release release;
    return llm_->render_chat(messages_json, add_generation_prompt, extra_vars_json);
  }

  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const {
    const Tokenizer* t = tokenizer();
    py::gil_scoped_release release;
    return t->encode(text, add_special_tokens);
  }
  py::str decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    const Tokenizer* t = tokenizer();
    for (int32_t id : ids)
      LONGCTX_CHECK(t->is_valid_id(id), ErrorCode::kInvalidArgument,
                    "decode: token id {} is outside the vocabulary ({} tokens)", id,
                    t->vocab_size());
    std::string s = t->decode(ids, skip_special_tokens);
    return py::bytes(s).attr("decode")("utf-8", "replace");
  }
  size_t vocab_size() const { return tokenizer()->vocab_size(); }
  py::object special_id(bool eos) const {
    auto id = eos ? tokenizer()->eos_token_id() : tokenizer()->bos_token_id();
    return id ? py::object(py::int_(*id)) : py::object(py::none());
  }
  int64_t max_model_len() const { return llm_->max_model_len(); }
  std::string device() const { return llm_->device().str(); }

 private:
  const Tokenizer* tokenizer() const {
    const Tokenizer* t = llm_->tokenizer();
    LONGCTX_CHECK(t != nullptr, ErrorCode::kNotFound, "this model has no tokenizer.json");
    return t;
  }
  // Callers hold mu_ (or are the destructor) and not the GIL.
  void stop_loop() {
    if (!loop_) return;
    loop_->shutdown(EngineLoop::ShutdownMode::kAbort);
    loop_.reset();
  }

  std::unique_ptr<LLM> llm_;
  std::mutex mu_;  // guards loop_
  std::unique_ptr<EngineLoop> loop_;
  std::shared_ptr<EventQueue> queue_ = std::make_shared<EventQueue>();
};

SamplingParams make_sampling_params(double temperature, int64_t top_k, double top_p, double min_p,
                                    std::optional<uint64_t> seed, double repetition_penalty,
                                    double presence_penalty, double frequency_penalty,
                                    int64_t max_tokens, std::vector<std::string> stop,
                                    std::vector<int32_t> stop_token_ids, bool ignore_eos,
                                    bool skip_special_tokens, std::optional<int> logprobs,
                                    std::optional<std::string> json_schema, bool json_object,
                                    std::optional<std::string> regex,
                                    std::optional<std::vector<std::string>> choice) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  p.repetition_penalty = repetition_penalty;
  p.presence_penalty = presence_penalty;
  p.frequency_penalty = frequency_penalty;
  p.max_tokens = max_tokens;
  p.stop = std::move(stop);
  p.stop_token_ids = std::move(stop_token_ids);
  p.ignore_eos = ignore_eos;
  p.skip_special_tokens = skip_special_tokens;
  p.logprobs = logprobs;
  LONGCTX_CHECK(int{json_schema.has_value()} + int{json_object} + int{regex.has_value()} +
                        int{choice.has_value()} <=
                    1,
                ErrorCode::kInvalidArgument,
                "SamplingParams: json_schema, json_object, regex and choice are exclusive");
  if (json_schema) {
    p.structured.kind = StructuredOutput::Kind::kJsonSchema;
    p.structured.json_schema = *json_schema;
  } else if (json_object) {
    p.structured.kind = StructuredOutput::Kind::kJsonObject;
  } else if (regex) {
    p.structured.kind = StructuredOutput::Kind::kRegex;
    p.structured.regex = *regex;
  } else if (choice) {
    p.structured.kind = StructuredOutput::Kind::kChoice;
    p.structured.choices = *choice;
  }
  p.validate();
  return p;
}

}  // namespace

void register_engine(py::module_& m) {
  py::class_<SamplingParams>(m, "SamplingParams")
      .def(py::init(&make_sampling_params), py::kw_only(), py::arg("temperature") = 1.0,
           py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("min_p") = 0.0,
           py::arg("seed") = py::none(), py::arg("repetition_penalty") = 1.0,
           py::arg("presence_penalty") = 0.0, py::arg("frequency_penalty") = 0.0,
           py::arg("max_tokens") = 16, py::arg("stop") = std::vector<std::string>{},
           py::arg("stop_token_ids") = std::vector<int32_t>{}, py::arg("ignore_eos") = false,
           py::arg("skip_special_tokens") = true, py::arg("logprobs") = py::none(),
           py::arg("json_schema") = py::none(), py::arg("json_object") = false,
           py::arg("regex") = py::none(), py::arg("choice") = py::none())
      .def_readonly("temperature", &SamplingParams::temperature)
      .def_readonly("top_k", &SamplingParams::top_k)
      .def_readonly("top_p", &SamplingParams::top_p)
      .def_readonly("min_p", &SamplingParams::min_p)
      .def_readonly("seed", &SamplingParams::seed)
      .def_readonly("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_readonly("presence_penalty", &SamplingParams::presence_penalty)
      .def_readonly("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_readonly("max_tokens", &SamplingParams::max_tokens)
      .def_readonly("stop", &SamplingParams::stop)
      .def_readonly("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_readonly("ignore_eos", &SamplingParams::ignore_eos)
      .def_readonly("skip_special_tokens", &SamplingParams::skip_special_tokens)
      .def_readonly("logprobs", &SamplingParams::logprobs)
      .def("__repr__", [](const SamplingParams& p) {
        return "SamplingParams(temperature=" + std::to_string(p.temperature) +
               ", top_p=" + std::to_string(p.top_p) + ", top_k=" + std::to_string(p.top_k) +
               ", max_tokens=" + std::to_string(p.max_tokens) + ")";
      });

  m.def("engine_arg_names", &engine_arg_names, "The keyword arguments LLM() takes.");

  py::class_<PyEngine>(m, "Engine")
      .def(py::init<std::optional<std::string>, const py::dict&>(), py::arg("model"),
           py::arg("engine_args"))
      .def("generate", &PyEngine::generate, py::arg("prompts"), py::arg("add_special_tokens"),
           py::arg("params"), py::arg("use_progress_bar"))
      .def("submit", &PyEngine::submit, py::arg("prompt"), py::arg("add_special_tokens"),
           py::arg("params"))
      .def("abort", &PyEngine::abort, py::arg("id"))
      .def("drain", &PyEngine::drain, py::arg("timeout_s"))
      .def("set_notify_fd", &PyEngine::set_notify_fd, py::arg("fd"))
      .def("stats", &PyEngine::stats)
      .def("shutdown", &PyEngine::shutdown)
      .def("render_chat", &PyEngine::render_chat, py::arg("messages_json"),
           py::arg("add_generation_prompt"), py::arg("extra_vars_json"))
      .def("encode", &PyEngine::encode, py::arg("text"), py::arg("add_special_tokens"))
      .def("decode", &PyEngine::decode, py::arg("ids"), py::arg("skip_special_tokens"))
      .def("vocab_size", &PyEngine::vocab_size)
      .def("eos_token_id", [](const PyEngine& e) { return e.special_id(true); })
      .def("bos_token_id", [](const PyEngine& e) { return e.special_id(false); })
      .def("max_model_len", &PyEngine::max_model_len)
      .def("device", &PyEngine::device);
}

}  // namespace longctx::python
