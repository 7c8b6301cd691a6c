// tokenizer.json / tokenizer_config.json -> TokenizerImpl.
#include <algorithm>

#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace longctx::tokenizer {
namespace {

using json_util::json;

bool is_null_or_empty_string(const json& j) {
  return j.is_null() || (j.is_string() && j.get<std::string>().empty());
}

NormalizerKind parse_normalizer(const json& j, const std::string& where, int depth = 0) {
  json_util::check_nesting(depth, where);
  if (j.is_null()) return NormalizerKind::kNone;
  std::string type = json_util::type_of(j, where);
  if (type == "NFC") return NormalizerKind::kNfc;
  if (type == "Sequence") {
    const json& list = json_util::require(j, "normalizers", where);
    LONGCTX_CHECK(list.is_array(), ErrorCode::kInvalidArgument,
                  "tokenizer.json: {}.normalizers must be an array", where);
    NormalizerKind kind = NormalizerKind::kNone;
    for (size_t i = 0; i < list.size(); ++i) {
      NormalizerKind k =
          parse_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]", depth + 1);
      if (k != NormalizerKind::kNone) kind = k;  // NFC is idempotent: repeats collapse
    }
    return kind;
  }
  LONGCTX_THROW(ErrorCode::kUnsupported, "tokenizer.json: {} type \"{}\" is not supported", where,
                type);
}

void check_decoder(const json& j, const std::string& where, int depth = 0) {
  json_util::check_nesting(depth, where);
  LONGCTX_CHECK(!j.is_null(), ErrorCode::kUnsupported,
                "tokenizer.json: {} is null; byte-level BPE needs the ByteLevel decoder", where);
  std::string type = json_util::type_of(j, where);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = json_util::require(j, "decoders", where);
    LONGCTX_CHECK(list.is_array() && !list.empty(), ErrorCode::kInvalidArgument,
                  "tokenizer.json: {}.decoders must be a non-empty array", where);
    for (size_t i = 0; i < list.size(); ++i)
      check_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]", depth + 1);
    return;
  }
  LONGCTX_THROW(ErrorCode::kUnsupported, "tokenizer.json: {} type \"{}\" is not supported", where,
                type);
}

void parse_post_processor(TokenizerImpl& impl, const json& j, const std::string& where,
                          int depth = 0) {
  json_util::check_nesting(depth, where);
  if (j.is_null()) return;
  std::string type = json_util::type_of(j, where);
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    const json& list = json_util::require(j, "processors", where);
    LONGCTX_CHECK(list.is_array(), ErrorCode::kInvalidArgument,
                  "tokenizer.json: {}.processors must be an array", where);
    for (size_t i = 0; i < list.size(); ++i)
      parse_post_processor(impl, list[i], where + ".processors[" + std::to_string(i) + "]",
                           depth + 1);
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = json_util::require(j, "single", where);
    const json& specials = json_util::require(j, "special_tokens", where);
    LONGCTX_CHECK(single.is_array(), ErrorCode::kInvalidArgument,
                  "tokenizer.json: {}.single must be an array", where);
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      std::string item_where = where + ".single[" + std::to_string(i) + "]";
      const json& item = single[i];
      if (item.is_object() && item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      LONGCTX_CHECK(item.is_object() && item.contains("SpecialToken"), ErrorCode::kInvalidArgument,
                    "tokenizer.json: {} must be {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}}",
                    item_where);
      std::string name = json_util::require_string(item["SpecialToken"], "id", item_where);
      const json& entry = json_util::require(specials, name.c_str(), where + ".special_tokens");
      const json& ids = json_util::require(entry, "ids", where + ".special_tokens." + name);
      LONGCTX_CHECK(ids.is_array(), ErrorCode::kInvalidArgument,
                    "tokenizer.json: {}.special_tokens.{}.ids must be an array", where, name);
      auto& dst = seen_sequence ? impl.suffix_ids : impl.prefix_ids;
      for (const json& id : ids) {
        LONGCTX_CHECK(id.is_number_integer(), ErrorCode::kInvalidArgument,
                      "tokenizer.json: {}.special_tokens.{}.ids must hold integers", where, name);
        dst.push_back(id.get<TokenId>());
      }
    }
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const json& pair = json_util::require(j, key, where);
      LONGCTX_CHECK(pair.is_array() && pair.size() == 2 && pair[1].is_number_integer(),
                    ErrorCode::kInvalidArgument, "tokenizer.json: {}.{} must be [token, id]", where,
                    key);
      (std::string(key) == "cls" ? impl.prefix_ids : impl.suffix_ids)
          .push_back(pair[1].get<TokenId>());
    }
    return;
  }
  LONGCTX_THROW(ErrorCode::kUnsupported, "tokenizer.json: {} type \"{}\" is not supported", where,
                type);
}

