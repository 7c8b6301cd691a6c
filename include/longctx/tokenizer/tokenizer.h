// Tokenizer for Hugging Face tokenizer.json files of the byte-level BPE family (Llama-3.x,
// Qwen2/3, GPT-2, SmolLM): NFC normalizer, Split / ByteLevel / Sequence pre-tokenizers, BPE
// (with ignore_merges), added/special tokens, TemplateProcessing / ByteLevel / Bert / Roberta
// post-processors and the ByteLevel decoder. Anything else is rejected at load with an Error
// naming the unsupported component.
//
// Invalid UTF-8 input is not an error: each invalid sequence is replaced with U+FFFD before
// encoding (as Python's errors="replace" would). Decoding turns byte sequences that are not
// valid UTF-8 into U+FFFD the way Hugging Face does (String::from_utf8_lossy).
//
// A Tokenizer is immutable after loading, cheap to copy (shared state) and safe to use from
// several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace longctx {

using TokenId = int32_t;

namespace tokenizer {
struct TokenizerImpl;
}

// Strings from tokenizer_config.json (empty when absent).
struct TokenizerConfig {
  std::string bos_token;
  std::string eos_token;
  std::string pad_token;
  std::string unk_token;
  std::string chat_template;  // the default template when the file lists several
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
};

class Tokenizer {
 public:
  // tokenizer.json at `path`; no tokenizer_config.json.
  static Tokenizer from_file(const std::string& path);
  // tokenizer.json text; `origin` names it in errors.
  static Tokenizer from_json(std::string_view json_text, const std::string& origin = "<memory>");
  // A model folder: tokenizer.json (required) and tokenizer_config.json (optional).
  static Tokenizer from_dir(const std::string& dir);
  // A model folder or a tokenizer.json path (a tokenizer_config.json next to it is read too).
  static Tokenizer load(const std::string& path);

  // add_special_tokens applies the post-processor (e.g. Llama-3's BOS). Added and special
  // tokens written in the text are always recognized.
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = false) const;
  void encode_into(std::string_view text, bool add_special_tokens, std::vector<TokenId>& out) const;

  // Throws Error(kOutOfRange) for an id that names no token.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  // The raw bytes one token contributes to decoded text (a token may hold part of a UTF-8
  // character).
  std::string_view token_bytes(TokenId id) const;
  // Vocabulary spelling (byte-level alphabet) or added-token content.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  std::string id_to_token(TokenId id) const;
  bool is_valid_id(TokenId id) const;
  bool is_special(TokenId id) const;
  // One past the largest id (model vocabulary and added tokens).
  size_t vocab_size() const;

  const TokenizerConfig& config() const;
  std::optional<TokenId> bos_token_id() const;  // config().bos_token's id, if any
  std::optional<TokenId> eos_token_id() const;

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer::TokenizerImpl> impl);
  std::shared_ptr<const tokenizer::TokenizerImpl> impl_;
};

// Streaming detokenization: feed ids one at a time and get back the text that became complete.
// Never returns a broken UTF-8 sequence: bytes of a character split across tokens are held back
// until the character is complete. The concatenation of every push() and the final flush()
// equals tokenizer.decode(all ids, skip_special_tokens).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special_tokens = false);
  std::string push(TokenId id);
  // Text still held back (an incomplete character becomes U+FFFD); resets the stream.
  std::string flush();
  void reset() { pending_.clear(); }
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace longctx
