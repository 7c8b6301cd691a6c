#include "server/reasoning_parser.h"

#include <algorithm>

#include "server/marker_suffix.h"

namespace longctx::server {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

}  // namespace

std::optional<ReasoningParserKind> reasoning_parser_from_name(std::string_view name) {
  if (name == "qwen3") return ReasoningParserKind::kQwen3;
  if (name == "deepseek_r1") return ReasoningParserKind::kDeepSeekR1;
  return std::nullopt;
}

ReasoningStreamParser::ReasoningStreamParser(ReasoningParserKind kind)
    : kind_(kind), state_(kind == ReasoningParserKind::kNone ? State::kContent : State::kStart) {}

ReasoningDelta ReasoningStreamParser::feed(std::string_view text) {
  ReasoningDelta out;
  buf_.append(text);
  step(out, false);
  return out;
}

ReasoningDelta ReasoningStreamParser::finish() {
  ReasoningDelta out;
  step(out, true);
  return out;
}

void ReasoningStreamParser::step(ReasoningDelta& out, bool at_end) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // Whitespace before the opening tag belongs to whichever side follows.
        const size_t first = buf_.find_first_not_of(" \n\t\r");
        const std::string_view rest =
            first == std::string::npos ? std::string_view() : std::string_view(buf_).substr(first);
        if (rest.starts_with(kOpen)) {
          buf_.erase(0, first + kOpen.size());
          state_ = State::kReasoning;
        } else if (!at_end && kOpen.starts_with(rest)) {
          return;  // "", "<", "<th", ...: not yet known
        } else {
          state_ = kind_ == ReasoningParserKind::kDeepSeekR1 ? State::kReasoning : State::kContent;
        }
        break;
      }
      case State::kReasoning: {
        const size_t at = buf_.find(kClose);
        if (at == std::string::npos) {
          const size_t keep = at_end ? 0 : partial_marker_suffix(buf_, kClose);
          out.reasoning.append(buf_, 0, buf_.size() - keep);
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        out.reasoning.append(buf_, 0, at);
        buf_.erase(0, at + kClose.size());
        state_ = State::kContentStart;
        break;
      }
      case State::kContentStart: {
        const size_t first = buf_.find_first_not_of(" \n\t\r");
        if (first == std::string::npos) {
          buf_.clear();
          return;
        }
        buf_.erase(0, first);
        state_ = State::kContent;
        break;
      }
      case State::kContent:
        out.content += buf_;
        buf_.clear();
        return;
    }
  }
}

ReasoningDelta parse_reasoning(ReasoningParserKind kind, std::string_view text) {
  ReasoningStreamParser p(kind);
  ReasoningDelta out = p.feed(text);
  ReasoningDelta rest = p.finish();
  out.reasoning += rest.reasoning;
  out.content += rest.content;
  return out;
}

}  // namespace longctx::server