// Ids index dense tables, so an id far past the number of tokens (2^30 in a 10-token file)
// would size them by the id. Real files number their tokens 0..n-1 with added tokens after
// them; a gap this large is a broken or hostile file.
constexpr int64_t kMaxIdGap = 1 << 16;

void check_id(int64_t id, size_t num_tokens, const std::string& where) {
  const int64_t limit = static_cast<int64_t>(num_tokens) + kMaxIdGap;
  LONGCTX_CHECK(id >= 0 && id < limit, ErrorCode::kInvalidArgument,
                "tokenizer.json: {} id {} is out of range: ids must be below the number of "
                "tokens plus {} ({})",
                where, id, kMaxIdGap, limit);
}

void set_token(TokenizerImpl& impl, TokenId id, const std::string& s, uint8_t flags) {
  if (static_cast<size_t>(id) >= impl.token_strings.size()) {
    impl.token_strings.resize(id + 1);
    impl.token_bytes.resize(id + 1);
    impl.token_flags.resize(id + 1, 0);
  }
  impl.token_strings[id] = s;
  // The ByteLevel decoder maps a token through the byte alphabet when every character is in it
  // and otherwise keeps its UTF-8 as is.
  auto bytes = byte_level_decode(s);
  impl.token_bytes[id] = bytes ? std::move(*bytes) : s;
  impl.token_flags[id] = flags;
}

std::pair<std::string, std::string> parse_merge(const json& m, size_t rank) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    size_t sp = s.find(' ', 1);
    LONGCTX_CHECK(
        sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
        ErrorCode::kInvalidArgument,
        "tokenizer.json: model.merges[{}] \"{}\" is not two tokens separated by one space", rank,
        s);
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  LONGCTX_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                ErrorCode::kInvalidArgument,
                "tokenizer.json: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", rank);
  return {m[0].get<std::string>(), m[1].get<std::string>()};
}

