#include "chat_repl.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "generate_common.h"
#include "line_editor.h"
#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"

namespace longctx::cli {
namespace {

using Json = nlohmann::ordered_json;

// Set by SIGINT; read by the line editor's caller and by the engine between steps (the cancel
// flag of generate_stream), so the handler does nothing but this store.
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the SIGINT flag must be signal-safe");

extern "C" void on_sigint(int /*signo*/) { g_interrupted.store(true, std::memory_order_relaxed); }

// Installs on_sigint for the session and restores the previous disposition after it. Whichever
// thread the kernel picks for the signal, only the flag changes: the line editor and the engine
// poll it.
class SigintHandler {
 public:
  SigintHandler() {
    struct sigaction sa = {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, &previous_);
  }
  ~SigintHandler() { sigaction(SIGINT, &previous_, nullptr); }
  SigintHandler(const SigintHandler&) = delete;
  SigintHandler& operator=(const SigintHandler&) = delete;

 private:
  struct sigaction previous_ = {};
};

constexpr const char* kHelp =
    "Commands (handled here, never sent to the model):\n"
    "  /help            this help\n"
    "  /clear           start over (the system prompt stays)\n"
    "  /save FILE       write the conversation as a JSON messages array (OpenAI style)\n"
    "  /load FILE       replace the conversation with a saved one\n"
    "  /exit, /quit     leave (Ctrl-D too)\n"
    "A message that starts with '/' is sent by doubling it: '//etc' sends '/etc'. A line that\n"
    "ends with '\\' continues on the next one.\n"
    "Keys: Up/Down recall earlier lines, Ctrl-R searches them; Ctrl-C stops a reply (the part\n"
    "already written stays in the conversation), clears the line being typed, and at an empty\n"
    "prompt twice in a row quits.\n";

enum class CommandKind { kMessage, kHelp, kClear, kSave, kLoad, kExit, kUnknown };

struct Input {
  CommandKind kind = CommandKind::kMessage;
  std::string text;  // the message, or the command's argument (trimmed), or the unknown command
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

Input parse_input(const std::string& line) {
  if (line.empty() || line[0] != '/') return {CommandKind::kMessage, line};
  if (line.size() > 1 && line[1] == '/') return {CommandKind::kMessage, line.substr(1)};
  const size_t space = line.find_first_of(" \t");
  const std::string name = line.substr(0, space);
  const std::string arg = space == std::string::npos ? "" : trim(line.substr(space));
  static const std::pair<const char*, CommandKind> kCommands[] = {
      {"/help", CommandKind::kHelp}, {"/clear", CommandKind::kClear}, {"/save", CommandKind::kSave},
      {"/load", CommandKind::kLoad}, {"/exit", CommandKind::kExit},   {"/quit", CommandKind::kExit},
  };
  for (const auto& [n, kind] : kCommands) {
    if (name == n) return {kind, arg};
  }
  return {CommandKind::kUnknown, name};
}

// The messages of the conversation: an optional system message, then user and assistant turns.
class Conversation {
 public:
  explicit Conversation(const std::string& system) {
    if (!system.empty()) messages_.push_back({{"role", "system"}, {"content", system}});
  }
  // Drops every turn; the leading system messages (--system, or those of a loaded file) stay.
  void clear() {
    messages_.erase(std::find_if(messages_.begin(), messages_.end(),
                                 [](const Json& m) { return m["role"] != "system"; }),
                    messages_.end());
  }
  const Json& messages() const { return messages_; }
  // The conversation with `message` appended as the next user turn.
  Json with_user(const std::string& message) const {
    Json m = messages_;
    m.push_back({{"role", "user"}, {"content", message}});
    return m;
  }
  void add_turn(const std::string& user, const std::string& assistant) {
    messages_.push_back({{"role", "user"}, {"content", user}});
    messages_.push_back({{"role", "assistant"}, {"content", assistant}});
  }
  // Drops the oldest turn (its user message and everything up to the next user message);
  // leading system messages stay. Returns false when there is no turn to drop.
  bool drop_oldest_turn() {
    auto first = std::find_if(messages_.begin(), messages_.end(),
                              [](const Json& m) { return m["role"] != "system"; });
    if (first == messages_.end()) return false;
    auto next =
        std::find_if(first + 1, messages_.end(), [](const Json& m) { return m["role"] == "user"; });
    messages_.erase(first, next);
    return true;
  }
  // Replaces the conversation with a saved one; throws Error naming the first bad message.
  void load(const Json& saved) {
    LONGCTX_CHECK(saved.is_array(), ErrorCode::kInvalidArgument,
                  "expected a JSON array of messages, got a JSON {}", saved.type_name());
    for (size_t i = 0; i < saved.size(); ++i) {
      const Json& m = saved[i];
      LONGCTX_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                        m.contains("content") && m["content"].is_string(),
                    ErrorCode::kInvalidArgument,
                    "message {} is not an object with a string \"role\" and a string \"content\"",
                    i);
      const std::string role = m["role"];
      LONGCTX_CHECK(role == "system" || role == "user" || role == "assistant",
                    ErrorCode::kInvalidArgument,
                    "message {} has role '{}' (expected system, user or assistant)", i, role);
    }
    messages_ = saved;
  }

