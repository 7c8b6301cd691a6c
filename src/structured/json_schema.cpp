#include "structured/json_schema.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"
#include "structured/regex.h"

namespace longctx::structured {

namespace {

using Json = nlohmann::ordered_json;

// Bounds of integer ranges: their decimal strings must fit the unrolled digit rules and int64.
constexpr double kMaxIntegerBound = 1e15;

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {"title",    "description", "default",  "examples",
                                          "$schema",  "$id",         "$comment", "deprecated",
                                          "readOnly", "writeOnly",   "$defs",    "definitions"};
  return k;
}

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum"};
  return k;
}

Element bytes(uint8_t lo, uint8_t hi) { return Element::of(ByteSet::range(lo, hi)); }
Element byte(char c) { return Element::of(ByteSet::single(static_cast<uint8_t>(c))); }

Sequence operator+(Sequence a, const Sequence& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json* root) : root_(root) {}

  Grammar take(int32_t root_rule) {
    g_.set_root(root_rule);
    g_.finalize();
    return std::move(g_);
  }

  int32_t compile(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      LONGCTX_CHECK(s.get<bool>(), ErrorCode::kInvalidArgument,
                    "JSON schema: 'false' (at {}) admits no value", path);
      return any_value();
    }
    LONGCTX_CHECK(s.is_object(), ErrorCode::kInvalidArgument,
                  "JSON schema: expected an object at {}, got {}", path, json_excerpt(s));
    for (const auto& [k, v] : s.items()) {
      if (annotation_keywords().count(k) || supported_keywords().count(k)) continue;
      LONGCTX_THROW(ErrorCode::kUnsupported, "JSON schema: '{}' (at {}) is not supported", k, path);
    }
    if (s.contains("$ref")) return compile_ref(s, path);
    if (s.contains("const")) return literal_rule("const", {s["const"]});
    if (s.contains("enum")) {
      const Json& e = s["enum"];
      LONGCTX_CHECK(e.is_array() && !e.empty(), ErrorCode::kInvalidArgument,
                    "JSON schema: 'enum' (at {}) must be a non-empty array", path);
      return literal_rule("enum", std::vector<Json>(e.begin(), e.end()));
    }
    for (const char* k : {"anyOf", "oneOf", "allOf"}) {
      if (s.contains(k)) return compile_combinator(s, k, path);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else {
        LONGCTX_CHECK(t.is_array() && !t.empty(), ErrorCode::kInvalidArgument,
                      "JSON schema: 'type' (at {}) must be a string or a non-empty array", path);
        for (const Json& x : t) {
          LONGCTX_CHECK(x.is_string(), ErrorCode::kInvalidArgument,
                        "JSON schema: 'type' (at {}) lists a non-string", path);
          types.push_back(x.get<std::string>());
        }
      }
    } else if (s.contains("properties") || s.contains("required") ||
               s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return any_value();
    }
    const int32_t r = g_.add_rule(path);
    for (const std::string& t : types)
      g_.add_alternative(r, {Element::ref(compile_type(s, t, path))});
    return r;
  }

 private:
  int32_t compile_ref(const Json& s, const std::string& path) {
    for (const auto& [k, v] : s.items()) {
      LONGCTX_CHECK(k == "$ref" || annotation_keywords().count(k), ErrorCode::kUnsupported,
                    "JSON schema: '{}' beside '$ref' (at {}) is not supported", k, path);
    }
    LONGCTX_CHECK(s["$ref"].is_string(), ErrorCode::kInvalidArgument,
                  "JSON schema: '$ref' (at {}) must be a string", path);
    const std::string ref = s["$ref"].get<std::string>();
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    LONGCTX_CHECK(
        ref == "#" || ref.rfind("#/$defs/", 0) == 0 || ref.rfind("#/definitions/", 0) == 0,
        ErrorCode::kUnsupported,
        "JSON schema: '$ref' \"{}\" (at {}) is not supported (only \"#\", "
        "\"#/$defs/...\" and \"#/definitions/...\")",
        ref, path);
    const Json* target = nullptr;
    try {
      const Json::json_pointer ptr(ref.substr(1));
      if (root_->contains(ptr)) target = &root_->at(ptr);
    } catch (const Json::exception&) {
    }
    LONGCTX_CHECK(target != nullptr, ErrorCode::kInvalidArgument,
                  "JSON schema: '$ref' \"{}\" (at {}) names nothing in the schema", ref, path);
    // The rule exists before its body so a recursive reference finds it.
    const int32_t r = g_.add_rule(ref);
    refs_[ref] = r;
    g_.add_alternative(r, {Element::ref(compile(*target, ref))});
    return r;
  }

  int32_t compile_combinator(const Json& s, const std::string& k, const std::string& path) {
    for (const auto& [key, v] : s.items()) {
      LONGCTX_CHECK(key == k || annotation_keywords().count(key), ErrorCode::kUnsupported,
                    "JSON schema: '{}' beside '{}' (at {}) is not supported", key, k, path);
    }
    const Json& list = s[k];
    LONGCTX_CHECK(list.is_array() && !list.empty(), ErrorCode::kInvalidArgument,
                  "JSON schema: '{}' (at {}) must be a non-empty array", k, path);
    LONGCTX_CHECK(k != "allOf" || list.size() == 1, ErrorCode::kUnsupported,
                  "JSON schema: 'allOf' of {} schemas (at {}) is not supported (one only)",
                  list.size(), path);
    const int32_t r = g_.add_rule(path + "/" + k);
    for (size_t i = 0; i < list.size(); ++i) {
      g_.add_alternative(
          r, {Element::ref(compile(list[i], path + "/" + k + "/" + std::to_string(i)))});
    }
    return r;
  }

  int32_t compile_type(const Json& s, const std::string& t, const std::string& path) {
    if (t == "object") return compile_object(s, path);
    if (t == "array") return compile_array(s, path);
    if (t == "string") {
      if (s.contains("pattern")) return pattern_rule(s, path);
      const int64_t lo = count_keyword(s, "minLength", 0, path);
      const int64_t hi = count_keyword(s, "maxLength", -1, path);
      return string_rule(lo, hi, path);
    }
    if (t == "integer") return compile_number(s, true, path);
    if (t == "number") return compile_number(s, false, path);
    if (t == "boolean") return literal_rule("boolean", {Json(true), Json(false)});
    if (t == "null") return literal_rule("null", {Json(nullptr)});
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "JSON schema: unknown type \"{}\" (at {})", t, path);
  }

  int32_t compile_object(const Json& s, const std::string& path) {
    const Json empty = Json::object();
    const Json& props = s.contains("properties") ? s["properties"] : empty;
    LONGCTX_CHECK(props.is_object(), ErrorCode::kInvalidArgument,
                  "JSON schema: 'properties' (at {}) must be an object", path);
    std::set<std::string> required;
    if (s.contains("required")) {
      LONGCTX_CHECK(s["required"].is_array(), ErrorCode::kInvalidArgument,
                    "JSON schema: 'required' (at {}) must be an array", path);
      for (const Json& n : s["required"]) {
        LONGCTX_CHECK(n.is_string(), ErrorCode::kInvalidArgument,
                      "JSON schema: 'required' (at {}) lists a non-string", path);
        required.insert(n.get<std::string>());
      }
    }
    const Json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    const bool closed = extra != nullptr && extra->is_boolean() && !extra->get<bool>();
    if (props.empty() && required.empty()) {
      if (closed) return literal_rule("{}", {Json::object()});
      const int32_t value = extra != nullptr && !extra->is_boolean()
                                ? compile(*extra, path + "/additionalProperties")
                                : any_value();
      return object_of(value, path);
    }
    struct Member {
      std::string name;
      int32_t value;
      bool required;
    };
    std::vector<Member> members;
    // Schema order (the schema is an ordered_json: keys as the client wrote them).
    for (const auto& [name, sub] : props.items()) {
      members.push_back(
          {name, compile(sub, path + "/properties/" + name), required.count(name) > 0});
    }
    for (const std::string& name : required) {
      if (props.contains(name)) continue;
      LONGCTX_CHECK(!closed, ErrorCode::kInvalidArgument,
                    "JSON schema: required property \"{}\" (at {}) is not in 'properties' and "
                    "additionalProperties is false",
                    name, path);
      const int32_t value = extra != nullptr && !extra->is_boolean()
                                ? compile(*extra, path + "/additionalProperties")
                                : any_value();
      members.push_back({name, value, true});
    }
    // tail[i][e]: members i.. with e = whether one was written already (a comma comes first).
    const auto n = static_cast<int32_t>(members.size());
    std::vector<std::array<int32_t, 2>> tail(n + 1);
    for (int32_t i = n; i >= 0; --i) {
      for (int e = 0; e < 2; ++e) {
        const int32_t r = g_.add_rule(path + "/members" + std::to_string(i));
        tail[i][e] = r;
        if (i == n) {
          g_.add_alternative(r, {});
          continue;
        }
        const Member& m = members[i];
        Sequence with = e ? Grammar::literal(",") : Sequence{};
        with = with + Grammar::literal(Json(m.name).dump() + ":") +
               Sequence{Element::ref(m.value), Element::ref(tail[i + 1][1])};
        g_.add_alternative(r, with);
        if (!m.required) g_.add_alternative(r, {Element::ref(tail[i + 1][e])});
      }
    }
    const int32_t r = g_.add_rule(path);
    g_.add_alternative(
        r, Grammar::literal("{") + Sequence{Element::ref(tail[0][0])} + Grammar::literal("}"));
    return r;
  }

  int32_t compile_array(const Json& s, const std::string& path) {
    int32_t item = -1;
    if (s.contains("items")) {
      LONGCTX_CHECK(!s["items"].is_array(), ErrorCode::kUnsupported,
                    "JSON schema: 'items' as an array (tuple validation, at {}) is not supported",
                    path);
      item = compile(s["items"], path + "/items");
    } else {
      item = any_value();
    }
    const int64_t lo = count_keyword(s, "minItems", 0, path);
    const int64_t hi = count_keyword(s, "maxItems", -1, path);
    const int32_t list = repeat(Element::ref(item), Grammar::literal(","), lo, hi, path);
    const int32_t r = g_.add_rule(path);
    g_.add_alternative(
        r, Grammar::literal("[") + Sequence{Element::ref(list)} + Grammar::literal("]"));
    return r;
  }

  int32_t compile_number(const Json& s, bool integer, const std::string& path) {
    std::optional<double> lo, hi;
    std::optional<int64_t> ilo, ihi;
    auto bound = [&](const char* k) -> std::optional<double> {
      if (!s.contains(k)) return std::nullopt;
      const Json& v = s[k];
      LONGCTX_CHECK(v.is_number(), ErrorCode::kUnsupported,
                    "JSON schema: '{}' (at {}) must be a number (the draft-4 boolean form is "
                    "not supported)",
                    k, path);
      const double d = v.get<double>();
      LONGCTX_CHECK(std::isfinite(d) && std::fabs(d) <= kMaxIntegerBound, ErrorCode::kUnsupported,
                    "JSON schema: '{}' {} (at {}) is beyond the supported magnitude {}", k, d, path,
                    kMaxIntegerBound);
      return d;
    };
    if (auto v = bound("minimum")) ilo = static_cast<int64_t>(std::ceil(*v));
    if (auto v = bound("exclusiveMinimum")) {
      const auto x = static_cast<int64_t>(std::floor(*v)) + 1;
      ilo = ilo ? std::max(*ilo, x) : x;
    }
    if (auto v = bound("maximum")) ihi = static_cast<int64_t>(std::floor(*v));
    if (auto v = bound("exclusiveMaximum")) {
      const auto x = static_cast<int64_t>(std::ceil(*v)) - 1;
      ihi = ihi ? std::min(*ihi, x) : x;
    }
    LONGCTX_CHECK(!ilo || !ihi || *ilo <= *ihi, ErrorCode::kInvalidArgument,
                  "JSON schema: no integer within the bounds at {} ([{}, {}])", path, *ilo, *ihi);
    if (!integer && !ilo && !ihi) return any_number();
    return int_range(ilo, ihi);
  }

  static int64_t count_keyword(const Json& s, const char* k, int64_t fallback,
                               const std::string& path) {
    if (!s.contains(k)) return fallback;
    const Json& v = s[k];
    LONGCTX_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, ErrorCode::kInvalidArgument,
                  "JSON schema: '{}' (at {}) must be a non-negative integer, got {}", k, path,
                  json_excerpt(v));
    LONGCTX_CHECK(v.get<int64_t>() <= kMaxUnrolledRepeat, ErrorCode::kUnsupported,
                  "JSON schema: '{}' {} (at {}) is over the supported {}", k, v.get<int64_t>(),
                  path, kMaxUnrolledRepeat);
    return v.get<int64_t>();
  }

  // elem (sep elem)* with lo..hi repetitions (hi < 0: unbounded), as a rule per count so far.
  int32_t repeat(const Element& elem, const Sequence& sep, int64_t lo, int64_t hi,
                 const std::string& path) {
    LONGCTX_CHECK(hi < 0 || lo <= hi, ErrorCode::kInvalidArgument,
                  "JSON schema: minimum count {} over maximum {} (at {})", lo, hi, path);
    const int64_t last = hi >= 0 ? hi : std::max<int64_t>(lo, 1);
    std::vector<int32_t> r(last + 1);
    for (int64_t k = 0; k <= last; ++k) r[k] = g_.add_rule(path + "#" + std::to_string(k));
    for (int64_t k = 0; k <= last; ++k) {
      if (k >= lo) g_.add_alternative(r[k], {});
      if (hi >= 0 && k == hi) continue;
      const int64_t next = hi >= 0 ? k + 1 : std::min(k + 1, last);
      Sequence step = k > 0 ? sep : Sequence{};
      step.push_back(elem);
      step.push_back(Element::ref(r[next]));
      g_.add_alternative(r[k], step);
    }
    return r[0];
  }

  int32_t literal_rule(const std::string& name, const std::vector<Json>& values) {
    const int32_t r = g_.add_rule(name);
    for (const Json& v : values) g_.add_alternative(r, Grammar::literal(v.dump()));
    return r;
  }

  // --- shared rules, made once ---

  int32_t digits_star() {
    if (digits_star_ < 0) {
      digits_star_ = g_.add_rule("digits");
      g_.add_alternative(digits_star_, {});
      g_.add_alternative(digits_star_, {bytes('0', '9'), Element::ref(digits_star_)});
    }
    return digits_star_;
  }

  int32_t any_number() {
    if (any_number_ < 0) {
      const int32_t frac = g_.add_rule("fraction");
      g_.add_alternative(frac, {});
      g_.add_alternative(frac, {byte('.'), bytes('0', '9'), Element::ref(digits_star())});
      any_number_ = g_.add_rule("number");
      g_.add_alternative(any_number_,
                         {Element::ref(int_range(std::nullopt, std::nullopt)), Element::ref(frac)});
    }
    return any_number_;
  }

  int32_t string_char() {
    if (string_char_ < 0) {
      const int32_t c = g_.add_rule("char");
      ByteSet plain;
      plain.add_range(0x20, 0x7f);
      plain.bits[0] &= ~(uint64_t{1} << '"');
      plain.bits[1] &= ~(uint64_t{1} << ('\\' - 64));
      g_.add_alternative(c, {Element::of(plain)});
      ByteSet esc;
      for (char e : std::string("\"\\/bfnrt")) esc.add(static_cast<uint8_t>(e));
      g_.add_alternative(c, {byte('\\'), Element::of(esc)});
      ByteSet hex, hex_no_d, hex_low;
      for (char e : std::string("0123456789abcdefABCDEF")) hex.add(static_cast<uint8_t>(e));
      hex_no_d = hex;
      hex_no_d.bits = hex.bits;
      hex_no_d.bits['d' >> 6] &= ~(uint64_t{1} << ('d' & 63));
      hex_no_d.bits['D' >> 6] &= ~(uint64_t{1} << ('D' & 63));
      hex_low.add_range('0', '7');
      const Element h = Element::of(hex);
      g_.add_alternative(c, {byte('\\'), byte('u'), Element::of(hex_no_d), h, h, h});
      g_.add_alternative(c, {byte('\\'), byte('u'), Element::of(ByteSet::single('d')),
                             Element::of(hex_low), h, h});
      g_.add_alternative(c, {byte('\\'), byte('u'), Element::of(ByteSet::single('D')),
                             Element::of(hex_low), h, h});
      // UTF-8 past ASCII, well formed (no overlongs, no surrogates, at most U+10FFFF).
      const Element cont = bytes(0x80, 0xbf);
      g_.add_alternative(c, {bytes(0xc2, 0xdf), cont});
      g_.add_alternative(c, {byte('\xe0'), bytes(0xa0, 0xbf), cont});
      g_.add_alternative(c, {bytes(0xe1, 0xec), cont, cont});
      g_.add_alternative(c, {byte('\xed'), bytes(0x80, 0x9f), cont});
      g_.add_alternative(c, {bytes(0xee, 0xef), cont, cont});
      g_.add_alternative(c, {byte('\xf0'), bytes(0x90, 0xbf), cont, cont});
      g_.add_alternative(c, {bytes(0xf1, 0xf3), cont, cont, cont});
      g_.add_alternative(c, {byte('\xf4'), bytes(0x80, 0x8f), cont, cont});
      string_char_ = c;
    }
    return string_char_;
  }

  int32_t string_rule(int64_t lo, int64_t hi, const std::string& path) {
    if (lo == 0 && hi < 0 && any_string_ >= 0) return any_string_;
    const int32_t chars = repeat(Element::ref(string_char()), {}, lo, hi, path + "/chars");
    const int32_t r = g_.add_rule(path.empty() ? "string" : path);
    g_.add_alternative(r, {byte('"'), Element::ref(chars), byte('"')});
    if (lo == 0 && hi < 0) any_string_ = r;
    return r;
  }

  // A string whose characters match `pattern` (ECMA-262, not anchored: structured/regex.h).
  int32_t pattern_rule(const Json& s, const std::string& path) {
    const Json& p = s["pattern"];
    LONGCTX_CHECK(p.is_string(), ErrorCode::kInvalidArgument,
                  "JSON schema: 'pattern' (at {}) must be a string", path);
    for (const char* k : {"minLength", "maxLength"}) {
      LONGCTX_CHECK(!s.contains(k), ErrorCode::kUnsupported,
                    "JSON schema: '{}' beside 'pattern' (at {}) is not supported (write the "
                    "length into the pattern)",
                    k, path);
    }
    RegexOptions o;
    o.search = true;
    o.json_string = true;
    o.context = "JSON schema: 'pattern' (at " + path + ")";
    const int32_t chars = add_regex_rule(g_, p.get<std::string>(), o);
    const int32_t r = g_.add_rule(path + "/pattern");
    g_.add_alternative(r, {byte('"'), Element::ref(chars), byte('"')});
    return r;
  }

  int32_t object_of(int32_t value, const std::string& path) {
    const int32_t member = g_.add_rule(path + "/member");
    g_.add_alternative(member,
                       {Element::ref(string_rule(0, -1, "")), byte(':'), Element::ref(value)});
    const int32_t list = repeat(Element::ref(member), Grammar::literal(","), 0, -1, path);
    const int32_t r = g_.add_rule(path + "/object");
    g_.add_alternative(r, {byte('{'), Element::ref(list), byte('}')});
    return r;
  }

  int32_t any_value() {
    if (any_value_ < 0) {
      any_value_ = g_.add_rule("value");
      const int32_t array = g_.add_rule("array");
      const int32_t items = repeat(Element::ref(any_value_), Grammar::literal(","), 0, -1, "items");
      g_.add_alternative(array, {byte('['), Element::ref(items), byte(']')});
      for (int32_t r : {object_of(any_value_, "any"), array, string_rule(0, -1, ""), any_number(),
                        literal_rule("literal", {Json(true), Json(false), Json(nullptr)})}) {
        g_.add_alternative(any_value_, {Element::ref(r)});
      }
    }
    return any_value_;
  }

  // --- integer ranges ---

  // The decimal strings of [a, b], both of the same length, with no leading zero beyond a's.
  int32_t same_length(const std::string& a, const std::string& b) {
    const std::string key = a + "-" + b;
    if (auto it = same_length_.find(key); it != same_length_.end()) return it->second;
    const int32_t r = g_.add_rule("digits " + key);
    same_length_[key] = r;
    if (a.empty()) {
      g_.add_alternative(r, {});
      return r;
    }
    const std::string ra = a.substr(1), rb = b.substr(1);
    const auto all = [](const std::string& s, char c) {
      return s.find_first_not_of(c) == std::string::npos;
    };
    auto free_digits = [&](char lo, char hi) {
      Sequence s{bytes(lo, hi)};
      for (size_t i = 0; i < ra.size(); ++i) s.push_back(bytes('0', '9'));
      return s;
    };
    if (a[0] == b[0]) {
      g_.add_alternative(r, {byte(a[0]), Element::ref(same_length(ra, rb))});
      return r;
    }
    char mid_lo = a[0], mid_hi = b[0];
    if (!all(ra, '0')) {
      g_.add_alternative(r,
                         {byte(a[0]), Element::ref(same_length(ra, std::string(ra.size(), '9')))});
      ++mid_lo;
    }
    if (!all(rb, '9')) {
      g_.add_alternative(r,
                         {byte(b[0]), Element::ref(same_length(std::string(rb.size(), '0'), rb))});
      --mid_hi;
    }
    if (mid_lo <= mid_hi) g_.add_alternative(r, free_digits(mid_lo, mid_hi));
    return r;
  }

  // Non-negative integers in [lo, hi] (hi unset: unbounded), canonical decimal.
  int32_t uint_range(int64_t lo, std::optional<int64_t> hi) {
    const int32_t r = g_.add_rule("uint");
    const std::string a = std::to_string(lo);
    const size_t la = a.size();
    const size_t lb = hi ? std::to_string(*hi).size() : la;
    int64_t p = 1;
    for (size_t i = 1; i < la; ++i) p *= 10;  // 10^(la-1)
    for (size_t len = la; len <= lb; ++len, p *= 10) {
      const int64_t from = len == la ? lo : p;
      const int64_t to = hi && len == lb ? *hi : p * 10 - 1;
      g_.add_alternative(r, {Element::ref(same_length(std::to_string(from), std::to_string(to)))});
    }
    if (!hi) {
      Sequence longer{bytes('1', '9')};
      for (size_t i = 0; i < la; ++i) longer.push_back(bytes('0', '9'));
      longer.push_back(Element::ref(digits_star()));
      g_.add_alternative(r, longer);
    }
    return r;
  }

  int32_t int_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    const int32_t r = g_.add_rule("integer");
    if (!hi || *hi >= 0) {
      g_.add_alternative(r, {Element::ref(uint_range(lo ? std::max<int64_t>(*lo, 0) : 0, hi))});
    }
    if (!lo || *lo < 0) {
      const int64_t kmin = hi && *hi < 0 ? -*hi : 1;
      const std::optional<int64_t> kmax = lo ? std::optional<int64_t>(-*lo) : std::nullopt;
      g_.add_alternative(r, {byte('-'), Element::ref(uint_range(kmin, kmax))});
    }
    return r;
  }

  const Json* root_;
  Grammar g_;
  std::map<std::string, int32_t> refs_;
  std::map<std::string, int32_t> same_length_;
  int32_t digits_star_ = -1, any_number_ = -1, string_char_ = -1, any_string_ = -1;
  int32_t any_value_ = -1;
};

}  // namespace

Grammar json_schema_grammar(const nlohmann::ordered_json& schema) {
  SchemaCompiler c(&schema);
  const int32_t root = c.compile(schema, "#");
  return c.take(root);
}

Grammar any_json_object_grammar() {
  const Json schema = {{"type", "object"}};
  return json_schema_grammar(schema);
}

}  // namespace longctx::structured
