// The engine's text plumbing over the tokenizer library.
#include "engine/text_stream.h"

#include "longctx/tokenizer/tokenizer.h"

namespace longctx {

namespace {

class DetokenizerStream final : public TextStream {
 public:
  DetokenizerStream(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), detok_(tokenizer, skip_special) {}
  std::string push(int32_t token) override {
    // A model's vocabulary is often padded past the tokenizer's: such ids have no text.
    if (!tokenizer_.is_valid_id(token)) return {};
    return detok_.push(token);
  }
  std::string finish() override { return detok_.flush(); }

 private:
  Tokenizer tokenizer_;
  IncrementalDetokenizer detok_;
};

}  // namespace

std::unique_ptr<TextStream> make_text_stream(const Tokenizer& tokenizer,
                                             std::span<const int32_t> /*prompt*/,
                                             bool skip_special_tokens) {
  // Byte-level BPE decodes token by token without context, so the prompt is not needed.
  return std::make_unique<DetokenizerStream>(tokenizer, skip_special_tokens);
}

std::shared_ptr<const Tokenizer> load_tokenizer_for_engine(const std::string& dir) {
  return std::make_shared<const Tokenizer>(Tokenizer::load(dir));
}

std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& text,
                                   bool add_special_tokens) {
  return tokenizer.encode(text, add_special_tokens);
}

}  // namespace longctx