 private:
  Json messages_ = Json::array();
};

class ChatRepl {
 public:
  ChatRepl(LLM& llm, const SamplingParams& sampling, const ChatOptions& options)
      : llm_(llm),
        sampling_(sampling),
        options_(options),
        editor_("longctx", options.history_file, &g_interrupted),
        conversation_(options.system) {
    if (options.no_thinking) template_vars_["enable_thinking"] = false;
  }

  void run() {
    std::optional<SigintHandler> sigint;
    if (editor_.interactive()) {
      sigint.emplace();
      std::fputs("longctx chat: /help for commands; Ctrl-C stops a reply, Ctrl-D quits.\n", stderr);
    }
    if (!options_.first_message.empty()) {
      try {
        send(options_.first_message);
      } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
      }
    }
    bool interrupted_at_empty_prompt = false;
    while (true) {
      g_interrupted = false;
      const LineEditor::Result r = editor_.read("> ");
      if (r.status == LineEditor::Status::kEof) break;
      if (r.status == LineEditor::Status::kInterrupted) {
        std::fputs("^C\n", stderr);
        if (r.interrupted_empty) {
          if (interrupted_at_empty_prompt) break;
          std::fputs("(Ctrl-C again or Ctrl-D to quit, /help for commands)\n", stderr);
          interrupted_at_empty_prompt = true;
        }
        continue;
      }
      interrupted_at_empty_prompt = false;
      if (trim(r.line).empty()) continue;
      editor_.add_history(r.line);
      std::string text = r.line;
      if (!read_continuation(text)) continue;
      const Input in = parse_input(text);
      try {
        if (!handle(in)) break;
      } catch (const Error& e) {
        // A bad file, a template that rejects the conversation, a request the engine refuses:
        // say so and keep the session (the conversation is unchanged).
        std::fprintf(stderr, "error: %s\n", e.what());
      }
    }
  }

 private:
  // A line ending with a backslash continues on the next one (the backslash becomes a newline),
  // so a message can span lines. Returns false when Ctrl-C or the end of input cut it short.
  bool read_continuation(std::string& text) {
    while (!text.empty() && text.back() == '\\') {
      text.back() = '\n';
      const LineEditor::Result r = editor_.read("... ");
      if (r.status != LineEditor::Status::kLine) {
        if (r.status == LineEditor::Status::kInterrupted) std::fputs("^C\n", stderr);
        return false;
      }
      editor_.add_history(r.line);
      text += r.line;
    }
    return true;
  }

  // Returns false to end the session.
  bool handle(const Input& in) {
    switch (in.kind) {
      case CommandKind::kMessage:
        send(in.text);
        return true;
      case CommandKind::kHelp:
        std::fputs(kHelp, stderr);
        return true;
      case CommandKind::kClear:
        conversation_.clear();
        std::fputs("[conversation cleared]\n", stderr);
        return true;
      case CommandKind::kSave:
        save(in.text);
        return true;
      case CommandKind::kLoad:
        load(in.text);
        return true;
      case CommandKind::kExit:
        return false;
      case CommandKind::kUnknown:
        std::fprintf(stderr, "unknown command %s (not sent to the model)\n%s", in.text.c_str(),
                     kHelp);
        return true;
    }
    return true;
  }

  void save(const std::string& path) {
    LONGCTX_CHECK(!path.empty(), ErrorCode::kInvalidArgument, "/save needs a file name");
    std::ofstream f(path);
    LONGCTX_CHECK(f.good(), ErrorCode::kNotFound, "cannot write '{}'", path);
    f << conversation_.messages().dump(2) << '\n';
    f.close();
    LONGCTX_CHECK(f.good(), ErrorCode::kInternal, "writing '{}' failed", path);
    std::fprintf(stderr, "[saved %zu messages to %s]\n", conversation_.messages().size(),
                 path.c_str());
  }

  void load(const std::string& path) {
    LONGCTX_CHECK(!path.empty(), ErrorCode::kInvalidArgument, "/load needs a file name");
    std::ifstream f(path);
    LONGCTX_CHECK(f.good(), ErrorCode::kNotFound, "cannot read '{}'", path);
    std::stringstream text;
    text << f.rdbuf();
    Json saved;
    try {
      saved = parse_ordered_json(text.str(), path);
      conversation_.load(saved);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("'{}': {}", path, e.what()));
    }
    std::fprintf(stderr, "[loaded %zu messages from %s]\n", saved.size(), path.c_str());
  }

  // The prompt of `messages` through the chat template, ready for the reply.
  std::vector<int32_t> encode(const Json& messages) const {
    Prompt p(
        llm_.render_chat(messages.dump(), /*add_generation_prompt=*/true, template_vars_.dump()));
    p.add_special_tokens = false;
    return llm_.encode(p);
  }
  int64_t count_tokens(const Json& messages) const {
    return static_cast<int64_t>(encode(messages).size());
  }

