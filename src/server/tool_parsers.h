// Tool calls in a model's own output format, parsed out of its text: Hermes/Qwen
// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (one or several), Llama-3 JSON
// (`{"name": ..., "parameters": {...}}` as the whole reply, optionally after `<|python_tag|>`,
// several separated by `;`) and Mistral `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
// Names as vLLM's --tool-call-parser.
//
// One incremental parser serves both the streamed and the whole response, so a reply parses the
// same however it is chunked. A call is held until it is complete: a malformed one (bad JSON, a
// tool that was not declared) then goes back to the text verbatim instead of leaving a client
// with a half-streamed call.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace longctx::server {

enum class ToolParserKind { kNone, kHermes, kLlama3Json, kMistral };

// "hermes", "llama3_json", "mistral"; nullopt for any other name.
std::optional<ToolParserKind> tool_parser_from_name(std::string_view name);
const char* tool_parser_name(ToolParserKind kind);
// The format a chat template's text shows (`<tool_call>`, `<|python_tag|>`, `[TOOL_CALLS]`);
// kNone when it shows none of them.
ToolParserKind detect_tool_parser(std::string_view chat_template);

struct ParsedToolCall {
  int index = 0;          // 0, 1, ... in the order the model wrote them
  std::string name;       // a declared tool
  std::string arguments;  // a JSON object, compact
  bool operator==(const ParsedToolCall&) const = default;
};

// What one piece of output adds: text for `content` and the calls completed by it.
struct ToolParseDelta {
  std::string content;
  std::vector<ParsedToolCall> calls;
};

class ToolCallStreamParser {
 public:
  // tool_names: the declared tools; a call to any other name stays text.
  ToolCallStreamParser(ToolParserKind kind, std::vector<std::string> tool_names);
  ToolParseDelta feed(std::string_view text);
  // The end of the output: what was held back (an unfinished call: text unless it parses).
  ToolParseDelta finish();
  int calls_emitted() const { return next_index_; }

 private:
  enum class State { kStart, kText, kCall, kAfterJson, kPlain };
  void step(ToolParseDelta& out, bool at_end);
  void emit_text(ToolParseDelta& out, std::string_view text);
  // The complete call text `raw` (markers included) and its JSON `body`: calls, or text.
  void close_call(ToolParseDelta& out, std::string_view raw, std::string_view body);
  bool call_from_json(std::string_view body, std::vector<ParsedToolCall>& calls) const;

  ToolParserKind kind_;
  std::vector<std::string> names_;
  State state_;
  std::string buf_;  // text not yet emitted
  size_t scan_ = 0;  // kCall: how far buf_ was scanned for the call's end
  int depth_ = 0;    // kCall (JSON formats): bracket depth outside strings
  bool in_string_ = false, escape_ = false;
  size_t json_begin_ = 0;   // kCall (JSON formats): where the JSON starts in buf_
  std::string pending_ws_;  // whitespace after a call, dropped unless text follows
  bool hold_ws_ = false;    // a call was the last thing emitted
  int next_index_ = 0;
};

// The whole output at once: content (text outside the calls) and the calls.
ToolParseDelta parse_tool_calls(ToolParserKind kind, std::string_view text,
                                const std::vector<std::string>& tool_names);

}  // namespace longctx::server
