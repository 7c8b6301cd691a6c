// Encode / decode and the public Tokenizer API.
#include "longctx/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace longctx {
namespace tokenizer {

void TokenizerImpl::encode(std::string_view text, bool add_special_tokens,
                           std::vector<TokenId>& out) const {
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    unicode::append_lossy_utf8(repaired, text);
    text = repaired;
  }
  if (add_special_tokens) out.insert(out.end(), prefix_ids.begin(), prefix_ids.end());
  if (raw_matcher.empty()) {
    encode_normalizable(text, out);
  } else {
    std::vector<AddedMatch> matches;
    raw_matcher.find(text, matches);
    size_t pos = 0;
    for (const AddedMatch& m : matches) {
      encode_normalizable(text.substr(pos, m.start - pos), out);
      out.push_back(m.id);
      pos = m.end;
    }
    encode_normalizable(text.substr(pos), out);
  }
  if (add_special_tokens) out.insert(out.end(), suffix_ids.begin(), suffix_ids.end());
}

void TokenizerImpl::encode_normalizable(std::string_view text, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (normalizer == NormalizerKind::kNfc && !unicode::nfc_quick_check(text)) {
    normalized = unicode::nfc(text);
    text = normalized;
  }
  if (normalized_matcher.empty()) {
    encode_pre_tokenized(text, out);
    return;
  }
  std::vector<AddedMatch> matches;
  normalized_matcher.find(text, matches);
  size_t pos = 0;
  for (const AddedMatch& m : matches) {
    encode_pre_tokenized(text.substr(pos, m.start - pos), out);
    out.push_back(m.id);
    pos = m.end;
  }
  encode_pre_tokenized(text.substr(pos), out);
}

void TokenizerImpl::encode_pre_tokenized(std::string_view text, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  thread_local std::vector<std::string_view> pieces;
  thread_local PieceArena arena;
  pieces.assign(1, text);
  pre_tokenizer->split(pieces, arena);
  for (std::string_view p : pieces) model->encode_word(p, out);
  arena.clear();
}

}  // namespace tokenizer

namespace {

std::string read_file(const std::string& path, const char* what) {
  LONGCTX_CHECK(std::filesystem::exists(path), ErrorCode::kNotFound, "{} not found: {}", what,
                path);
  std::ifstream f(path, std::ios::binary);
  LONGCTX_CHECK(f.good(), ErrorCode::kIo, "cannot open {} {}", what, path);
  std::ostringstream ss;
  ss << f.rdbuf();
  LONGCTX_CHECK(!f.bad(), ErrorCode::kIo, "cannot read {} {}", what, path);
  return ss.str();
}

nlohmann::json parse_tokenizer_json(std::string_view text, const std::string& origin) {
  check_json_depth(text, origin);  // the loader and error paths recurse per nesting level
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: malformed JSON: {}", origin, e.what());
  }
}

// Prefixes errors with the file they came from.
template <typename F>
auto with_origin(const std::string& origin, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(origin, 0) == 0) throw;
    const std::string generic = "tokenizer.json: ";  // the checks' stand-in for the file name
    if (msg.rfind(generic, 0) == 0) msg.erase(0, generic.size());
    throw Error(e.code(), origin + ": " + msg);
  } catch (const nlohmann::json::exception& e) {  // a type error the checks did not anticipate
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: unexpected JSON content: {}", origin, e.what());
  }
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const tokenizer::TokenizerImpl> impl)
    : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& origin) {
  return with_origin(origin, [&] {
    nlohmann::json j = parse_tokenizer_json(json_text, origin);
    return Tokenizer(tokenizer::build_tokenizer(j));
  });
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  return from_json(read_file(path, "tokenizer file"), path);
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  LONGCTX_CHECK(std::filesystem::is_directory(dir), ErrorCode::kNotFound,
                "tokenizer folder not found: {}", dir);
  return load((std::filesystem::path(dir) / "tokenizer.json").string());
}

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    LONGCTX_CHECK(fs::exists(fs::path(path) / "tokenizer.json"), ErrorCode::kNotFound,
                  "{} has no tokenizer.json", path);
    return load((fs::path(path) / "tokenizer.json").string());
  }
  std::string text = read_file(path, "tokenizer file");
  auto impl = with_origin(path, [&] {
    nlohmann::json j = parse_tokenizer_json(text, path);
    return tokenizer::build_tokenizer(j);
  });
  fs::path config = fs::path(path).parent_path() / "tokenizer_config.json";
  if (fs::exists(config)) {
    std::string origin = config.string();
    std::string ctext = read_file(origin, "tokenizer config");
    with_origin(origin, [&] {
      tokenizer::apply_tokenizer_config(*impl, parse_tokenizer_json(ctext, origin), origin);
      return 0;
    });
  }
  return Tokenizer(std::move(impl));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode(text, add_special_tokens, out);
  return out;
}

