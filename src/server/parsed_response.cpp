// ResponseBuilder's parsed chat output: the text split by the reasoning parser into
// reasoning_content and the rest, the rest by the tool parser into content and tool_calls;
// streamed as OpenAI streams them (a call's first delta carries index, id, type and name, the
// next its arguments).
#include <algorithm>

#include "server/openai_protocol.h"

namespace longctx::server {

std::vector<ParsedToolCall> ResponseBuilder::kept_calls(std::vector<ParsedToolCall> calls) const {
  if (!parsing_.parallel_tool_calls)
    std::erase_if(calls, [](const ParsedToolCall& c) { return c.index > 0; });
  return calls;
}

const std::string& ResponseBuilder::parsed_call_id(int index) {
  while (call_ids_.size() <= static_cast<size_t>(index)) call_ids_.push_back(random_id("call_"));
  return call_ids_[static_cast<size_t>(index)];
}

Json ResponseBuilder::chat_chunk(Json delta, Json logprobs, std::string_view finish_reason) {
  Json j = chunk_base();
  j["choices"] = Json::array(
      {{{"index", 0},
        {"delta", std::move(delta)},
        {"logprobs", std::move(logprobs)},
        {"finish_reason", finish_reason.empty() ? Json(nullptr) : Json(finish_reason)}}});
  return j;
}

std::string ResponseBuilder::parsed_delta_chunks(std::string_view text,
                                                 std::span<const TokenLogprobs> logprobs,
                                                 std::string_view finish_reason) {
  const bool last = !finish_reason.empty();
  ReasoningDelta r = reasoning_parser_.feed(text);
  if (last) {
    ReasoningDelta rest = reasoning_parser_.finish();
    r.reasoning += rest.reasoning;
    r.content += rest.content;
  }
  ToolParseDelta t = tool_parser_.feed(r.content);
  if (last) {
    ToolParseDelta rest = tool_parser_.finish();
    t.content += rest.content;
    for (ParsedToolCall& c : rest.calls) t.calls.push_back(std::move(c));
  }
  std::string events;
  Json lp = logprobs_ && !logprobs.empty() ? logprobs_json(logprobs) : Json(nullptr);
  Json delta = Json::object();
  if (!r.reasoning.empty()) delta["reasoning_content"] = r.reasoning;
  if (!t.content.empty()) delta["content"] = t.content;
  if (!delta.empty() || !lp.is_null()) {
    events += sse(chat_chunk(std::move(delta), lp, ""));
    lp = nullptr;
  }
  for (const ParsedToolCall& c : kept_calls(std::move(t.calls))) {
    any_call_ = true;
    Json head = {{"index", c.index},
                 {"id", parsed_call_id(c.index)},
                 {"type", "function"},
                 {"function", {{"name", c.name}, {"arguments", ""}}}};
    events += sse(chat_chunk({{"tool_calls", Json::array({head})}}, nullptr, ""));
    Json args = {{"index", c.index}, {"function", {{"arguments", c.arguments}}}};
    events += sse(chat_chunk({{"tool_calls", Json::array({args})}}, nullptr, ""));
  }
  if (last) {
    std::string_view finish = finish_reason;
    if (any_call_ && finish == "stop") finish = "tool_calls";
    events += sse(chat_chunk(Json::object(), nullptr, finish));
  }
  return events;
}

Json ResponseBuilder::parsed_message(std::string_view text, std::string& finish) {
  const ReasoningDelta r = parse_reasoning(parsing_.reasoning, text);
  ToolParseDelta t = parse_tool_calls(parsing_.tool, r.content, parsing_.tool_names);
  const std::vector<ParsedToolCall> calls = kept_calls(std::move(t.calls));
  Json message = {{"role", "assistant"}};
  const bool blank = std::all_of(t.content.begin(), t.content.end(), [](char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
  });
  // Only whitespace around the calls, or nothing after the reasoning: no content (null).
  const bool no_content = (!calls.empty() && blank) ||
                          (t.content.empty() && parsing_.reasoning != ReasoningParserKind::kNone);
  message["content"] = no_content ? Json(nullptr) : Json(t.content);
  if (parsing_.reasoning != ReasoningParserKind::kNone)
    message["reasoning_content"] = r.reasoning.empty() ? Json(nullptr) : Json(r.reasoning);
  if (!calls.empty()) {
    Json list = Json::array();
    for (const ParsedToolCall& c : calls) {
      list.push_back({{"id", parsed_call_id(c.index)},
                      {"type", "function"},
                      {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    message["tool_calls"] = std::move(list);
    if (finish == "stop") finish = "tool_calls";
  }
  return message;
}

}  // namespace longctx::server
