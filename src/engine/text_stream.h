// The engine's view of detokenization: tokens in, text pieces out, never a broken UTF-8
// sequence (bytes of an unfinished character wait for the next token).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace longctx {

class Tokenizer;

class TextStream {
 public:
  virtual ~TextStream() = default;
  // Text that the new token completes (may be empty).
  virtual std::string push(int32_t token) = 0;
  // Whatever is still pending at the end (an unfinished character comes out as U+FFFD).
  virtual std::string finish() = 0;
};

// Streams the output of a sequence whose prompt was `prompt` (context for detokenizers that
// need it, e.g. SentencePiece's leading space).
std::unique_ptr<TextStream> make_text_stream(const Tokenizer& tokenizer,
                                             std::span<const int32_t> prompt,
                                             bool skip_special_tokens);

}  // namespace longctx

namespace longctx {

// Loads tokenizer.json (+ tokenizer_config.json) from `dir`.
std::shared_ptr<const Tokenizer> load_tokenizer_for_engine(const std::string& dir);
// A text prompt's ids; add_special_tokens applies the post-processor (e.g. Llama-3's BOS), as
// vLLM does for plain prompts (a rendered chat template already holds its special tokens).
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& text,
                                   bool add_special_tokens);

}  // namespace longctx
