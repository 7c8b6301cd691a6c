// Stop strings over streamed text. Text arrives in pieces (one detokenized delta per token); a
// stop string may be split across pieces, so the tail of the text that could still grow into a
// stop string is held back, and a completed stop string is never emitted (nor anything after
// it), as vLLM does with include_stop_str_in_output=false.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace longctx {

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Update {
    std::string emit;                  // text safe to show now
    std::optional<size_t> stop_index;  // set when stops()[i] completed: generation ends
  };
  // Appends the next piece of output text.
  Update append(std::string_view piece);
  // The held-back tail, once generation ended for another reason (length, EOS, stop token).
  std::string flush();

  const std::string& text() const { return text_; }  // the output so far (cut at a stop string)
  const std::vector<std::string>& stops() const { return stops_; }
  bool stopped() const { return stopped_; }

 private:
  // Length of the longest suffix of text_ that is a proper prefix of some stop string.
  size_t partial_match_length() const;

  std::vector<std::string> stops_;
  std::string text_;
  size_t emitted_ = 0;  // bytes of text_ already returned
  bool stopped_ = false;
};

}  // namespace longctx