void Tokenizer::encode_into(std::string_view text, bool add_special_tokens,
                            std::vector<TokenId>& out) const {
  impl_->encode(text, add_special_tokens, out);
}

bool Tokenizer::is_valid_id(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->token_flags.size() &&
         impl_->token_flags[id] != 0;
}

bool Tokenizer::is_special(TokenId id) const {
  return is_valid_id(id) && (impl_->token_flags[id] & tokenizer::kTokenSpecial) != 0;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  LONGCTX_CHECK(is_valid_id(id), ErrorCode::kOutOfRange, "token id {} is not in the vocabulary",
                id);
  return impl_->token_bytes[id];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (TokenId id : ids) {
    LONGCTX_CHECK(is_valid_id(id), ErrorCode::kOutOfRange,
                  "cannot decode token id {}: not in the vocabulary (size {})", id, vocab_size());
    if (skip_special_tokens && (impl_->token_flags[id] & tokenizer::kTokenSpecial)) continue;
    bytes += impl_->token_bytes[id];
  }
  if (tokenizer::unicode::is_valid_utf8(bytes)) return bytes;
  std::string out;
  tokenizer::unicode::append_lossy_utf8(out, bytes);
  return out;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->string_to_id.find(token);
  if (it == impl_->string_to_id.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(TokenId id) const {
  LONGCTX_CHECK(is_valid_id(id), ErrorCode::kOutOfRange, "token id {} is not in the vocabulary",
                id);
  return impl_->token_strings[id];
}

size_t Tokenizer::vocab_size() const { return impl_->token_flags.size(); }

const TokenizerConfig& Tokenizer::config() const { return impl_->config; }

std::optional<TokenId> Tokenizer::bos_token_id() const {
  if (impl_->config.bos_token.empty()) return std::nullopt;
  return token_to_id(impl_->config.bos_token);
}

std::optional<TokenId> Tokenizer::eos_token_id() const {
  if (impl_->config.eos_token.empty()) return std::nullopt;
  return token_to_id(impl_->config.eos_token);
}

IncrementalDetokenizer::IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(TokenId id) {
  std::string_view bytes = tokenizer_.token_bytes(id);  // throws for an unknown id
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return {};
  pending_ += bytes;
  // Hold back a trailing prefix of a character that later bytes may complete. Everything before
  // it converts exactly as decode() would convert it, because a valid-but-incomplete sequence
  // starts at a lead byte and no valid sequence or invalid subpart spans a lead byte.
  size_t hold = tokenizer::unicode::incomplete_utf8_tail(pending_);
  std::string_view ready(pending_.data(), pending_.size() - hold);
  std::string out;
  if (tokenizer::unicode::is_valid_utf8(ready)) {
    out.assign(ready);
  } else {
    tokenizer::unicode::append_lossy_utf8(out, ready);
  }
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  tokenizer::unicode::append_lossy_utf8(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace longctx