void build_model(TokenizerImpl& impl, const json& m, size_t num_tokens) {
  const std::string where = "model";
  LONGCTX_CHECK(m.is_object(), ErrorCode::kInvalidArgument,
                "tokenizer.json: \"model\" must be an object");
  std::string type = m.contains("type") ? json_util::type_of(m, where) : "BPE";
  LONGCTX_CHECK(type == "BPE", ErrorCode::kUnsupported,
                "tokenizer.json: model type \"{}\" is not supported (only BPE)", type);
  auto it = m.find("dropout");
  LONGCTX_CHECK(it == m.end() || it->is_null() || (it->is_number() && it->get<double>() == 0.0),
                ErrorCode::kUnsupported, "tokenizer.json: model.dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto f = m.find(key);
    LONGCTX_CHECK(f == m.end() || is_null_or_empty_string(*f), ErrorCode::kUnsupported,
                  "tokenizer.json: model.{} is not supported", key);
  }
  LONGCTX_CHECK(!json_util::optional_bool(m, "byte_fallback", false, where),
                ErrorCode::kUnsupported,
                "tokenizer.json: model.byte_fallback is not supported (byte-level BPE only)");
  const json& vocab = json_util::require(m, "vocab", where);
  const json& merges = json_util::require(m, "merges", where);
  LONGCTX_CHECK(vocab.is_object(), ErrorCode::kInvalidArgument,
                "tokenizer.json: model.vocab must be an object of token -> id");
  LONGCTX_CHECK(merges.is_array(), ErrorCode::kInvalidArgument,
                "tokenizer.json: model.merges must be an array");

  StringIdMap bytes_to_id;
  bytes_to_id.reserve(vocab.size());
  impl.string_to_id.reserve(vocab.size() + 512);
  for (auto v = vocab.begin(); v != vocab.end(); ++v) {
    LONGCTX_CHECK(v.value().is_number_integer() && v.value().get<int64_t>() >= 0 &&
                      v.value().get<int64_t>() < (int64_t{1} << 30),
                  ErrorCode::kInvalidArgument,
                  "tokenizer.json: model.vocab[\"{}\"] must be a non-negative integer id", v.key());
    check_id(v.value().get<int64_t>(), num_tokens,
             "model.vocab[\"" + v.key().substr(0, 64) + "\"]");
    TokenId id = v.value().get<TokenId>();
    set_token(impl, id, v.key(), kTokenExists);
    impl.string_to_id[v.key()] = id;
    if (auto bytes = byte_level_decode(v.key())) bytes_to_id[*bytes] = id;
  }
  std::vector<std::pair<std::string, std::string>> raw_merges;
  raw_merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    auto [a, b] = parse_merge(merges[r], r);
    auto da = byte_level_decode(a), db = byte_level_decode(b);
    LONGCTX_CHECK(da && db, ErrorCode::kInvalidArgument,
                  "tokenizer.json: model.merges[{}] \"{} {}\" is not in the byte-level alphabet", r,
                  a, b);
    raw_merges.emplace_back(std::move(*da), std::move(*db));
  }
  BpeOptions opt;
  opt.ignore_merges = json_util::optional_bool(m, "ignore_merges", false, where);
  auto unk = m.find("unk_token");
  if (unk != m.end() && !unk->is_null()) {
    LONGCTX_CHECK(unk->is_string(), ErrorCode::kInvalidArgument,
                  "tokenizer.json: model.unk_token must be a string");
    auto id = impl.string_to_id.find(unk->get<std::string>());
    LONGCTX_CHECK(id != impl.string_to_id.end(), ErrorCode::kInvalidArgument,
                  "tokenizer.json: model.unk_token \"{}\" is not in model.vocab",
                  unk->get<std::string>());
    opt.unk_id = id->second;
  }
  impl.model = std::make_unique<BpeModel>(std::move(bytes_to_id), raw_merges, opt);
}

void build_added_tokens(TokenizerImpl& impl, const json& list, size_t num_tokens) {
  if (list.is_null()) return;
  LONGCTX_CHECK(list.is_array(), ErrorCode::kInvalidArgument,
                "tokenizer.json: added_tokens must be an array");
  for (size_t i = 0; i < list.size(); ++i) {
    std::string where = "added_tokens[" + std::to_string(i) + "]";
    const json& t = list[i];
    AddedToken a;
    const json& id = json_util::require(t, "id", where);
    LONGCTX_CHECK(
        id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 30),
        ErrorCode::kInvalidArgument, "tokenizer.json: {}.id must be a non-negative integer", where);
    check_id(id.get<int64_t>(), num_tokens, where);
    a.id = id.get<TokenId>();
    a.content = json_util::require_string(t, "content", where);
    LONGCTX_CHECK(!a.content.empty(), ErrorCode::kInvalidArgument,
                  "tokenizer.json: {}.content is empty", where);
    a.single_word = json_util::optional_bool(t, "single_word", false, where);
    a.lstrip = json_util::optional_bool(t, "lstrip", false, where);
    a.rstrip = json_util::optional_bool(t, "rstrip", false, where);
    a.normalized = json_util::optional_bool(t, "normalized", false, where);
    a.special = json_util::optional_bool(t, "special", false, where);
    set_token(impl, a.id, a.content, kTokenExists | kTokenAdded | (a.special ? kTokenSpecial : 0));
    impl.string_to_id[a.content] = a.id;
    impl.added_tokens.push_back(std::move(a));
  }
  std::vector<const AddedToken*> raw, norm;
  std::vector<std::string> raw_pat, norm_pat;
  for (const AddedToken& a : impl.added_tokens) {
    if (a.normalized) {
      norm.push_back(&a);
      norm_pat.push_back(impl.normalizer == NormalizerKind::kNfc ? unicode::nfc(a.content)
                                                                 : a.content);
    } else {
      raw.push_back(&a);
      raw_pat.push_back(a.content);
    }
  }
  impl.raw_matcher.build(raw, raw_pat);
  impl.normalized_matcher.build(norm, norm_pat);
}

const json& field_or_null(const json& j, const char* key) {
  static const json kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

}  // namespace

