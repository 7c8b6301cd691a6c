// `<think>...</think>` split off a model's output into `reasoning_content` (vLLM's
// --reasoning-parser): qwen3, whose output opens the tag itself (no `<think>` at the start: no
// reasoning), and deepseek_r1, whose template opens it in the prompt (the output starts inside
// the reasoning; a `<think>` it writes anyway is skipped). Incremental, so tags split across
// stream chunks (`<thi` + `nk>`) are found; the whitespace after `</think>` is dropped.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace longctx::server {

enum class ReasoningParserKind { kNone, kQwen3, kDeepSeekR1 };

// "qwen3", "deepseek_r1"; nullopt for any other name.
std::optional<ReasoningParserKind> reasoning_parser_from_name(std::string_view name);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningStreamParser {
 public:
  explicit ReasoningStreamParser(ReasoningParserKind kind);
  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();  // what was held back (a partial tag is text of its side)

 private:
  enum class State { kStart, kReasoning, kContentStart, kContent };
  void step(ReasoningDelta& out, bool at_end);

  ReasoningParserKind kind_;
  State state_;
  std::string buf_;
};

ReasoningDelta parse_reasoning(ReasoningParserKind kind, std::string_view text);

}  // namespace longctx::server
