#include "longctx/engine/stop_strings.h"

#include <algorithm>

#include "longctx/core/error.h"

namespace longctx {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) {
    LONGCTX_CHECK(!s.empty(), ErrorCode::kInvalidArgument, "empty stop string");
  }
}

size_t StopStringMatcher::partial_match_length() const {
  size_t best = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, text_.size()); k > best; --k) {
      if (std::string_view(text_).substr(text_.size() - k) == std::string_view(s).substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

StopStringMatcher::Update StopStringMatcher::append(std::string_view piece) {
  LONGCTX_ASSERT(!stopped_, "text appended after a stop string matched");
  Update update;
  const size_t old_size = text_.size();
  text_.append(piece);
  // A match must end inside the new piece (else it would have matched before), so it starts at
  // most len(stop)-1 bytes before it. The earliest match in the text wins.
  size_t cut = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t from = old_size >= stops_[i].size() ? old_size - stops_[i].size() + 1 : 0;
    const size_t pos = text_.find(stops_[i], from);
    if (pos != std::string::npos && pos < cut) {
      cut = pos;
      update.stop_index = i;
    }
  }
  if (update.stop_index) {
    stopped_ = true;
    text_.resize(cut);
    if (cut > emitted_) update.emit = text_.substr(emitted_);
    emitted_ = text_.size();
    return update;
  }
  const size_t hold = partial_match_length();
  const size_t safe = std::max(text_.size() - hold, emitted_);
  update.emit = text_.substr(emitted_, safe - emitted_);
  emitted_ = safe;
  return update;
}

std::string StopStringMatcher::flush() {
  std::string rest = text_.substr(std::min(emitted_, text_.size()));
  emitted_ = text_.size();
  return rest;
}

}  // namespace longctx
