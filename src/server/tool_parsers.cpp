#include "server/tool_parsers.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"
#include "server/marker_suffix.h"

namespace longctx::server {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr int kMaxCallDepth = 64;  // nesting a call's JSON may have

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

std::optional<ToolParserKind> tool_parser_from_name(std::string_view name) {
  if (name == "hermes") return ToolParserKind::kHermes;
  if (name == "llama3_json") return ToolParserKind::kLlama3Json;
  if (name == "mistral") return ToolParserKind::kMistral;
  return std::nullopt;
}

const char* tool_parser_name(ToolParserKind kind) {
  switch (kind) {
    case ToolParserKind::kHermes:
      return "hermes";
    case ToolParserKind::kLlama3Json:
      return "llama3_json";
    case ToolParserKind::kMistral:
      return "mistral";
    case ToolParserKind::kNone:
      break;
  }
  return "none";
}

ToolParserKind detect_tool_parser(std::string_view chat_template) {
  if (chat_template.find(kHermesOpen) != std::string_view::npos) return ToolParserKind::kHermes;
  if (chat_template.find(kMistralCalls) != std::string_view::npos) return ToolParserKind::kMistral;
  if (chat_template.find(kPythonTag) != std::string_view::npos) return ToolParserKind::kLlama3Json;
  return ToolParserKind::kNone;
}

ToolCallStreamParser::ToolCallStreamParser(ToolParserKind kind, std::vector<std::string> tool_names)
    : kind_(kind),
      names_(std::move(tool_names)),
      state_(kind == ToolParserKind::kLlama3Json ? State::kStart
             : kind == ToolParserKind::kNone     ? State::kPlain
                                                 : State::kText) {}

ToolParseDelta ToolCallStreamParser::feed(std::string_view text) {
  ToolParseDelta out;
  buf_.append(text);
  step(out, false);
  return out;
}

ToolParseDelta ToolCallStreamParser::finish() {
  ToolParseDelta out;
  step(out, true);
  pending_ws_.clear();  // whitespace after the last call
  return out;
}

void ToolCallStreamParser::emit_text(ToolParseDelta& out, std::string_view text) {
  if (text.empty()) return;
  if (!hold_ws_) {
    out.content.append(text);
    return;
  }
  if (std::all_of(text.begin(), text.end(), is_space)) {
    pending_ws_.append(text);
    return;
  }
  out.content += pending_ws_;
  out.content.append(text);
  pending_ws_.clear();
  hold_ws_ = false;
}

bool ToolCallStreamParser::call_from_json(std::string_view body,
                                          std::vector<ParsedToolCall>& calls) const {
  Json doc;
  try {
    doc = parse_ordered_json(body, "a tool call", kMaxCallDepth);
  } catch (const Error&) {
    return false;
  }
  auto one = [&](const Json& c) {
    if (!c.is_object()) return false;
    auto name = c.find("name");
    if (name == c.end() || !name->is_string()) return false;
    if (std::find(names_.begin(), names_.end(), name->get<std::string>()) == names_.end())
      return false;
    Json args = Json::object();
    auto a = c.find("arguments");
    if (a == c.end()) a = c.find("parameters");  // Llama 3's name for them
    if (a != c.end()) {
      args = *a;
      // Some models write the arguments as a JSON string, as the API returns them.
      if (args.is_string()) {
        try {
          args = parse_ordered_json(args.get<std::string>(), "tool arguments", kMaxCallDepth);
        } catch (const Error&) {
          return false;
        }
      }
    }
    if (!args.is_object()) return false;
    calls.push_back(
        {0, name->get<std::string>(), args.dump(-1, ' ', false, Json::error_handler_t::replace)});
    return true;
  };
  const size_t before = calls.size();
  bool ok = true;
  if (doc.is_array() && kind_ == ToolParserKind::kMistral) {
    ok = !doc.empty();
    for (const Json& c : doc) ok = ok && one(c);
  } else {
    ok = one(doc);
  }
  if (!ok) calls.resize(before);
  return ok;
}

void ToolCallStreamParser::close_call(ToolParseDelta& out, std::string_view raw,
                                      std::string_view body) {
  std::vector<ParsedToolCall> calls;
  if (!call_from_json(body, calls)) {
    emit_text(out, raw);
    return;
  }
  for (ParsedToolCall& c : calls) {
    c.index = next_index_++;
    out.calls.push_back(std::move(c));
  }
  pending_ws_.clear();
  hold_ws_ = true;
}

void ToolCallStreamParser::step(ToolParseDelta& out, bool at_end) {
  for (;;) {
    switch (state_) {
      case State::kPlain:
        emit_text(out, buf_);
        buf_.clear();
        return;
      case State::kStart: {
        // Llama 3: a call is the whole reply, so only a reply that starts with `{` or the
        // python tag (after whitespace) is one.
        const size_t first = buf_.find_first_not_of(" \n\t\r");
        if (first == std::string::npos) {
          if (at_end)
            state_ = State::kPlain;
          else
            return;
          break;
        }
        const std::string_view rest = std::string_view(buf_).substr(first);
        if (rest.starts_with(kPythonTag)) {
          state_ = State::kCall;
          json_begin_ = scan_ = first + kPythonTag.size();
        } else if (rest[0] == '{') {
          state_ = State::kCall;
          json_begin_ = scan_ = first;
        } else if (kPythonTag.starts_with(rest) && !at_end) {
          return;
        } else {
          state_ = State::kPlain;
        }
        depth_ = 0;
        in_string_ = escape_ = false;
        break;
      }
      case State::kText: {
        const std::string_view marker =
            kind_ == ToolParserKind::kHermes ? kHermesOpen : kMistralCalls;
        const size_t at = buf_.find(marker);
        if (at == std::string::npos) {
          const size_t keep = at_end ? 0 : partial_marker_suffix(buf_, marker);
          emit_text(out, std::string_view(buf_).substr(0, buf_.size() - keep));
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        emit_text(out, std::string_view(buf_).substr(0, at));
        buf_.erase(0, at);
        state_ = State::kCall;
        json_begin_ = scan_ = marker.size();
        depth_ = 0;
        in_string_ = escape_ = false;
        break;
      }
      case State::kCall: {
        const State after = kind_ == ToolParserKind::kLlama3Json ? State::kAfterJson : State::kText;
        if (kind_ == ToolParserKind::kHermes) {
          const size_t at = buf_.find(kHermesClose, scan_);
          if (at == std::string::npos) {
            if (!at_end) {
              scan_ = std::max(kHermesOpen.size(), buf_.size() >= kHermesClose.size()
                                                       ? buf_.size() - kHermesClose.size() + 1
                                                       : size_t{0});
              return;
            }
            // Cut off before its closing tag (a stop string, max_tokens): a call only if the
            // JSON is complete.
            close_call(out, buf_, std::string_view(buf_).substr(kHermesOpen.size()));
            buf_.clear();
            state_ = State::kText;
            return;
          }
          const size_t end = at + kHermesClose.size();
          close_call(out, std::string_view(buf_).substr(0, end),
                     std::string_view(buf_).substr(kHermesOpen.size(), at - kHermesOpen.size()));
          buf_.erase(0, end);
          state_ = State::kText;
          break;
        }
        // The JSON formats: the call ends where its outermost bracket closes.
        size_t end = std::string::npos;
        bool bad = false;
        for (; scan_ < buf_.size(); ++scan_) {
          const char c = buf_[scan_];
          if (in_string_) {
            if (escape_)
              escape_ = false;
            else if (c == '\\')
              escape_ = true;
            else if (c == '"')
              in_string_ = false;
            continue;
          }
          if (depth_ == 0 && is_space(c)) continue;
          if (depth_ == 0 && c != '{' && c != '[') {
            bad = true;  // not JSON after the marker
            break;
          }
          if (c == '"')
            in_string_ = true;
          else if (c == '{' || c == '[')
            ++depth_;
          else if (c == '}' || c == ']') {
            if (--depth_ == 0) {
              end = scan_ + 1;
              break;
            }
          }
        }
        if (bad || (end == std::string::npos && at_end)) {
          emit_text(out, buf_);
          buf_.clear();
          state_ = kind_ == ToolParserKind::kLlama3Json ? State::kPlain : State::kText;
          if (at_end) return;
          break;
        }
        if (end == std::string::npos) return;
        const int calls_before = next_index_;
        close_call(out, std::string_view(buf_).substr(0, end),
                   std::string_view(buf_).substr(json_begin_, end - json_begin_));
        const bool was_call = next_index_ > calls_before;
        buf_.erase(0, end);
        // Llama 3: text that was not a call makes the rest of the reply text too.
        state_ = was_call ? after : (kind_ == ToolParserKind::kLlama3Json ? State::kPlain : after);
        break;
      }
      case State::kAfterJson: {
        // Llama 3: more calls separated by `;` (and whitespace), else text.
        const size_t next = buf_.find_first_not_of(" \n\t\r;");
        if (next == std::string::npos) {
          if (at_end) buf_.clear();
          return;
        }
        if (buf_[next] == '{') {
          state_ = State::kCall;
          json_begin_ = scan_ = next;
          depth_ = 0;
          in_string_ = escape_ = false;
        } else {
          state_ = State::kPlain;
        }
        break;
      }
    }
  }
}

ToolParseDelta parse_tool_calls(ToolParserKind kind, std::string_view text,
                                const std::vector<std::string>& tool_names) {
  ToolCallStreamParser p(kind, tool_names);
  ToolParseDelta out = p.feed(text);
  ToolParseDelta rest = p.finish();
  out.content += rest.content;
  for (ParsedToolCall& c : rest.calls) out.calls.push_back(std::move(c));
  return out;
}

}  // namespace longctx::server