std::unique_ptr<TokenizerImpl> build_tokenizer(const json& j) {
  LONGCTX_CHECK(j.is_object(), ErrorCode::kInvalidArgument,
                "tokenizer.json: the top level must be an object");
  auto impl = std::make_unique<TokenizerImpl>();
  impl->normalizer = parse_normalizer(field_or_null(j, "normalizer"), "normalizer");
  const json& pre = field_or_null(j, "pre_tokenizer");
  LONGCTX_CHECK(!pre.is_null(), ErrorCode::kUnsupported,
                "tokenizer.json: pre_tokenizer is null; only byte-level BPE (with a ByteLevel "
                "pre-tokenizer) is supported");
  bool has_byte_level = false;
  impl->pre_tokenizer = make_pre_tokenizer(pre, &has_byte_level);
  LONGCTX_CHECK(has_byte_level, ErrorCode::kUnsupported,
                "tokenizer.json: pre_tokenizer has no ByteLevel step; only byte-level BPE is "
                "supported");
  check_decoder(field_or_null(j, "decoder"), "decoder");
  const json& model = json_util::require(j, "model", "the top level");
  const json& added = field_or_null(j, "added_tokens");
  // The number of tokens the file names bounds the ids (see check_id).
  const json& vocab = model.is_object() ? field_or_null(model, "vocab") : model;
  const size_t num_tokens =
      (vocab.is_object() ? vocab.size() : 0) + (added.is_array() ? added.size() : 0);
  build_model(*impl, model, num_tokens);
  build_added_tokens(*impl, added, num_tokens);
  parse_post_processor(*impl, field_or_null(j, "post_processor"), "post_processor");
  for (TokenId id : impl->prefix_ids)
    LONGCTX_CHECK(
        id >= 0 && static_cast<size_t>(id) < impl->token_flags.size() && impl->token_flags[id] != 0,
        ErrorCode::kInvalidArgument,
        "tokenizer.json: post_processor adds id {} which names no token", id);
  for (TokenId id : impl->suffix_ids)
    LONGCTX_CHECK(
        id >= 0 && static_cast<size_t>(id) < impl->token_flags.size() && impl->token_flags[id] != 0,
        ErrorCode::kInvalidArgument,
        "tokenizer.json: post_processor adds id {} which names no token", id);
  return impl;
}

void apply_tokenizer_config(TokenizerImpl& impl, const json& j, const std::string& origin) {
  LONGCTX_CHECK(j.is_object(), ErrorCode::kInvalidArgument, "{}: the top level must be an object",
                origin);
  auto token_string = [&](const char* key) -> std::string {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return {};
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      return (*it)["content"].get<std::string>();
    LONGCTX_THROW(ErrorCode::kInvalidArgument,
                  "{}: \"{}\" must be a string or an object with \"content\"", origin, key);
  };
  impl.config.bos_token = token_string("bos_token");
  impl.config.eos_token = token_string("eos_token");
  impl.config.pad_token = token_string("pad_token");
  impl.config.unk_token = token_string("unk_token");
  auto opt_bool = [&](const char* key) -> std::optional<bool> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    LONGCTX_CHECK(it->is_boolean(), ErrorCode::kInvalidArgument, "{}: \"{}\" must be a boolean",
                  origin, key);
    return it->get<bool>();
  };
  impl.config.add_bos_token = opt_bool("add_bos_token");
  impl.config.add_eos_token = opt_bool("add_eos_token");
  auto ct = j.find("chat_template");
  if (ct != j.end() && !ct->is_null()) {
    if (ct->is_string()) {
      impl.config.chat_template = ct->get<std::string>();
    } else if (ct->is_array()) {  // [{"name": ..., "template": ...}]: take "default" or the first
      for (const json& t : *ct) {
        LONGCTX_CHECK(t.is_object() && t.contains("template") && t["template"].is_string(),
                      ErrorCode::kInvalidArgument,
                      "{}: chat_template entries must have a \"template\" string", origin);
        bool is_default = t.contains("name") && t["name"] == "default";
        if (impl.config.chat_template.empty() || is_default)
          impl.config.chat_template = t["template"].get<std::string>();
        if (is_default) break;
      }
    } else {
      LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: chat_template must be a string or a list",
                    origin);
    }
  }
}

}  // namespace longctx::tokenizer
