// Added (and special) tokens: found in the text before pre-tokenization, leftmost-longest, with
// Hugging Face's lstrip / rstrip / single_word semantics.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace longctx::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

struct AddedMatch {
  size_t start, end;  // byte range in the text, including stripped whitespace
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // patterns[i] is what to look for (the content, or its normalized form) for tokens[i].
  void build(const std::vector<const AddedToken*>& tokens,
             const std::vector<std::string>& patterns);
  bool empty() const { return tokens_.empty(); }
  // Appends the matches in text, in order and non-overlapping.
  void find(std::string_view text, std::vector<AddedMatch>& out) const;

 private:
  int32_t child(int32_t node, uint8_t b) const {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | b);
    return it == edges_.end() ? -1 : it->second;
  }
  std::vector<const AddedToken*> tokens_;
  std::vector<int32_t> node_token_;              // per trie node: index into tokens_ or -1
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  bool first_byte_[256] = {};
};

}  // namespace longctx::tokenizer
