// The loaded tokenizer pipeline behind longctx::Tokenizer.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/tokenizer/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"

namespace longctx::tokenizer {

enum class NormalizerKind { kNone, kNfc };

enum TokenFlags : uint8_t { kTokenExists = 1, kTokenSpecial = 2, kTokenAdded = 4 };

struct TokenizerImpl {
  std::unique_ptr<BpeModel> model;
  NormalizerKind normalizer = NormalizerKind::kNone;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::vector<AddedToken> added_tokens;
  AddedTokenMatcher raw_matcher;                // added tokens with normalized == false
  AddedTokenMatcher normalized_matcher;         // added tokens with normalized == true
  std::vector<TokenId> prefix_ids, suffix_ids;  // post-processor, single sequence

  // Per id.
  std::vector<std::string> token_strings;  // vocabulary spelling / added content
  std::vector<std::string> token_bytes;    // what the ByteLevel decoder makes of it
  std::vector<uint8_t> token_flags;        // TokenFlags
  StringIdMap string_to_id;

  TokenizerConfig config;

  void encode(std::string_view text, bool add_special_tokens, std::vector<TokenId>& out) const;

 private:
  void encode_normalizable(std::string_view text, std::vector<TokenId>& out) const;
  void encode_pre_tokenized(std::string_view text, std::vector<TokenId>& out) const;
};

// Builds the pipeline from parsed tokenizer.json. Its errors start "tokenizer.json: "; the
// caller replaces that with the real file name.
std::unique_ptr<TokenizerImpl> build_tokenizer(const nlohmann::json& j);

// Fills impl->config from parsed tokenizer_config.json.
void apply_tokenizer_config(TokenizerImpl& impl, const nlohmann::json& j,
                            const std::string& origin);

}  // namespace longctx::tokenizer
