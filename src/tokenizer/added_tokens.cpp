#include "tokenizer/added_tokens.h"

#include "tokenizer/unicode.h"

namespace longctx::tokenizer {
namespace {

// The code point that ends just before byte offset `pos` (text is valid UTF-8), or 0.
uint32_t code_point_before(std::string_view text, size_t pos, size_t* start) {
  if (pos == 0) return 0;
  size_t p = pos - 1;
  while (p > 0 && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) --p;
  *start = p;
  int len = unicode::valid_sequence_length(text, p);
  return len > 0 ? unicode::decode_at(text, p, len) : unicode::kReplacementChar;
}

uint32_t code_point_at(std::string_view text, size_t pos, int* len) {
  *len = unicode::valid_sequence_length(text, pos);
  if (*len == 0) {
    *len = 1;
    return unicode::kReplacementChar;
  }
  return unicode::decode_at(text, pos, *len);
}

// single_word boundaries: a word character is alphanumeric or '_'. Outside ASCII every
// non-whitespace character counts as part of a word (an approximation of Unicode alphanumeric).
bool is_word_char(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  return !unicode::is_whitespace(cp);
}

}  // namespace

void AddedTokenMatcher::build(const std::vector<const AddedToken*>& tokens,
                              const std::vector<std::string>& patterns) {
  tokens_ = tokens;
  node_token_.assign(1, -1);
  edges_.clear();
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& p = patterns[t];
    if (p.empty()) continue;
    first_byte_[static_cast<uint8_t>(p[0])] = true;
    int32_t node = 0;
    for (char c : p) {
      uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        int32_t next = static_cast<int32_t>(node_token_.size());
        node_token_.push_back(-1);
        edges_.emplace(key, next);
        node = next;
      } else {
        node = it->second;
      }
    }
    if (node_token_[node] < 0) node_token_[node] = static_cast<int32_t>(t);
  }
}

void AddedTokenMatcher::find(std::string_view text, std::vector<AddedMatch>& out) const {
  if (tokens_.empty()) return;
  size_t floor = 0;  // lstrip never reaches back into the previous match
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < text.size(); ++k) {
      node = child(node, static_cast<uint8_t>(text[k]));
      if (node < 0) break;
      if (node_token_[node] >= 0) {
        best = node_token_[node];
        best_end = k + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = *tokens_[best];
    size_t start = i, end = best_end;
    if (tok.single_word) {
      size_t prev_start = 0;
      int len = 0;
      bool left_ok = start == 0 || !is_word_char(code_point_before(text, start, &prev_start));
      bool right_ok = end == text.size() || !is_word_char(code_point_at(text, end, &len));
      if (!left_ok || !right_ok) {
        ++i;
        continue;
      }
    }
    if (tok.lstrip) {
      size_t s = start, prev_start = 0;
      while (s > floor) {
        uint32_t cp = code_point_before(text, s, &prev_start);
        if (!unicode::is_whitespace(cp) || prev_start < floor) break;
        s = prev_start;
      }
      start = s;
    }
    if (tok.rstrip) {
      while (end < text.size()) {
        int len = 0;
        uint32_t cp = code_point_at(text, end, &len);
        if (!unicode::is_whitespace(cp)) break;
        end += len;
      }
    }
    out.push_back({start, end, tok.id});
    floor = end;
    i = end;
  }
}

}  // namespace longctx::tokenizer