  // Tokens a turn keeps free for its reply: --max-tokens, at most half the context (so a large
  // --max-tokens still leaves room for a conversation).
  int64_t reply_room() const { return std::min(sampling_.max_tokens, llm_.max_model_len() / 2); }
  bool fits(int64_t prompt_tokens) const {
    return prompt_tokens + reply_room() <= llm_.max_model_len();
  }

  enum class FullChoice { kDropOldest, kClear, kCancel };

  FullChoice ask_when_full() {
    while (true) {
      g_interrupted = false;
      const LineEditor::Result r = editor_.read(
          "Drop the oldest turns (d), clear the conversation (c), or cancel this message (n)? "
          "[d] ");
      if (r.status != LineEditor::Status::kLine) {
        if (r.status == LineEditor::Status::kInterrupted) std::fputs("^C\n", stderr);
        return FullChoice::kCancel;
      }
      const std::string a = trim(r.line);
      if (a.empty() || a == "d" || a == "D") return FullChoice::kDropOldest;
      if (a == "c" || a == "C") return FullChoice::kClear;
      if (a == "n" || a == "N") return FullChoice::kCancel;
    }
  }

  // Makes room for `message` as the next turn (asking on a terminal, dropping the oldest turns
  // otherwise). Returns false when it is not to be sent.
  bool make_room(const std::string& message) {
    const int64_t tokens = count_tokens(conversation_.with_user(message));
    if (fits(tokens)) return true;
    const int64_t ctx = llm_.max_model_len();
    Conversation alone = conversation_;
    alone.clear();
    const int64_t alone_tokens = count_tokens(alone.with_user(message));
    if (!fits(alone_tokens)) {
      std::fprintf(stderr,
                   "this message is %lld tokens with the system prompt; with %lld kept for the "
                   "reply that is over the context of %lld tokens: not sent (shorten it, lower "
                   "--max-tokens or raise --max-model-len)\n",
                   static_cast<long long>(alone_tokens), static_cast<long long>(reply_room()),
                   static_cast<long long>(ctx));
      return false;
    }
    std::fprintf(stderr,
                 "the conversation with this message is %lld tokens; with %lld kept for the "
                 "reply it does not fit the context of %lld tokens.\n",
                 static_cast<long long>(tokens), static_cast<long long>(reply_room()),
                 static_cast<long long>(ctx));
    FullChoice choice = FullChoice::kDropOldest;
    if (editor_.interactive()) choice = ask_when_full();
    if (choice == FullChoice::kCancel) {
      std::fputs("[not sent; the conversation is unchanged]\n", stderr);
      return false;
    }
    if (choice == FullChoice::kClear) {
      conversation_.clear();
      std::fputs("[conversation cleared]\n", stderr);
      return true;
    }
    int dropped = 0;
    while (!fits(count_tokens(conversation_.with_user(message))) &&
           conversation_.drop_oldest_turn()) {
      ++dropped;
    }
    std::fprintf(stderr, "[dropped the %d oldest turn%s%s]\n", dropped, dropped == 1 ? "" : "s",
                 editor_.interactive() ? "" : " (the default without a terminal)");
    return true;
  }

  void send(const std::string& message) {
    if (!make_room(message)) return;
    const Prompt prompt(encode(conversation_.with_user(message)));
    std::string streamed;
    auto outs = llm_.generate_stream(
        {prompt}, sampling_,
        [&](const StreamEvent& ev) {
          std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
          std::fflush(stdout);
          streamed.append(ev.text);
        },
        StreamOptions{.cancel = editor_.interactive() ? &g_interrupted : nullptr,
                      .prefill_progress = true});
    const RequestOutput& out = outs.at(0);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    const bool stopped = out.finish_reason == FinishReason::kAbort;
    if (stopped) std::fputs("[stopped]\n", stderr);
    if (options_.summary) std::fprintf(stderr, "[%s]\n", summary_line(out).c_str());
    // A stopped reply stays as far as it was shown: the model sees what the user saw, and role
    // alternation (which many templates insist on) is kept.
    conversation_.add_turn(message, stopped ? streamed : out.text);
  }

  LLM& llm_;
  SamplingParams sampling_;
  ChatOptions options_;
  LineEditor editor_;
  Conversation conversation_;
  Json template_vars_ = Json::object();
};

}  // namespace

void run_chat(LLM& llm, const SamplingParams& sampling, const ChatOptions& options) {
  LONGCTX_CHECK(llm.tokenizer() != nullptr, ErrorCode::kInvalidArgument,
                "chat needs a tokenizer: the model folder has no tokenizer.json (use --tokenizer)");
  // A missing or broken chat template fails now, not at every message.
  try {
    llm.render_chat(R"([{"role": "user", "content": "hi"}])");
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("chat needs a chat template that renders a user message: {}",
                                      e.what()));
  }
  ChatRepl(llm, sampling, options).run();
}

}  // namespace longctx::cli
