// Pre-tokenizers: split normalized text into the pieces ("words") BPE encodes one at a time.
// Supported: Split (regex via PCRE2 with UTF + UCP, or a literal string; every behavior, invert),
// ByteLevel (add_prefix_space, use_regex with GPT-2's pattern; the byte mapping itself is done
// by the byte-level BPE model) and Sequence.
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace longctx::tokenizer {

// PCRE2 pattern compiled with PCRE2_UTF | PCRE2_UCP (and JIT where available).
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Finds the next non-empty match in subject at or after `offset`; false when none. The
  // subject must be valid UTF-8 (checked once by the caller).
  bool next_match(std::string_view subject, size_t offset, size_t* start, size_t* end) const;

 private:
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
  std::string what_;  // names the pattern in match errors
};

// Scratch storage for pieces that are not substrings of the input (add_prefix_space).
using PieceArena = std::deque<std::string>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their split.
  virtual void split(std::vector<std::string_view>& pieces, PieceArena& arena) const = 0;
};

// Builds the pre-tokenizer of tokenizer.json's "pre_tokenizer" (non-null). Throws Error naming
// an unsupported type. Sets *has_byte_level when a ByteLevel step is present.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, bool* has_byte_level);

}  // namespace longctx::tokenizer
